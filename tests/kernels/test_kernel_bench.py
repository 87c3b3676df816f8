"""experiments/kernel_bench.py --smoke runs on the CPU and writes its long-format CSV."""
import csv
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_kernel_bench_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("kernel_bench",
                                                  ROOT / "experiments" / "kernel_bench.py")
    kb = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kb)
    rc = kb.main(["--smoke", "--T", "5", "--formats", "Q8_0", "--reps", "1",
                  "--out", str(tmp_path)])
    assert rc == 0
    rows = list(csv.DictReader(open(tmp_path / "kernel_bench_smoke.csv")))
    assert {"gpu", "commit", "timestamp", "config", "arm", "figure", "value", "bound"} <= set(rows[0])
    checks = [r for r in rows if r["figure"] == "rel_err"]
    assert {r["arm"] for r in checks} == {"strata-dp", "strata-sk", "grouped_mm-bf16",
                                          "decode+grouped_mm"}
    assert all("pass" in r["bound"] for r in checks)
    assert any(r["figure"] == "tflops" for r in rows)
