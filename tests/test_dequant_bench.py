"""benchmarks/dequant_bench.py runs end to end (--smoke: tiny shapes, the interpreter on a CPU)."""
import csv
import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "dequant_bench.py"


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_dequant_bench_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("dequant_bench", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    argv = ["--smoke", "--formats", "Q8_0,IQ3_S", "--out-dtypes", "bf16,fp32", "--out-dir",
            str(tmp_path), "--decoders", "elem,runs"]
    assert bench.main(argv) == 0
    (csv_path,) = tmp_path.glob("dequant-*-smoke.csv")
    assert csv_path.with_suffix(".png").stat().st_size > 0
    rows = list(csv.DictReader(open(csv_path)))
    assert [(r["format"], r["out_dtype"], r["decoder"]) for r in rows] == [
        (f, d, dec) for f in ("Q8_0", "IQ3_S") for d in ("bfloat16", "float32")
        for dec in ("elem", "runs")]
    for r in rows:
        assert r["commit"] and r["gpu"] and "--smoke" in r["command"]
        # bytes moved: the blocks read + the matrix written (8 x 256 weights in smoke mode)
        assert int(r["bytes_written"]) == 8 * 256 * (2 if r["out_dtype"] == "bfloat16" else 4)
        assert float(r["GBps"]) > 0
