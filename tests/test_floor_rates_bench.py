"""benchmarks/floor_rates_bench.py runs end to end on a CPU (--smoke: the rates are NaN there, the
rows and plot are still written), and the rate functions' settle_s leaves their CPU answer alone."""
import math

from strata import bench
from tests.scripts import load_script
from strata.bench import roofline as rl
from strata.shapes import get_preset


def _load():
    return load_script("benchmarks/floor_rates_bench.py")


def test_floor_rates_bench_smoke(tmp_path):
    assert _load().main(["--smoke", "--out", str(tmp_path)]) == 0
    (csv_path,) = tmp_path.glob("floor-rates-*-smoke.csv")
    assert csv_path.with_suffix(".png").stat().st_size > 0
    rows = [r for r in bench.read_csv(csv_path) if r["figure"] == "tflops"]
    got = {(r["config"]["kind"], r["config"]["arm"]) for r in rows}
    assert got == {(k, a) for k in ("attn", "gemm", "dense") for a in ("burst", "settled")}
    settled = [r for r in rows if r["config"]["arm"] == "settled"]
    assert all(r["config"]["settle_s"] > 0 and r["config"]["reps"] == 2 for r in settled)


def test_settle_keeps_the_cpu_answer():
    s = get_preset("qwen3-30b-a3b")
    for fn in (rl.sdpa_rate, rl.gemm_rate, rl.dense_rate):
        assert math.isnan(fn(s, 256, settle_s=0.5))
