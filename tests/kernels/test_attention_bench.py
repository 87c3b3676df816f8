"""experiments/attention_bench.py --smoke runs on the CPU and writes strata.bench's long CSV."""
import importlib.util
from pathlib import Path

import pytest
import torch

from strata import bench

ROOT = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("attention_bench",
                                                  ROOT / "experiments" / "attention_bench.py")
    ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ab)
    return ab


def test_attention_bench_smoke(tmp_path):
    assert _load().main(["--smoke", "--T", "5", "--out", str(tmp_path)]) == 0
    rows = bench.read_csv(tmp_path / "attention_bench_smoke.csv")
    assert {"gpu", "commit", "timestamp", "config", "figure", "value", "bound"} <= set(rows[0])
    tf = [r for r in rows if r["figure"] == "tflops"]
    arms = {(r["config"]["P"], r["config"]["arm"], r["config"]["kv"]) for r in tf}
    assert {(0, "strata", "bf16"), (0, "strata", "int8"), (0, "sdpa-causal", "bf16"),
            (40, "sdpa-mask", "bf16"), (40, "sdpa-full", "bf16"), (40, "strata", "int8")} <= arms
    strata = [r for r in tf if r["config"]["arm"] == "strata"]
    assert all(r["gate"].startswith("normalized error") and r["timer"] for r in strata)
    # both int8 paths; the expand path's pieces (P 100 over a one-tile scratch) and its figures
    paths = {(r["config"]["P"], r["config"].get("int8")) for r in strata
             if r["config"]["kv"] == "int8"}
    assert {(0, "kernel"), (40, "kernel"), (40, "expand"), (100, "expand")} <= paths
    for fig in ("vs_bf16", "expand_ms", "expand_share"):
        assert any(r["figure"] == fig and r["config"].get("int8") == "expand" for r in rows), fig
    checks = [r for r in rows if r["figure"].startswith("rel_err")]
    assert checks and all(r["value"] < r["bound_value"] for r in checks)
    assert not list(tmp_path.glob("*.partial.csv"))
    assert (tmp_path / "attention_bench_smoke.png").stat().st_size > 5_000


def test_attention_bench_refuses_a_wrong_kernel(tmp_path, monkeypatch):
    ab = _load()
    real = ab.chunk_attention

    def wrong(q, k, v, prefix=(), **kw):   # drops the prefix's first key
        prefix = [type(s)(s.k[1:], s.v[1:], *(x if x is None else x[1:]
                                               for x in (s.k_scale, s.v_scale))) for s in prefix]
        return real(q, k, v, prefix, **kw)

    monkeypatch.setattr(ab, "chunk_attention", wrong)
    rc = ab.main(["--smoke", "--T", "5", "--kv", "bf16", "--out", str(tmp_path)])
    assert rc == 1 and not list(tmp_path.glob("*.csv"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a machine without CUDA")
def test_attention_bench_no_gpu_is_one_line(capsys):
    assert _load().main([]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--smoke" in err[0]
