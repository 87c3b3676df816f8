"""The process entry point: `python -m strata` leaves by os._exit, output flushed, only after a
command asked it to skip the interpreter's teardown (the --distributed ranks: gloo aborted in
that teardown after the work was reported); otherwise it exits as usual."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _entry(skip: bool) -> subprocess.CompletedProcess:
    """`strata plan --preset tiny` through cli.entry, with an atexit hook that says when the
    interpreter's teardown ran."""
    code = ("import atexit, sys; from strata import cli; "
            "atexit.register(lambda: print('TEARDOWN', file=sys.stderr)); "
            + ("cli.skip_interpreter_teardown(); " if skip else "")
            + "sys.argv = ['strata', 'plan', '--preset', 'tiny']; sys.exit(cli.entry())")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))


@pytest.mark.parametrize("skip", [False, True])
def test_entry_skips_teardown_only_when_asked_and_flushes_first(skip):
    got = _entry(skip)
    assert got.returncode == 0, got.stderr
    assert "tiny" in got.stdout          # the plan was printed (buffered, flushed before exit)
    assert ("TEARDOWN" in got.stderr) is not skip, got.stderr


def test_the_module_and_the_console_script_go_through_entry():
    import tomllib
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["strata"] == "strata.cli:entry"
    assert "entry()" in (ROOT / "strata" / "__main__.py").read_text()
