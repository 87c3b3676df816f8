"""The gate: no speed is reported for a kernel that has not just passed its checks.

Two kinds of check, both run BEFORE the timing they guard:
- a check function the script supplies, run on exactly the inputs it is about to time (e.g. the
  kernel's output bit-exact against the torch reference, or a normalized error under a named
  bound). It passes by returning None or True; it fails by returning False, returning a string
  (the reason), or raising AssertionError.
- a pytest selection (`pytest_gate`): the kernel's own tests for the shapes it times.

A failed check raises GateRefused (a StrataError): the experiment stops and writes nothing.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from strata.errors import StrataError


class GateRefused(StrataError):
    """A kernel failed the check that guards its timing: no figure is reported."""


def run_check(what: str, check) -> None:
    """Run `check()`; GateRefused naming `what` unless it passes."""
    try:
        got = check()
    except AssertionError as e:
        raise GateRefused(f"{what}: check failed ({e or 'assertion'}); fix the kernel before "
                          f"timing it") from None
    if got is None or got is True:
        return
    reason = got if isinstance(got, str) else "check returned False"
    raise GateRefused(f"{what}: {reason}; fix the kernel before timing it")


def pytest_gate(*selection: str, cwd: str | Path | None = None) -> str:
    """Run `pytest -q -x <selection>` in a subprocess; GateRefused unless every test passes.
    Returns the description recorded in the CSV's `gate` column."""
    if not selection:
        raise StrataError("pytest_gate needs a test selection (files or node ids)")
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *selection]
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if res.returncode != 0:
        tail = "\n".join((res.stdout + res.stderr).strip().splitlines()[-15:])
        raise GateRefused(f"pytest {' '.join(selection)} did not pass (exit {res.returncode}); "
                          f"no speed is reported for a failing kernel:\n{tail}")
    return "pytest " + " ".join(selection)
