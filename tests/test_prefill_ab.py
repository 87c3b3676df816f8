"""experiments/prefill_ab.py and split_ab.py --smoke end to end (their roofline arithmetic:
tests/test_roofline.py)."""
import importlib.util
from pathlib import Path

from strata import bench

ROOT = Path(__file__).resolve().parents[1]


def _load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "experiments" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_prefill_ab_smoke(tmp_path):
    pab = _load("prefill_ab")
    assert pab.main(["--smoke", "--out", str(tmp_path)]) == 0
    rows = bench.read_csv(tmp_path / "prefill_ab-smoke.csv")
    figs = {r["figure"] for r in rows if r["config"].get("arm") == "auto"}
    assert {"tokens_per_s", "roofline_fraction", "roofline_attn_fraction", "hit_fraction",
            "copy_window_gbps", "copy_rate_fraction", "wait_s"} <= figs
    assert (tmp_path / "prefill_ab-smoke.png").stat().st_size > 5_000
    assert (tmp_path / "prefill_ab-smoke-overlap.png").stat().st_size > 5_000


def test_split_ab_smoke(tmp_path):
    """experiments/split_ab.py --smoke: one and two simulated participants on the CPU."""
    sab = _load("split_ab")
    assert sab.main(["--smoke", "--out", str(tmp_path)]) == 0
    rows = bench.read_csv(tmp_path / "split_ab-smoke.csv")
    tps = [r for r in rows if r["figure"] == "tokens_per_s"]
    assert len(tps) >= 2 and all(r["value"] > 0 for r in tps)
