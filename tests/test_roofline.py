"""strata.bench.roofline: the FLOP counts, the bounds and the measured rates."""
import math
from types import SimpleNamespace

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from strata.bench import flops as fl
from strata.bench import roofline as rl
from strata.shapes import PRESETS, DenseFfn, get_preset

QWEN = get_preset("qwen3-30b-a3b")


def chunks(*spec, layers=None):
    """ChunkStats stand-ins: (start, tokens, bytes_streamed[, layers])."""
    return [SimpleNamespace(start=s[0], tokens=s[1], bytes_streamed=s[2],
                            layers=s[3] if len(s) > 3 else layers) for s in spec]


def test_roofline_counts_every_layers_experts_and_attention():
    """The compute side of a chunk is all its layers' expert FLOPs and, for the second bound,
    their causal attention after the chunk's start position."""
    shape = QWEN
    T, rate, arate = 4096, 500e12, 300e12
    per_layer = 2 * T * shape.top_k * 3 * shape.d_model * shape.d_expert
    cs = chunks((0, T, 0), (T, T, 0))
    rates = rl.Rates(shape, gemm={T: rate}, attn={T: arate})
    want = 2 * shape.n_layer * per_layer / rate
    assert rl.roofline(cs, shape, 1e30, rates) == pytest.approx(want)
    attn = (rl.attention_flops(shape, 0, T) + rl.attention_flops(shape, T, T)) / arate
    assert rl.roofline(cs, shape, 1e30, rates, attention=True) == pytest.approx(want + attn)
    # a later chunk attends to the earlier one: 4·H·hd per query-key pair over every layer
    assert rl.attention_flops(shape, T, T) - rl.attention_flops(shape, 0, T) == pytest.approx(
        4 * shape.n_head * shape.head_dim * T * T * shape.n_layer)
    # copies bound a chunk when they take longer than its compute
    assert rl.roofline(chunks((0, T, 10**12)), shape, 1e9, rates) == pytest.approx(1000.0)


def test_split_roofline_counts_every_layer_once_per_chunk():
    """Two GPUs' records of one chunk: the compute counts every layer once (the GPUs' layers
    run one after the other), the copies the slower link."""
    shape = QWEN
    T, rate = 2048, 400e12
    cs = chunks((0, T, 0, (0, 1)), (0, T, 0, (2, 3)))
    got = rl.roofline(cs, shape, {(0, 1): 1e30, (2, 3): 1e30}, rl.Rates(shape, gemm={T: rate}))
    assert got == pytest.approx(2 * T * shape.top_k * 3 * shape.d_model * shape.d_expert
                                * shape.n_layer / rate)
    cs = chunks((0, T, 4e9, (0, 1)), (0, T, 1e9, (2, 3)))
    got = rl.roofline(cs, shape, {(0, 1): 40e9, (2, 3): 1e9}, rl.Rates(shape, gemm={T: 1e30}))
    assert got == pytest.approx(1.0)          # max(4e9 / 40e9, 1e9 / 1e9)


def test_expert_flops_one_layer_and_all():
    T = 512
    one = 2 * T * QWEN.top_k * 3 * QWEN.d_model * QWEN.d_expert
    assert rl.expert_flops(QWEN, T, layers=1) == one
    assert rl.expert_flops(QWEN, T) == one * QWEN.n_layer


def test_dense_flops_by_hand():
    """The tiny shape (D 64, H 4, Hkv 2, hd 16, E 8, 2 layers) counted by hand: q 64x64, k and
    v 64x32 each, o 64x64, router 64x8 multiply-adds per token per layer."""
    tiny = get_preset("tiny")
    per_token = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 64 * 8       # 12,800 multiply-adds
    assert rl.dense_flops(tiny, 10, layers=1) == 2 * 10 * per_token
    assert rl.dense_flops(tiny, 10) == 2 * 10 * per_token * 2
    assert rl.dense_flops(tiny, 10, layers=[1]) == 2 * 10 * per_token
    assert rl.dense_flops(tiny, 10, layers=0) == 0
    # the brief's GQA formula, at the 30B's widths
    D, H, Hkv, hd, E = (QWEN.d_model, QWEN.n_head, QWEN.n_kv_head, QWEN.head_dim,
                        QWEN.n_expert)
    assert rl.dense_flops(QWEN, 4096) == 2 * 4096 * (D * (H * hd + 2 * Hkv * hd) + H * hd * D
                                                     + D * E) * QWEN.n_layer


