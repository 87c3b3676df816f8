"""Long-format results: one row per (run, config, figure), the same columns for every experiment.

Columns (COLUMNS): experiment, label (tree | the --base REF), gpu, commit (+"-dirty" when the tree
has uncommitted changes), timestamp (UTC), torch, triton, config (JSON, sorted keys), figure,
value (a number; a short text for a categorical figure such as a tile name), unit, bound (what
the figure is judged against, in words: "4.19 TB/s D2D"), bound_value
(that ceiling in `unit`, empty when there is none), gate (the check that passed before a timed
figure; empty for untimed figures), timer (cuda events | perf_counter (CPU); empty if untimed).
"""
from __future__ import annotations

import csv
import datetime as dt
import json
import platform
import os
import subprocess
from pathlib import Path

import torch

COLUMNS = ["experiment", "label", "gpu", "commit", "timestamp", "torch", "triton", "config",
           "figure", "value", "unit", "bound", "bound_value", "gate", "timer"]


def commit_of(path: str | Path) -> str:
    """Short HEAD of the git checkout holding `path`, "-dirty" if tracked files changed.
    STRATA_COMMIT, when set, wins: the device machine's copy of the tree may carry a stale .git
    (git would name whatever commit that copy came with), so the caller names what it sent."""
    if os.environ.get("STRATA_COMMIT"):
        return os.environ["STRATA_COMMIT"]

    def git(*a):
        return subprocess.run(["git", "-C", str(path), *a], capture_output=True,
                              text=True).stdout.strip()
    head = git("rev-parse", "--short", "HEAD")
    if not head:   # a copy of the tree without .git (the device machine): the caller says
        return "unknown"
    return head + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def gpu_name() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return f"cpu ({platform.processor() or platform.machine()})"


def utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def config_json(config: dict) -> str:
    return json.dumps(config, sort_keys=True, default=str)


def write_csv(rows: list[dict], path: str | Path) -> Path:
    """The rows as the long-format CSV at `path`, whole or not at all (written beside it, then
    renamed: a run stopped mid-write, or one rewriting its CSV as it goes, keeps the last whole
    file)."""
    from strata.atomic import atomic_write
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as tmp, open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="raise")
        w.writeheader()
        for r in rows:
            row = {c: r.get(c, "") for c in COLUMNS}
            if isinstance(row["config"], dict):
                row["config"] = config_json(row["config"])
            if row["bound_value"] is None:
                row["bound_value"] = ""
            w.writerow(row)
    return path


def _number(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return v            # categorical (e.g. a tile's schedule) or empty (a skipped config)


def read_csv(path: str | Path) -> list[dict]:
    """Rows as written, with `config` parsed back to a dict and `value` to a float."""
    rows = []
    with Path(path).open(newline="") as f:
        for r in csv.DictReader(f):
            r["config"] = json.loads(r["config"]) if r["config"] else {}
            r["value"] = _number(r["value"])
            r["bound_value"] = float(r["bound_value"]) if r["bound_value"] else None
            rows.append(r)
    return rows
