"""`--base REF`: run the same script from a git worktree of REF and collect its rows.

The worktree goes into a temporary directory (`git worktree add --detach`), the script runs there
with the same arguments (its own `--out` and `--label REF`), its CSV is read back, and the worktree
is removed again, also when the run fails.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from strata.bench.record import read_csv
from strata.errors import StrataError

_OWN = {"--base": 1, "--out": 1, "--out-dir": 1, "--label": 1}


def strip_own_args(argv: list[str]) -> list[str]:
    """argv without the harness's own per-run options (--base/--out/--label and their values)."""
    out, skip = [], 0
    for a in argv:
        if skip:
            skip -= 1
            continue
        name = a.split("=", 1)[0]
        if name in _OWN:
            skip = 0 if "=" in a else _OWN[name]
            continue
        out.append(a)
    return out


def git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)


def repo_root(path: Path) -> Path:
    res = git(path if path.is_dir() else path.parent, "rev-parse", "--show-toplevel")
    if res.returncode != 0:
        raise StrataError(f"--base needs a git checkout, and {path} is not inside one")
    return Path(res.stdout.strip())


def run_base(ref: str, script: str | Path, argv: list[str]) -> list[dict]:
    """Rows of `script` run at git ref `ref` with `argv` (the harness options stripped)."""
    script = Path(script).resolve()
    root = repo_root(script)
    if git(root, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}").returncode != 0:
        raise StrataError(f"--base {ref}: no such commit in {root}; give a branch, tag or hash")
    rel = script.relative_to(root)
    with tempfile.TemporaryDirectory(prefix="strata-base-") as tmp:
        wt, out = Path(tmp) / "tree", Path(tmp) / "out"
        res = git(root, "worktree", "add", "--detach", str(wt), ref)
        if res.returncode != 0:
            raise StrataError(f"--base {ref}: git worktree add failed: {res.stderr.strip()}")
        try:
            if not (wt / rel).exists():
                raise StrataError(f"--base {ref}: {rel} does not exist at {ref}")
            env = os.environ | {"PYTHONPATH": str(wt)}
            cmd = [sys.executable, str(wt / rel), *strip_own_args(argv), "--out", str(out),
                   "--label", ref]
            print(f"--base {ref}: running {rel} from a worktree of {ref}", file=sys.stderr)
            res = subprocess.run(cmd, cwd=wt, env=env, capture_output=True, text=True)
            if res.returncode != 0:
                tail = "\n".join((res.stdout + res.stderr).strip().splitlines()[-15:])
                raise StrataError(f"--base {ref}: {rel} failed at {ref} (exit {res.returncode}):"
                                  f"\n{tail}")
            csvs = sorted(out.glob("*.csv"))
            if not csvs:
                raise StrataError(f"--base {ref}: {rel} at {ref} wrote no CSV (does it use "
                                  f"strata.bench there?)")
            return [r for p in csvs for r in read_csv(p)]
        finally:
            git(root, "worktree", "remove", "--force", str(wt))
            git(root, "worktree", "prune")
