"""benchmarks/router_bench.py runs end to end (--smoke: tiny shapes, the interpreter on a CPU)."""
from strata import bench
from tests.scripts import load_script


def _load():
    return load_script("benchmarks/router_bench.py")


def test_router_bench_smoke(tmp_path):
    argv = ["--smoke", "--shapes", "qwen3-30b-a3b", "--tiles", "16x16/w4s2", "--out",
            str(tmp_path)]
    assert _load().main(argv) == 0
    (csv_path,) = tmp_path.glob("router-*-smoke.csv")
    assert csv_path.with_suffix(".png").stat().st_size > 0
    rows = [r for r in bench.read_csv(csv_path) if r["figure"] == "ms"]
    assert [r["config"]["arm"] for r in rows] == ["torch", "fused", "fused[16x16/w4s2]"]
    assert all(r["value"] > 0 and r["gate"].startswith("ids == torch") for r in rows)


def test_router_bench_refuses_a_wrong_kernel(tmp_path, monkeypatch):
    mod = _load()
    real = mod.softmax_topk_route
    monkeypatch.setattr(mod, "softmax_topk_route",
                        lambda x, w, k, *a, **kw: (lambda i, wt: ((i + 1) % w.shape[0], wt))(
                            *real(x, w, k, *a, **kw)))
    assert mod.main(["--smoke", "--shapes", "qwen3-30b-a3b", "--out", str(tmp_path)]) == 1
    assert not list(tmp_path.glob("*.csv"))


def test_router_bench_bad_tile_is_one_line(tmp_path):
    import pytest
    with pytest.raises(SystemExit, match="a tile is BMxBD"):
        _load().main(["--smoke", "--tiles", "64by64", "--out", str(tmp_path)])
