"""experiments/cold_warm.py --smoke end to end: fresh child processes on a tiny pack, the time to
ready split into phases that add up."""
import importlib.util
from pathlib import Path

from strata import bench

ROOT = Path(__file__).resolve().parents[1]


def test_cold_warm_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("cold_warm", ROOT / "experiments" / "cold_warm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--smoke", "--arms", "warm", "--repeats", "2", "--out", str(tmp_path)]) == 0
    rows = bench.read_csv(tmp_path / "cold_warm-smoke.csv")
    runs = {}
    for r in rows:
        if "arm" in r["config"]:
            runs.setdefault(r["config"]["prompt"], {})[r["figure"]] = r["value"]
    assert sorted(runs) == [40, 100]
    for fig in runs.values():
        phases = sum(fig[k] for k in ("import_s", "cuda_s", "start_s", "fill_s", "warmup_s",
                                      "prompt_s"))
        assert abs(phases - fig["ready_s"]) < 1e-3 * max(1.0, fig["ready_s"])
        assert fig["warmup_s"] > 0 and fig["first_tokens_per_s"] > 0
        # fill_s's parts (PrefillEngine.timings) lie inside it; the warm-up splits into read + load
        parts = sum(fig[k] for k in ("plan_s", "cache_alloc_s", "cache_fill_s", "other_s",
                                     "dense_upload_s", "model_build_s", "pin_wait_s",
                                     "ffn_s"))
        assert 0 < parts <= fig["fill_s"] + 1e-6
        assert fig["warmup_layers"] >= 1 and fig["warmup_read_s"] > 0
        assert abs(fig["warmup_read_s"] + fig["warmup_load_s"] - fig["warmup_s"]) < 1e-6
    assert any(r["figure"] == "page_cache_read_s" for r in rows)
    assert (tmp_path / "cold_warm-smoke.png").stat().st_size > 5_000
