"""CI runs the README's test command (`bash dev.sh test`, through .ci/run): pytest's exit 5 (no
test collected) must fail it, and every other exit code pass through. dev.sh runs here against a
stand-in interpreter in a copy of the repo's scripts (no install, no real pytest)."""
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FAKE_PY = """#!/usr/bin/env bash
# pip: nothing to install; pytest: the exit code the test asks for
if [ "$1 $2" = "-m pytest" ]; then exit "$FAKE_PYTEST_RC"; fi
exit 0
"""


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    assert "bash dev.sh test" in readme
    ci = (ROOT / ".ci" / "run").read_text()
    assert "exec bash dev.sh test" in ci


@pytest.mark.parametrize("pytest_rc, want", [(0, 0), (1, 1), (2, 2), (5, 1)])
def test_dev_sh_test_fails_when_pytest_collects_nothing(tmp_path, pytest_rc, want):
    shutil.copy(ROOT / "dev.sh", tmp_path / "dev.sh")
    (tmp_path / ".ci").mkdir()
    shutil.copy(ROOT / ".ci" / "run", tmp_path / ".ci" / "run")
    py = tmp_path / ".venv" / "bin" / "python"
    py.parent.mkdir(parents=True)
    py.write_text(FAKE_PY)
    py.chmod(py.stat().st_mode | stat.S_IXUSR)
    got = subprocess.run(["bash", str(tmp_path / ".ci" / "run")], capture_output=True, text=True,
                         env=dict(os.environ, FAKE_PYTEST_RC=str(pytest_rc)), timeout=60)
    assert got.returncode == want, got.stderr
    assert ("collected no tests" in got.stderr) == (pytest_rc == 5)
