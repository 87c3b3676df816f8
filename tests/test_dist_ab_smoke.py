"""experiments/dist_ab.py --smoke: two gloo ranks on the CPU against the one-process split."""
import os
import subprocess
import sys
from pathlib import Path

from strata import bench

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "dist_ab.py"


def test_dist_ab_smoke(tmp_path):
    # run as a script, as on the device: the spawned ranks re-import it as the main module
    env = dict(os.environ, PYTHONPATH=str(SCRIPT.parents[1]))
    p = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(tmp_path)],
                       env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = bench.read_csv(tmp_path / "dist_ab-smoke-gloo.csv")
    assert (tmp_path / "dist_ab-smoke-gloo.png").stat().st_size > 10_000
    runs = {r["config"]["run"] for r in rows if r["figure"] == "tokens_per_s"}
    assert runs == {"one process", "2 ranks sequential", "2 ranks pipelined"}
    same = [r["value"] for r in rows if r["figure"] == "logits_identical"]
    assert same == [1.0, 1.0]    # CPU fp32, the same plan and expert path: bit for bit
    sent = {(r["config"]["run"], r["config"]["rank"]): r["value"] for r in rows
            if r["figure"] == "handoff_bytes_per_chunk"}
    assert all(v > 0 for (run, rank), v in sent.items() if rank == 0)
    assert all(v == 0 for (run, rank), v in sent.items() if rank == 1)   # the last rank
