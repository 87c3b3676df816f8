"""The sm_90 compile checks' runner: a tests/kernels/compile_*.py script (triton's passes and its
own ptxas, no GPU) in a process without the interpreter, so the CPU suite holds every kernel to
compiling for the H200 as it is."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def compile_lines(script: str, *args: str, timeout: int = 600, cwd: Path | None = None
                  ) -> tuple[list[str], str]:
    """Run tests/kernels/`script` with `args`; it must exit 0 and print no FAIL. Returns its
    "ok" lines (one a compiled kernel) and its whole stdout (for the assert messages)."""
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "kernels" / script), *args],
                       env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    assert r.returncode == 0 and "FAIL" not in r.stdout, r.stdout + r.stderr
    return [ln for ln in r.stdout.splitlines() if ln.startswith("ok")], r.stdout