def test_dense_flops_count_shared_experts_and_dense_lead_layers():
    """A leading dense layer has its FFN (3·D·d_ff) and no router or routed experts; a MoE
    layer's S shared experts are one FFN of width S·F beside the router."""
    tiny = get_preset("tiny")
    fam = tiny.with_(n_layer=3, dense=DenseFfn(1, 48, 2))
    attn = 64 * 64 + 2 * 64 * 32 + 64 * 64
    lead = attn + 3 * 64 * 48
    moe = attn + 64 * 8 + 3 * 64 * (2 * 32)
    assert rl.dense_flops(fam, 5, layers=[0]) == 2 * 5 * lead
    assert rl.dense_flops(fam, 5, layers=1) == 2 * 5 * moe
    assert rl.dense_flops(fam, 5) == 2 * 5 * (lead + 2 * moe)
    # the routed experts count only the two MoE layers
    assert rl.expert_flops(fam, 5) == rl.expert_flops(fam, 5, layers=2)


def test_dense_flops_of_mla():
    """MLA (DeepSeek-V3's widths): q through q_lora, the latent and rope key, the chunk's own
    tokens' decompression once, o over the value heads; the router and one shared expert."""
    ds = get_preset("deepseek-v3")
    D, H, hd, Lq, Lkv, R, Hv = 7168, 128, 192, 1536, 512, 64, 128
    attn = D * Lq + Lq * H * hd + D * (Lkv + R) + Lkv * H * (hd - R + Hv) + H * Hv * D
    moe = attn + D * 256 + 3 * D * 2048
    lead = attn + 3 * D * 18432
    assert rl.dense_flops(ds, 7, layers=1) == 2 * 7 * moe
    assert rl.dense_flops(ds, 7) == 2 * 7 * (3 * lead + 58 * moe)


def test_dense_term_adds_its_seconds_to_the_floor():
    """dense=rate adds exactly dense FLOPs / rate; a NaN (unmeasured) dense rate adds 0."""
    T, P, g, a, d = 2048, 1024, 400e12, 300e12, 600e12
    base = rl.compute_floor(QWEN, P, T, g, a)
    assert rl.compute_floor(QWEN, P, T, g, a, dense=d) == pytest.approx(
        base + rl.dense_flops(QWEN, T) / d)
    assert rl.compute_floor(QWEN, P, T, g, a, dense=float("nan")) == base
    assert rl.compute_floor(QWEN, P, T, g, dense=d) == pytest.approx(
        rl.compute_floor(QWEN, P, T, g) + rl.dense_flops(QWEN, T) / d)
    cs = chunks((0, T, 0), (T, T, 0))
    rates = rl.Rates(QWEN, gemm={T: g}, attn={T: a}, dense={T: d})
    want = sum(rl.compute_floor(QWEN, c.start, T, g, a, dense=d) for c in cs)
    assert rl.roofline(cs, QWEN, 1e30, rates, attention=True, dense=True) == pytest.approx(want)
    assert rl.roofline(cs, QWEN, 1e30, rates, attention=True) == pytest.approx(
        want - 2 * rl.dense_flops(QWEN, T) / d)


def test_dense_rate_is_nan_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("measures on the GPU (test_measured_rates_on_the_gpu)")
    assert math.isnan(rl.dense_rate(QWEN, 256))


