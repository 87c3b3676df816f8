"""benchmarks/synth_hits.py --smoke runs end to end and writes strata.bench rows."""
import importlib.util
from pathlib import Path

from strata import bench

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "synth_hits.py"


def test_synth_hits_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("synth_hits", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--smoke", "--out", str(tmp_path)]) == 0
    (csv_path,) = tmp_path.glob("synth-hits-smoke-*.csv")
    assert csv_path.with_suffix(".png").stat().st_size > 5_000
    rows = bench.read_csv(csv_path)
    assert {r["figure"] for r in rows} == set(mod.FIGURES)
    hits = [r for r in rows if r["figure"] == "hit_fraction"]
    assert len(hits) == 2 * 3                        # two q/k norm scales x 3 layers
    assert all(0 < r["value"] <= 1 and 0 < r["bound_value"] <= 1 for r in hits)
