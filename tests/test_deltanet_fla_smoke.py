"""experiments/deltanet_fla.py on the CPU interpreter (--smoke): strata's rows (and fla-core's
kernels as strata launches them, where fla-core is installed), every figure finite, the distance
to the fp64 recurrence within the chunk rule's fp32 reach."""
import importlib.util
from pathlib import Path

from strata.bench.record import read_csv

ROOT = Path(__file__).resolve().parents[1]


def test_smoke_writes_rows_and_plot(tmp_path):
    spec = importlib.util.spec_from_file_location("deltanet_fla",
                                                  ROOT / "experiments" / "deltanet_fla.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    fla = importlib.util.find_spec("fla") is not None
    arms = ["strata", "strata[split]"] + (["strata[backend=fla]"] if fla else [])
    assert mod.main(["--smoke", "--out", str(tmp_path), "--arms", *arms, "fla-core"]) == 0
    rows = read_csv(tmp_path / "deltanet_fla-smoke.csv")
    assert (tmp_path / "deltanet_fla-smoke.png").stat().st_size > 0
    # fla-core's own wrapper runs on CUDA only (it autotunes through a GPU driver)
    assert {r["label"] for r in rows} == set(arms)
    assert {r["config"]["T"] for r in rows} == {70, 130}
    err = [r["value"] for r in rows if r["figure"].startswith("max |")]
    assert len(err) == 4 * len(arms) and max(err) < 1e-5
