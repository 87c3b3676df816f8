"""benchmarks/prefix_route_bench.py runs end to end (--smoke: tiny shapes on a CPU) and refuses an
arm whose output is not the fp32 reference's (the sinks among what it checks)."""
from strata import bench
from tests.scripts import load_script


def _load():
    return load_script("benchmarks/prefix_route_bench.py")


def test_prefix_route_bench_smoke(tmp_path):
    assert _load().main(["--smoke", "--out", str(tmp_path)]) == 0
    (csv_path,) = tmp_path.glob("prefix-route-*-smoke.csv")
    assert csv_path.with_suffix(".png").stat().st_size > 0
    rows = [r for r in bench.read_csv(csv_path) if r["figure"] == "ms"]
    assert [(r["config"]["P"], r["config"]["arm"]) for r in rows] == \
        [(0, "triton"), (0, "flash"), (20, "triton"), (20, "flash")]
    assert all(r["value"] > 0 and r["config"]["sinks"] for r in rows)


def test_prefix_route_bench_refuses_blocks_that_drop_the_sinks(tmp_path, monkeypatch):
    mod = _load()
    real = mod.prefix_flash_attention
    monkeypatch.setattr(mod, "prefix_flash_attention",
                        lambda *a, sinks=None, **kw: real(*a, **kw))
    assert mod.main(["--smoke", "--out", str(tmp_path)]) == 1
    assert not list(tmp_path.glob("*.csv"))