def test_unmeasured_rates_bound_nothing():
    """Without CUDA the GEMM and attention rates are NaN: the bound is the copies alone."""
    nan = float("nan")
    rates = rl.Rates(QWEN, gemm={256: nan}, attn={256: nan})
    assert rl.compute_floor(QWEN, 0, 256, nan, nan) == 0.0
    assert rl.roofline(chunks((0, 256, 5e9)), QWEN, 10e9, rates, attention=True) == 0.5


def test_bound_rate_is_the_slowest_known_limit():
    """The bound is the slowest limit; an unmeasured one (None, 0, NaN) bounds nothing."""
    assert rl.bound_rate(6800.0, 18000.0) == 6800.0
    assert rl.bound_rate(25000.0, 10300.0) == 10300.0
    assert rl.bound_rate(None, 4000.0) == rl.bound_rate(0.0, 4000.0) == 4000.0
    assert rl.bound_rate(float("nan"), 5.0) == 5.0
    assert rl.bound_rate(None, 0.0) is None and rl.bound_rate() is None


def test_rates_measure_each_chunk_size_once():
    calls = []
    rates = rl.Rates(QWEN, measure_gemm=lambda s, T: calls.append(T) or 1e12 * T,
                     measure_attn=lambda s, T: 2.0)
    cs = chunks((0, 256, 0), (256, 256, 0), (512, 128, 0))
    rl.roofline(cs, QWEN, 1e9, rates)
    rl.roofline(cs, QWEN, 1e9, rates)
    assert calls == [256, 128]
    assert rates.gemm_tflops() == {256: 256.0, 128: 128.0}
    dense = []
    rates = rl.Rates(QWEN, gemm={256: 1e12}, measure_dense=lambda s, T: dense.append(T) or 5e12)
    rl.roofline(cs[:2], QWEN, 1e9, rates)
    assert dense == []                       # the plain roofline never asks for it
    rl.roofline(cs[:2], QWEN, 1e9, rates, dense=True)
    rl.roofline(cs[:2], QWEN, 1e9, rates, dense=True)
    assert dense == [256]


prompt = st.lists(st.tuples(st.integers(1, 32768), st.integers(0, 10**11)), min_size=1,
                  max_size=6)


@given(prompt, st.floats(1e9, 1e11), st.floats(1e12, 1e15), st.floats(1e12, 1e15))
@example([(1, 0)], 1e9, 1e12, 1e12)            # one token, nothing streamed: compute alone
@example([(32768, 10**11)], 1e9, 1e15, 1e15)   # everything streamed at the slowest link
def test_roofline_lies_between_its_two_sides(spec, h2d, gemm, attn):
    """Per chunk max(copy, compute): the prompt's roofline is at least each side's sum and at
    most their total; adding attention never lowers it."""
    cs, P = [], 0
    for T, b in spec:
        cs.append(SimpleNamespace(start=P, tokens=T, bytes_streamed=b, layers=None))
        P += T
    rates = rl.Rates(QWEN, gemm={c.tokens: gemm for c in cs}, attn={c.tokens: attn for c in cs})
    copy = sum(rl.pcie_bound(c.bytes_streamed, h2d) for c in cs)
    comp = sum(rl.compute_floor(QWEN, c.start, c.tokens, gemm) for c in cs)
    got = rl.roofline(cs, QWEN, h2d, rates)
    assert max(copy, comp) <= got * (1 + 1e-12)
    assert got <= (copy + comp) * (1 + 1e-12)
    assert rl.roofline(cs, QWEN, h2d, rates, attention=True) >= got
    rates_d = rl.Rates(QWEN, gemm={c.tokens: gemm for c in cs}, attn={c.tokens: attn for c in cs},
                       dense={c.tokens: gemm for c in cs})
    assert rl.roofline(cs, QWEN, h2d, rates_d, attention=True, dense=True) >= \
        rl.roofline(cs, QWEN, h2d, rates, attention=True)
    # one GPU named by its layers reads the same as its bare rate
    for c in cs:
        c.layers = (0, 1)
    assert rl.roofline(cs, QWEN, {(0, 1): h2d}, rates) == pytest.approx(got)


