"""benchmarks/sdpa_layout_bench.py runs end to end (--smoke: tiny shapes on a CPU) and refuses an
arm whose output is not the floor arm's."""
from strata import bench
from tests.scripts import load_script


def _load():
    return load_script("benchmarks/sdpa_layout_bench.py")


def test_sdpa_layout_bench_smoke(tmp_path):
    assert _load().main(["--smoke", "--out", str(tmp_path)]) == 0
    (csv_path,) = tmp_path.glob("sdpa-layout-*-smoke.csv")
    assert csv_path.with_suffix(".png").stat().st_size > 0
    rows = [r for r in bench.read_csv(csv_path) if r["figure"] == "ms"]
    assert [r["config"]["arm"] for r in rows] == ["floor", "engine", "v-contiguous"]
    assert all(r["value"] > 0 for r in rows)


def test_sdpa_layout_bench_refuses_a_wrong_engine_arm(tmp_path, monkeypatch):
    mod = _load()
    real = mod.first_chunk_attention
    monkeypatch.setattr(mod, "first_chunk_attention",
                        lambda q, k, v: real(q, k, v).flip(0))    # rows out of order
    assert mod.main(["--smoke", "--out", str(tmp_path)]) == 1
    assert not list(tmp_path.glob("*.csv"))
