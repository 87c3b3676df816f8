"""experiments/deltanet_fla.py on the CPU interpreter (--smoke): strata's rows, every figure
finite, the distance to the fp64 recurrence within the chunk rule's fp32 reach."""
import importlib.util
from pathlib import Path

from strata.bench.record import read_csv

ROOT = Path(__file__).resolve().parents[1]


def test_smoke_writes_rows_and_plot(tmp_path):
    spec = importlib.util.spec_from_file_location("deltanet_fla",
                                                  ROOT / "experiments" / "deltanet_fla.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--smoke", "--out", str(tmp_path), "--arms", "strata", "strata[split]",
                     "fla-core"]) == 0
    rows = read_csv(tmp_path / "deltanet_fla-smoke.csv")
    assert (tmp_path / "deltanet_fla-smoke.png").stat().st_size > 0
    # fla-core never runs on the CPU (its import asks Triton for a GPU driver)
    assert {r["label"] for r in rows} == {"strata", "strata[split]"}
    assert {r["config"]["T"] for r in rows} == {70, 130}
    err = [r["value"] for r in rows if r["figure"].startswith("max |")]
    assert len(err) == 8 and max(err) < 1e-5
