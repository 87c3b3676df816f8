"""experiments/prefill_ab.py and split_ab.py --smoke end to end (their roofline arithmetic:
tests/test_roofline.py)."""
import functools
import importlib.util
from pathlib import Path

import pytest

from strata import bench
from strata.bench import roofline as rl
from strata.shapes import get_preset

ROOT = Path(__file__).resolve().parents[1]


def _load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "experiments" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# Stand-in rates for the CPU (where the measured ones are NaN and bound nothing): distinct, so
# a term counted at another's rate shows.
GEMM, ATTN, DENSE = 3e9, 5e9, 7e9


def test_resident_floor_is_the_full_compute_floor():
    """One chunk of T at P = 0: experts + attention + dense, each at its rate; unmeasured
    rates give no floor (empty figures), not an infinite tokens/s."""
    pab = _load("prefill_ab")
    tiny, T = get_preset("tiny"), 300
    rates = rl.Rates(tiny, gemm={T: GEMM}, attn={T: ATTN}, dense={T: DENSE})
    want = (rl.expert_flops(tiny, T) / GEMM + rl.attention_flops(tiny, 0, T) / ATTN
            + rl.dense_flops(tiny, T) / DENSE)
    got = pab.resident_floor(tiny, T, 2.0, rates)
    assert got["floor_s"] == pytest.approx(want)
    assert got["floor_tokens_per_s"] == pytest.approx(T / want)
    assert got["floor_fraction"] == pytest.approx(want / 2.0)
    nan = float("nan")
    none = pab.resident_floor(tiny, T, 2.0, rl.Rates(tiny, gemm={T: nan}, attn={T: nan},
                                                     dense={T: nan}))
    assert set(none.values()) == {""}


def test_prefill_ab_smoke(tmp_path, monkeypatch, capsys):
    pab = _load("prefill_ab")
    monkeypatch.setattr(pab, "Rates", functools.partial(
        rl.Rates, measure_gemm=lambda s, T: GEMM, measure_attn=lambda s, T: ATTN,
        measure_dense=lambda s, T: DENSE))
    assert pab.main(["--smoke", "--out", str(tmp_path)]) == 0
    rows = bench.read_csv(tmp_path / "prefill_ab-smoke.csv")
    figs = {r["figure"] for r in rows if r["config"].get("arm") == "auto"}
    assert {"tokens_per_s", "roofline_fraction", "roofline_attn_fraction", "hit_fraction",
            "copy_window_gbps", "copy_rate_fraction", "wait_s", "roofline_full_fraction"} <= figs
    by = {}
    for r in rows:
        by.setdefault((r["config"]["arm"], r["config"]["prompt"]), {})[r["figure"]] = r
    # the resident read's floor: one chunk of T at P = 0, every term at its stand-in rate
    shape = get_preset(pab.SMOKE["demo-Q8_0"][0])
    for T in (300, 700):
        res = by[("resident", T)]
        floor = (rl.expert_flops(shape, T) / GEMM + rl.attention_flops(shape, 0, T) / ATTN
                 + rl.dense_flops(shape, T) / DENSE)
        assert res["floor_tokens_per_s"]["value"] == pytest.approx(T / floor)
        assert res["floor_fraction"]["value"] == pytest.approx(floor / res["seconds"]["value"])
        assert res["floor_fraction"]["bound_value"] == 0.8
        assert res["tokens_per_s"]["bound_value"] == pytest.approx(T / floor)
        # a streamed read's full floor counts more compute than its attention-only one
        auto = by[("auto", T)]
        assert auto["roofline_full_s"]["value"] >= auto["roofline_attn_s"]["value"]
    out = capsys.readouterr().out
    assert "resident T=300: " in out and "compute floor (attention + experts + dense) " in out
    assert (tmp_path / "prefill_ab-smoke.png").stat().st_size > 5_000
    assert (tmp_path / "prefill_ab-smoke-overlap.png").stat().st_size > 5_000


def test_split_ab_smoke(tmp_path):
    """experiments/split_ab.py --smoke: one and two simulated participants on the CPU."""
    sab = _load("split_ab")
    assert sab.main(["--smoke", "--out", str(tmp_path)]) == 0
    rows = bench.read_csv(tmp_path / "split_ab-smoke.csv")
    tps = [r for r in rows if r["figure"] == "tokens_per_s"]
    assert len(tps) >= 2 and all(r["value"] > 0 for r in tps)
