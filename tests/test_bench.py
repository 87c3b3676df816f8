"""strata.bench: long-format CSV, the gate, timing labels, --base against a git ref."""
import csv
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from strata import bench
from strata.bench import GateRefused, Recorder

ROOT = Path(__file__).resolve().parents[1]

# A trivial CPU experiment in the convention: its timed figure is gated by a check.
TRIVIAL = '''"""trivial: time a sum, checked against math."""
import sys
import torch
from strata import bench

def measure(args, rec):
    x = torch.arange(args.n, dtype=torch.float64)
    t = rec.timed(lambda: x.sum(), what="sum == n(n-1)/2",
                  check=lambda: float(x.sum()) == args.n * (args.n - 1) / 2)
    rec.add("sum time", t.median_ms, "ms", bound="none", gate="sum == n(n-1)/2",
            timer=t.timer, n=args.n)

def main(argv=None):
    ap = bench.parser(__doc__, warmup=1, repeats=3)
    ap.add_argument("--n", type=int, default=100)
    return bench.main(ap.parse_args(argv), "trivial", measure, script=__file__, argv=argv)

if __name__ == "__main__":
    sys.exit(main())
'''


def _measure_ok(args, rec):
    rec.add("rate", 2.5, "GB/s", bound="55.4 GB/s H2D", bound_value=55.4, n=4, fmt="Q8_0")


def _args(tmp_path, *extra):
    return bench.parser("x").parse_args(["--out", str(tmp_path), *extra])


def test_csv_has_the_long_format_columns(tmp_path):
    assert bench.main(_args(tmp_path), "exp", _measure_ok, script=__file__, argv=[]) == 0
    with (tmp_path / "exp.csv").open() as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert reader.fieldnames == bench.COLUMNS
    for col in ("gpu", "commit", "timestamp", "config", "figure", "value", "unit", "bound"):
        assert col in reader.fieldnames
    (r,) = rows
    assert r["label"] == "tree" and r["figure"] == "rate" and float(r["value"]) == 2.5
    assert r["bound"] == "55.4 GB/s H2D" and float(r["bound_value"]) == 55.4
    assert r["commit"] and r["gpu"] and r["timestamp"].endswith("Z")
    assert bench.read_csv(tmp_path / "exp.csv")[0]["config"] == {"n": 4, "fmt": "Q8_0"}
    assert (tmp_path / "exp.png").stat().st_size > 5_000


@pytest.mark.parametrize("check, why", [
    (lambda: False, "returns False"),
    (lambda: "max error 0.5 > bound 1e-2", "returns a reason"),
    (lambda: (_ for _ in ()).throw(AssertionError("mismatch at [3, 1]")), "raises"),
], ids=["false", "reason", "assert"])
def test_gate_refuses_a_failing_check_and_nothing_is_timed(check, why):
    calls = []
    rec = Recorder("exp", warmup=1, repeats=2)
    with pytest.raises(GateRefused, match="kernel == ref"):
        rec.timed(lambda: calls.append(1), check=check, what="kernel == ref")
    assert calls == [], f"the kernel ran although its check {why}"


def test_refused_run_writes_no_csv(tmp_path, capsys):
    def measure(args, rec):
        rec.add("untimed", 1.0, "x")
        rec.timed(lambda: None, check=lambda: False, what="kernel == ref")
        rec.add("speedup", 9.9, "x")
    assert bench.main(_args(tmp_path), "exp", measure, script=__file__, argv=[]) == 1
    assert not list(tmp_path.glob("*.csv"))
    assert "REFUSED" in capsys.readouterr().err


def test_gate_passes_and_labels_the_timer():
    rec = Recorder("exp", warmup=1, repeats=3, device="cpu")
    t = rec.timed(lambda: sum(range(100)), check=lambda: True, what="ok")
    assert t.repeats == 3 and t.timer == bench.CPU_TIMER and 0 < t.min_s <= t.median_s


@pytest.mark.gpu
def test_gpu_timing_uses_cuda_events():
    import torch
    x = torch.randn(1 << 20, device="cuda")
    t = bench.time_fn(lambda: x.mul_(1.0), device="cuda", warmup=2, repeats=5)
    assert t.timer == bench.CUDA_TIMER and 0 < t.min_s <= t.median_s


def test_pytest_gate_refuses_a_failing_selection(tmp_path):
    (tmp_path / "test_fails.py").write_text("def test_x():\n    assert 1 == 2\n")
    (tmp_path / "test_ok.py").write_text("def test_x():\n    assert 1 == 1\n")
    assert bench.pytest_gate("test_ok.py", cwd=tmp_path) == "pytest test_ok.py"
    with pytest.raises(GateRefused, match="did not pass"):
        bench.pytest_gate("test_fails.py", cwd=tmp_path)


def test_strip_own_args():
    argv = ["--n", "5", "--base", "HEAD", "--out=/x", "--label", "t", "--out-dir", "/y", "-v"]
    assert bench.strip_own_args(argv) == ["--n", "5", "-v"]


def _git(cwd, *a):
    subprocess.run(["git", "-C", str(cwd), *a], check=True, capture_output=True)


def test_base_head_runs_both_and_removes_the_worktree(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "strata", repo / "strata",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "exp.py").write_text(TRIVIAL)
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "trivial")
    out = tmp_path / "out"
    env = {"PYTHONPATH": str(repo), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    res = subprocess.run([sys.executable, str(repo / "exp.py"), "--n", "50", "--base", "HEAD~0",
                          "--out", str(out)], cwd=repo, capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr
    rows = bench.read_csv(out / "trivial.csv")
    assert [r["label"] for r in rows] == ["tree", "HEAD~0"]
    assert all(r["config"] == {"n": 50} and r["gate"] == "sum == n(n-1)/2" for r in rows)
    assert rows[0]["commit"] == rows[1]["commit"]            # HEAD~0 is the clean tree's commit
    wts = subprocess.run(["git", "-C", str(repo), "worktree", "list"], capture_output=True,
                         text=True).stdout.strip().splitlines()
    assert len(wts) == 1, f"the base worktree was left behind: {wts}"


def test_base_unknown_ref_is_a_clear_error(tmp_path):
    from strata.errors import StrataError
    with pytest.raises(StrataError, match="no such commit"):
        bench.run_base("no-such-ref-xyz", ROOT / "tests" / "test_bench.py", [])


SCRIPTS = sorted([*(ROOT / "experiments").glob("*.py"), *(ROOT / "benchmarks").glob("*.py")])
# What an experiment must not do to reach another script or the engine: load a script by path
# or edit the import path (shared pieces live in strata.bench), or set an environment knob to
# steer the engine (EngineConfig fields, pin_tile and the engine's observers do that explicitly).
FORBIDDEN = ("spec_from_file_location", "importlib", "runpy", "sys.path", "os.environ[",
             "os.environ.pop", "setenv(")


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_experiments_use_the_library_not_each_other(script):
    src = script.read_text()
    assert not [f for f in FORBIDDEN if f in src], script.name


def test_settle_is_recorded_on_timed_rows_only():
    from strata.bench import Recorder
    rec = Recorder("x", settle_s=0.25, warmup=0, repeats=1)
    t = rec.timed(lambda: None, check=lambda: None, what="nothing")
    timed = rec.add("ms", t.median_ms, "ms", timer=t.timer, arm="a")
    plain = rec.add("bytes", 3, "B", arm="a")
    assert timed["config"] == {"arm": "a", "settle_s": 0.25}
    assert plain["config"] == {"arm": "a"}
    assert bench.parser("doc", settle=0.3).parse_args([]).settle == 0.3
