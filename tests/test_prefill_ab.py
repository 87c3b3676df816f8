"""experiments/prefill_ab.py: the roofline arithmetic, and the --smoke run end to end."""
import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

from strata import bench
from strata.shapes import get_preset

ROOT = Path(__file__).resolve().parents[1]


def _load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "experiments" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _res(*chunks):
    return SimpleNamespace(stats=SimpleNamespace(chunks=[
        SimpleNamespace(start=s, tokens=t, bytes_streamed=b, layers=None) for s, t, b in chunks]))


def test_roofline_counts_every_layers_experts_and_attention():
    """The compute side of a chunk is all its layers' expert FLOPs (it once counted one layer)
    and, for the second bound, their causal attention after the chunk's start position."""
    pab = _load("prefill_ab")
    shape = get_preset("qwen3-30b-a3b")
    T, rate, arate = 4096, 500e12, 300e12
    per_layer = 2 * T * shape.top_k * 3 * shape.d_model * shape.d_expert
    res = _res((0, T, 0), (T, T, 0))
    want = 2 * shape.n_layer * per_layer / rate
    assert pab.roofline(res, shape, h2d=1e30, gemm={T: rate}) == pytest.approx(want)
    attn = (pab.attention_flops(shape, 0, T) + pab.attention_flops(shape, T, T)) / arate
    assert pab.roofline(res, shape, 1e30, {T: rate}, {T: arate}) == pytest.approx(want + attn)
    # a later chunk attends to the earlier one: 4·H·hd per query-key pair over every layer
    assert pab.attention_flops(shape, T, T) - pab.attention_flops(shape, 0, T) == pytest.approx(
        4 * shape.n_head * shape.head_dim * T * T * shape.n_layer)
    # copies bound a chunk when they take longer than its compute
    res = _res((0, T, 10**12))
    assert pab.roofline(res, shape, h2d=1e9, gemm={T: rate}) == pytest.approx(1000.0)


def test_split_roofline_counts_every_layer():
    sab = _load("split_ab")
    shape = get_preset("qwen3-30b-a3b")
    T, rate = 2048, 400e12
    res = _res((0, T, 0), (0, T, 0))
    for c, layers in zip(res.stats.chunks, ((0, 1), (2, 3))):
        c.layers = layers
    got = sab.split_roofline(res, shape, {(0, 1): 1e30, (2, 3): 1e30}, {T: rate})
    assert got == pytest.approx(2 * T * shape.top_k * 3 * shape.d_model * shape.d_expert
                                * shape.n_layer / rate)


def test_prefill_ab_smoke(tmp_path):
    pab = _load("prefill_ab")
    assert pab.main(["--smoke", "--out", str(tmp_path)]) == 0
    rows = bench.read_csv(tmp_path / "prefill_ab-smoke.csv")
    figs = {r["figure"] for r in rows if r["config"].get("arm") == "auto"}
    assert {"tokens_per_s", "roofline_fraction", "roofline_attn_fraction", "hit_fraction"} <= figs
    assert (tmp_path / "prefill_ab-smoke.png").stat().st_size > 5_000


def test_split_ab_smoke(tmp_path):
    """experiments/split_ab.py --smoke: one and two simulated participants on the CPU."""
    sab = _load("split_ab")
    assert sab.main(["--smoke", "--out", str(tmp_path)]) == 0
    rows = bench.read_csv(tmp_path / "split_ab-smoke.csv")
    tps = [r for r in rows if r["figure"] == "tokens_per_s"]
    assert len(tps) >= 2 and all(r["value"] > 0 for r in tps)
