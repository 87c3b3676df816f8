"""experiments/arch_ab.py --smoke end to end on the CPU: a tiny GPT-OSS shape streamed (two
prompt lengths, each against its PCIe bound) and all-resident."""
import importlib.util
from pathlib import Path

from strata import bench

ROOT = Path(__file__).resolve().parents[1]


def test_arch_ab_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("arch_ab", ROOT / "experiments" / "arch_ab.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--smoke", "--out", str(tmp_path), "--repeats", "1", "--warmup", "0"]) == 0
    rows = bench.read_csv(tmp_path / "arch_ab-smoke.csv")
    tps = {r["config"]["prompt"]: r for r in rows if r["figure"] == "tokens_per_s"}
    assert set(tps) == {48, 64} and all(r["value"] > 0 for r in tps.values())
    assert all(r["bound_value"] > 0 for r in tps.values()), "each read has its PCIe bound"
    res = [r for r in rows if r["figure"] == "resident_tokens_per_s"]
    assert len(res) == 1 and res[0]["value"] > 0   # its bound (grouped_mm's rate) is a GPU figure
    assert res[0]["config"]["expert_bytes"] > 0
    assert (tmp_path / "arch_ab-smoke.png").stat().st_size > 5_000
