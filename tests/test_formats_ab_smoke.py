"""experiments/formats_ab.py --smoke end to end on the CPU: every figure of the three packs."""
import importlib.util
from pathlib import Path

from strata import bench

ROOT = Path(__file__).resolve().parents[1]


def test_formats_ab_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("formats_ab", ROOT / "experiments" / "formats_ab.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--smoke", "--out", str(tmp_path), "--repeats", "1", "--warmup", "0"]) == 0
    rows = bench.read_csv(tmp_path / "formats_ab-smoke.csv")
    tps = {r["config"]["pack"]: r for r in rows if r["figure"] == "tokens_per_s"}
    assert set(tps) == {"Q8_0", "Q4_K_M", "IQ4_XS"} and all(r["value"] > 0 for r in tps.values())
    assert all(r["bound_value"] > 0 for r in tps.values()), "each read has its PCIe bound"
    assert {r["config"]["pack"] for r in rows if r["figure"] == "speedup_vs_Q8_0"} == \
        {"Q4_K_M", "IQ4_XS"}
    arms = {(r["config"]["format"], r["config"]["arm"]) for r in rows if r["figure"] == "tflops"}
    assert ("Q8_0", "grouped_mm-bf16") in arms and ("Q8_0", "strata-kernel") in arms
    assert {r["config"]["format"] for r in rows if r["figure"] == "decode_gbps"} >= {"Q8_0"}
    assert (tmp_path / "formats_ab-smoke.png").stat().st_size > 5_000