def test_h2d_rate_on_this_machine():
    """The copy loop runs on any device (on the CPU: a host copy) and reports bytes/s."""
    layers = [torch.randint(0, 255, (3, 4096), dtype=torch.uint8) for _ in range(2)]
    host = SimpleNamespace(layers=layers, n_layer=2, blob=lambda l, e: layers[l][e])
    r = rl.h2d_rate(host, n=8, device="cpu")
    assert r > 0 and math.isfinite(r)


def test_h2d_rate_is_the_best_round(monkeypatch):
    """The bound's copy rate is the best of its rounds: a round slowed by something else on the
    machine does not lower it (each round times all n copies once)."""
    layers = [torch.randint(0, 255, (3, 1000), dtype=torch.uint8) for _ in range(2)]
    host = SimpleNamespace(layers=layers, n_layer=2, blob=lambda l, e: layers[l][e])
    ticks = iter([0.0, 2.0, 10.0, 11.0, 20.0, 24.0])       # rounds of 2 s, 1 s and 4 s
    monkeypatch.setattr(rl, "time", SimpleNamespace(perf_counter=lambda: next(ticks)))
    assert rl.h2d_rate(host, n=8, device="cpu", rounds=3) == 8 * 1000 / 1.0
    with pytest.raises(StopIteration):
        next(ticks)                                       # three rounds, two stamps each


class _Blocks(SimpleNamespace):
    """A host holding each layer as one [E, size] block: HostExperts' blob and run."""
    def blob(self, l, e):
        return self.layers[l][e]

    def run(self, l, e, k):
        return self.layers[l][e:e + k].view(-1)


def test_h2d_rate_takes_the_faster_pattern(monkeypatch):
    """Blob by blob and as runs, each round: the best rate of either wins, each pattern's own
    bytes over its own time (the runs' bytes are at least the blobs', never fewer)."""
    layers = [torch.randint(0, 255, (8, 1000), dtype=torch.uint8) for _ in range(2)]
    host = _Blocks(layers=layers, n_layer=2)
    runs = rl._runs(host, [0, 1], 8, 8 * 1000)
    nb = sum(r.numel() for r in runs)
    # round 1: blobs 4 s, runs 2 s; round 2: blobs 2 s, runs 1 s (the best)
    ticks = iter([0.0, 4.0, 10.0, 12.0, 20.0, 22.0, 30.0, 31.0])
    monkeypatch.setattr(rl, "time", SimpleNamespace(perf_counter=lambda: next(ticks)))
    assert rl.h2d_rate(host, n=8, device="cpu", rounds=2) == nb / 1.0


@given(st.integers(1, 40), st.integers(1, 3000), st.integers(1, 12), st.integers(1, 50_000))
@example(E=1, size=5, n_held=1, nbytes=1)            # one expert: runs of one blob
@example(E=4, size=3000, n_held=2, nbytes=50_000)    # blobs past the run's bytes: one a copy
def test_runs_are_consecutive_experts_of_one_layer(E, size, n_held, nbytes):
    """Each run is one layer's consecutive experts inside [0, E), at most its run_bytes (or one
    blob, when a blob is larger), the layers in turn; together at least `nbytes`, and not a
    run more than it takes."""
    layers = [torch.arange(E * size, dtype=torch.int64).view(E, size) + l * E * size
              for l in range(n_held)]
    host = _Blocks(layers=layers, n_layer=n_held)
    got = rl._runs(host, list(range(n_held)), E, nbytes, run_bytes=4096)
    total = sum(r.numel() for r in got)
    assert total >= nbytes and total - got[-1].numel() < nbytes
    for i, r in enumerate(got):
        layer = i % n_held
        first = int(r[0]) - layer * E * size
        assert first % size == 0 and 0 <= first // size and first + r.numel() <= E * size
        assert torch.equal(r, torch.arange(r.numel()) + int(r[0]))      # consecutive experts
        assert r.numel() <= max(size, 4096) and r.numel() % size == 0


