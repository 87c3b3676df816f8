"""experiments/slab_ab.py --smoke: the simulated full card, in strata.bench's long format."""
import importlib.util
from pathlib import Path

from strata import bench

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "slab_ab.py"


def test_slab_ab_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("slab_ab", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    # one chunk (8 tokens, the smoke's chunk): its first stream-k launch already asks the scratch
    # that fails slab off and comes from the tail slab on (a second chunk costs each of the
    # smoke's five reads its interpreted launches again)
    assert mod.main(["--smoke", "--tokens", "8", "--out", str(tmp_path)]) == 0
    rows = bench.read_csv(tmp_path / "slab_ab_smoke.csv")
    assert (tmp_path / "slab_ab_smoke.png").stat().st_size > 10_000
    fill = {r["run"]: r for r in mod.table(rows, "fill")}
    assert fill["SIMULATED full card slab off"]["outcome"] == "AllocationError"
    assert fill["SIMULATED full card slab on"]["outcome"] == "ok"
    assert fill["SIMULATED full card slab on"]["logits_identical"] == 1
    assert all(r["cache_intact"] == 1 for r in fill.values() if "cache_intact" in r)
    assert {r["sweep"] for r in mod.table(rows, "classes")} == {"heuristic", "pinned-P"}