def test_runs_need_a_host_that_hands_runs():
    """No HostExperts.run, or a layer it cannot hand as one view: no run pattern (None)."""
    layers = [torch.zeros(4, 8, dtype=torch.uint8)]
    assert rl._runs(SimpleNamespace(layers=layers, blob=lambda l, e: layers[l][e]),
                    [0], 4, 8) is None
    broken = _Blocks(layers=layers, n_layer=1)
    broken.run = lambda l, e, k: None
    assert rl._runs(broken, [0], 4, 8) is None


def _probe_bytes(e, M, D, F):
    """What gemm_rate's probe holds at e experts and M rows, counted here apart: bf16 weights
    (gate/up [D, 2F], down [F, D]), x [M, D], h [M, F], and the two products [M, 2F], [M, D]."""
    return 2 * (e * D * 2 * F + e * F * D + M * D + M * F + M * 2 * F + M * D)


@given(st.integers(1, 300), st.integers(1, 8), st.sampled_from([64, 2048, 7168]),
       st.sampled_from([32, 768, 2048]), st.integers(1, 140_000), st.floats(1e6, 8e10))
@example(256, 8, 7168, 2048, 32768, 0.5 * 18e9)    # DeepSeek-V3 at 32K beside a 24 GiB cache
def test_the_gemm_probe_fits_its_cap_at_the_rows_an_expert(E, K, D, F, T, cap):
    """probe_experts keeps the rows an expert (T·K / E, rounded up) and takes the most experts
    whose operands fit the cap, all E where they fit, one where none does."""
    e, M = rl.probe_experts(E, K, D, F, T, cap)
    assert 1 <= e <= E and M == -(-T * K * e // E)
    assert e == 1 or _probe_bytes(e, M, D, F) <= cap
    if e < E:
        assert _probe_bytes(e + 1, -(-T * K * (e + 1) // E), D, F) > cap


def test_deepseek_at_32k_is_timed_on_a_part_of_its_experts():
    """DeepSeek-V3's 256 experts at 32K need ~31 GiB: under half of a 24 GiB card's spare ~5
    GiB the probe times 20 at the same 1,024 rows each (124 MiB an expert with its rows)."""
    e, M = rl.probe_experts(256, 8, 7168, 2048, 32768, 2.5 * 2 ** 30)
    assert _probe_bytes(256, 32768 * 8, 7168, 2048) > 30 * 2 ** 30
    assert e == 20 and M == 1024 * e


@pytest.mark.gpu
def test_measured_rates_on_the_gpu():
    """On an H200 the grouped GEMM and flash attention run at tens to hundreds of TFLOP/s.
    Unsettled and 3 repeats: the ranges hold at burst clocks too (the settling, a second a rate,
    is floor_rates_bench's subject, not this test's)."""
    kw = dict(reps=3, settle_s=0.0)
    g, a, d = (f(QWEN, 2048, **kw) for f in (rl.gemm_rate, rl.sdpa_rate, rl.dense_rate))
    assert 1e12 < g < 2e15 and 1e12 < a < 2e15 and 1e12 < d < 2e15
    lin = rl.delta_rate(get_preset("qwen3.5-35b-a3b"), 2048, **kw)     # the launch in force
    assert 1e11 < lin < 2e15


# -- each architecture's own work (strata.bench.flops) -------------------------------------------
def _pairs_by_loop(P, T, W):
    return sum(min(P + i + 1, W) if W > 0 else P + i + 1 for i in range(T))


@given(st.integers(0, 400), st.integers(0, 300), st.integers(0, 200))
@example(0, 0, 0)
@example(3, 5, 4)            # the chunk straddles the window: queries see 4, 4, 4, 4, 4... capped
@example(0, 10, 4)           # the first W queries see fewer than W keys
def test_window_pairs_closed_form_is_the_loop_over_queries(P, T, W):
    """attention_pairs' closed form, exact, against a plain loop over the chunk's queries."""
    assert fl.attention_pairs(P, T, W) == _pairs_by_loop(P, T, W)


def test_gpt_oss_sliding_and_full_layers_by_hand():
    """tiny-gpt-oss: 2 layers, layer 0 sliding (window 4), layer 1 full; 4·H·hd = 256 FLOPs a
    pair (H 4, hd 16)."""
    s = get_preset("tiny-gpt-oss")
    assert (s.layer_window(0), s.layer_window(1)) == (4, 0)
    # P = 0, T = 3 < W: both layers see 1 + 2 + 3 keys
    assert rl.attention_flops(s, 0, 3) == 256 * (6 + 6)
    # P = 10 > W: the sliding layer 4 keys a query, the full one 11 + 12 + 13
    assert rl.attention_flops(s, 10, 3) == 256 * (3 * 4 + 36)
    # P = 2, T = 4 straddles the window: keys 3, 4, 5, 6 capped at 4 -> 3 + 4 + 4 + 4
    assert rl.attention_flops(s, 2, 4) == 256 * (15 + 18)
    assert rl.attention_flops(s, 2, 4, layers=[0]) == 256 * 15
    # an int counts layers like the first full-attention one (a timed full call's rate)
    assert rl.attention_flops(s, 2, 4, layers=1) == 256 * 18
    assert rl.attention_flops(s, 2, 4, layers=3) == 3 * 256 * 18


def test_mla_pairs_by_hand():
    """tiny-deepseek2 (H 4, hd 40 = 32 + 8 rope, v_head_dim 16): 2·4·40 for QKᵀ + 2·4·16 for
    PV = 448 FLOPs a pair, every one of its 3 layers."""
    s = get_preset("tiny-deepseek2")
    assert fl.pair_flops(s, 0) == 2 * 4 * 40 + 2 * 4 * 16 == 448
    assert rl.attention_flops(s, 5, 2) == 3 * 448 * (6 + 7)
    assert rl.attention_flops(s, 5, 2, layers=1) == 448 * 13


TINY_DELTA_PER_TOKEN = 4 * (6 * 16 * 16 + 2 * 64 * (3 * 16 + 2 * 16 + 62))   # 78,848


def test_hybrid_by_hand():
    """tiny-qwen3next: layers 0-2 Gated DeltaNet (Hk 2, Hv 4, dk = dv = 16), layer 3 gated full
    attention (H 4, Hkv 2, hd 16), a shared expert behind its gate in every layer."""
    s = get_preset("tiny-qwen3next")
    # softmax attention only in layer 3: 4·4·16 a pair, 1 + .. + 8 pairs
    assert rl.attention_flops(s, 0, 8) == 256 * 36
    assert rl.attention_flops(s, 0, 8, layers=[0, 1, 2]) == 0
    assert rl.attention_flops(s, 0, 8, layers=1) == 256 * 36
    # the delta rule per value head per chunk of 64: A, w, q kᵀ 3·2·64²·16, u and ·v_new
    # 2·2·64²·16, the inverse 2·64²·62, v_new, q S and the state update 3·2·64·16·16
    per_chunk = 3 * 2 * 64 * 64 * 16 + 2 * 2 * 64 * 64 * 16 + 2 * 64 * 64 * 62 + 3 * 2 * 64 * 256
    assert per_chunk == 1_261_568 and 4 * per_chunk // 64 == TINY_DELTA_PER_TOKEN == 78_848
    assert rl.linear_flops(s, 10) == 3 * 10 * 78_848
    assert rl.linear_flops(s, 10, layers=[2, 3]) == 10 * 78_848
    assert rl.linear_flops(s, 10, layers=2) == 2 * 10 * 78_848
    assert rl.linear_flops(QWEN, 10) == 0
    # a linear layer: qkv 64 -> 2·2·16 + 4·16, z 64 -> 64, b and a 64 -> 4, out 64 -> 64;
    # the gated full layer: q 64 -> 2·64, k and v 64 -> 32, o 64 -> 64; then the router
    # 64 -> 8, the shared expert 3·64·32 and its gate 64 -> 1
    moe = 64 * 8 + 3 * 64 * 32 + 64
    linear = 64 * 128 + 64 * 64 + 2 * 64 * 4 + 64 * 64 + moe
    full = 64 * 128 + 2 * 64 * 32 + 64 * 64 + moe
    assert rl.dense_flops(s, 5, layers=[0]) == 2 * 5 * linear
    assert rl.dense_flops(s, 5, layers=[3]) == 2 * 5 * full
    assert rl.dense_flops(s, 5) == 2 * 5 * (3 * linear + full)
    assert rl.dense_kinds(s) == [(0, 3), (3, 1)]


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_dense_gemms_are_the_tensors_the_wiring_multiplies(name):
    """Every layer's dense_gemms are its 2-D weights as the architecture lists them
    (layer_specs: [out, in]), the DeltaNet conv aside (a short conv, not a GEMM) and
    Qwen3-Next's fused ssm_ba [2 Hv, D] read as b and a [Hv, D] each."""
    from strata.archs.registry import get_arch
    s = get_preset(name)
    arch = get_arch(s.arch)
    for l in range(s.n_layer):
        want = []
        for key, shp in arch.layer_specs(s, l).items():
            if len(shp) != 2 or key.endswith("ssm_conv1d.weight"):
                continue
            n = 2 if key.endswith("ssm_ba.weight") else 1
            want += [(shp[1], shp[0] // n)] * n
        assert sorted(rl.dense_gemms(s, l)) == sorted(want), (name, l)


def test_presets_per_layer_sums_by_hand():
    T, P = 8192, 0
    gpt = get_preset("gpt-oss-120b")        # 36 layers, 18 sliding (128), H 64, hd 64
    full = T * (T + 1) // 2                 # 33,558,528 pairs
    window = 128 * 129 // 2 + (T - 128) * 128
    assert rl.attention_flops(gpt, P, T) == 18 * 4 * 64 * 64 * (full + window)
    # P past the window: a sliding layer's every query sees 128 keys
    assert rl.attention_flops(gpt, 4 * T, T, layers=[0]) == 4 * 64 * 64 * T * 128
    ds = get_preset("deepseek-v3")          # 61 MLA layers, H 128, hd 192, v 128
    assert rl.attention_flops(ds, P, T) == 61 * 2 * 128 * (192 + 128) * full
    nxt = get_preset("qwen3-next-80b-a3b")  # 12 full (H 16, hd 256), 36 DeltaNet (Hv 32, 128)
    assert rl.attention_flops(nxt, P, T) == 12 * 4 * 16 * 256 * full
    per_token = 32 * (6 * 128 * 128 + 2 * 64 * (3 * 128 + 2 * 128 + 62))
    assert per_token == 6_021_120
    assert rl.linear_flops(nxt, T) == 36 * T * per_token
    assert rl.dense_kinds(ds) == [(0, 3), (3, 58)]


def test_gqa_counts_are_full_causal_attention():
    """Qwen3 (no window, no MLA, no linear layers): 4·H·hd per pair over every layer."""
    for P, T in ((0, 1), (0, 4096), (12345, 777)):
        assert rl.attention_flops(QWEN, P, T) == (4 * QWEN.n_head * QWEN.head_dim
                                                  * (T * P + T * (T + 1) // 2) * QWEN.n_layer)


@pytest.mark.parametrize("name", ["qwen3-30b-a3b", "gpt-oss-120b", "deepseek-v3",
                                  "qwen3-next-80b-a3b", "glm-4.5-air", "minimax-m2"])
def test_compute_floor_is_the_sum_of_its_parts(name):
    s, nan = get_preset(name), float("nan")
    for P, T in ((0, 8192), (32768, 4096)):
        for attn, dense in ((300e12, 500e12), (None, 500e12), (300e12, None), (nan, nan)):
            for linear in (None, 200e12, nan):
                parts = rl.floor_parts(s, P, T, 400e12, attn, dense=dense, linear=linear)
                assert tuple(parts) == rl.FLOOR_PARTS
                assert rl.compute_floor(s, P, T, 400e12, attn, dense=dense,
                                        linear=linear) == sum(parts.values())
    parts = rl.floor_parts(s, 0, 64, 1.0, 2.0, dense=3.0, linear=4.0)
    # a Rates brings its four rates at T: the full floor
    assert rl.floor_parts(s, 0, 64, rl.Rates(s, gemm={64: 1.0}, attn={64: 2.0},
                                              dense={64: 3.0}, linear={64: 4.0})) == parts
    with pytest.raises(TypeError, match="pass no attn, dense or linear"):
        rl.floor_parts(s, 0, 64, rl.Rates(s), 2.0)
    assert parts == {"experts": rl.expert_flops(s, 64),
                     "attention": rl.attention_flops(s, 0, 64) / 2,
                     "linear": rl.linear_flops(s, 64) / 4, "dense": rl.dense_flops(s, 64) / 3}
    # no linear rate given: the delta rule at the dense rate (the stricter price)
    assert rl.floor_parts(s, 0, 64, 1.0, 2.0, dense=3.0)["linear"] == rl.linear_flops(s, 64) / 3


def test_the_delta_rule_is_priced_at_its_own_rate():
    """A hybrid's linear part is its delta-rule FLOPs at the rate measured for the rule (once
    per T, by the measure given), not the dense rate; a shape without linear layers measures
    nothing; linear_at_dense prices the same FLOPs at the dense rate, beside the floor."""
    nxt, calls = get_preset("qwen3-next-80b-a3b"), []

    def measure(shape, T):
        calls.append(T)
        return 50e12
    rates = rl.Rates(nxt, gemm={4096: 400e12}, attn={4096: 300e12}, dense={4096: 600e12},
                     measure_linear=measure)
    parts = rl.floor_parts(nxt, 0, 4096, rates)
    assert parts["linear"] == rl.linear_flops(nxt, 4096) / 50e12 > 0
    rl.floor_parts(nxt, 0, 4096, rates)
    assert calls == [4096]                                   # measured once, then kept
    assert rates.tflops()["linear"] == {4096: 50.0}
    chunks = [SimpleNamespace(start=0, tokens=4096, bytes_streamed=0, layers=[0])]
    assert rl.linear_at_dense(chunks, nxt, rates) == rl.linear_flops(nxt, 4096) / 600e12
    q = rl.Rates(QWEN, measure_linear=lambda *a: pytest.fail("QWEN has no linear layer"))
    assert math.isnan(q.linear(4096)) and "linear" not in q.tflops()
    assert rl.linear_at_dense(chunks, QWEN, q) is None
    assert math.isnan(rl.delta_rate(QWEN, 64))


def test_prompt_floor_parts_sum_to_the_roofline_floor():
    """floor_parts_of sums each chunk's parts once (two GPUs' records of a chunk: once); with
    nothing streamed their sum is the roofline."""
    s = get_preset("qwen3-next-80b-a3b")
    T = 2048
    rates = rl.Rates(s, gemm={T: 400e12}, attn={T: 300e12}, dense={T: 500e12},
                     linear={T: 90e12})
    cs = chunks((0, T, 0, (0, 1)), (0, T, 0, (2, 3)), (T, T, 0, (0, 1)), (T, T, 0, (2, 3)))
    parts = rl.floor_parts_of(cs, s, rates)
    want = {k: rl.floor_parts(s, 0, T, 400e12, 300e12, dense=500e12, linear=90e12)[k]
            + rl.floor_parts(s, T, T, 400e12, 300e12, dense=500e12, linear=90e12)[k]
            for k in rl.FLOOR_PARTS}
    assert parts == pytest.approx(want)
    assert sum(parts.values()) == pytest.approx(
        rl.roofline(cs, s, {(0, 1): math.inf, (2, 3): math.inf}, rates, attention=True,
                    dense=True))
    assert rl.floor_parts_of(cs, s, rates, attention=False, dense=False) == pytest.approx(
        dict(want, attention=0.0, linear=0.0, dense=0.0))
