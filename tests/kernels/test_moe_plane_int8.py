"""The int8 expert GEMM over plane-layout Q8_0 / Q4_0 / Q4_K experts
(strata.kernels.moe.plane_int8)
against the ggml-layout int8 GEMM (strata.kernels.moe.int8) and its twins on the same experts and
tokens, on fresh random data; outputs poisoned (NaN scales, -128 codes) first.

Everything is exact (torch.equal): a plane matrix holds ggml's codes permuted inside each
block (Q4_0's unpacked in registers as q - 8, Q4_K's as q with its sub-block scale and minimum)
and the activations' codes come in the same order, so each block's integer dot, and
every fp32 step after it, is int8.py's. The one gap int8.py's tests allow (act's exp: numpy's in
the interpreter, torch's in the twin, a few ulps of h: ACT_REL) holds here against the twin, and
the plane kernel's h is the ggml-layout kernel's bit for bit (the same exp).
"""
from __future__ import annotations

import functools

import pytest
import torch

from strata.errors import StrataError
from strata.kernels.moe.combine import combine_rows_torch
from strata.kernels.moe.grouping import group_blocked, topk_route
from strata.kernels.moe.int8 import (Int8Tile, int8_down_torch, int8_gate_up, int8_gate_up_q8,
                                     moe_ffn_int8, moe_ffn_int8_torch)
from strata.kernels.moe.plane_int8 import (moe_ffn_plane_int8, moe_ffn_plane_int8_torch,
                                           plane_int8_down, plane_int8_down_torch,
                                           plane_int8_gate_up, plane_int8_gate_up_q8,
                                           plane_int8_gate_up_q8_torch, plane_int8_gate_up_torch,
                                           scale_words)
from strata.kernels.moe.q8 import Q8Rows, quantize_q8_1, quantize_q8_1_torch
from strata.kernels.moe.random_experts import random_expert_set
from strata.planes import PLANE_FORMATS, Q4_ORDER, act_order, to_plane_set
from tests.kernels.test_moe_int8 import ACT_ABS, ACT_REL, Case, _bits, _gen, _inputs, _same_q8

TILE = Int8Tile(BLOCK_M=16, BLOCK_N=64)   # BLOCK_N past F 32 and not dividing D 160 or F 96
# Q8_0 for gate, up and down: several experts, padded rows (T < BLOCK_M, one expert with two
# blocks), skipped assignments, biases with swiglu_oai, and D 160 / F 96 (5 and 3 blocks: steps
# of kb 2 and 4 leave blocks over, and the last column tile is part masked), and D 256 / F 128
# (whole steps of kb 2 and 4 in both passes: the scales loaded as words, scale_words)
CASES = [
    Case("p8-T3-lt-tile", T=3, E=4, K=2),
    Case("p8-all-on-one", T=20, E=4, K=1, route="one"),
    Case("p8-skip-E7", T=11, E=7, K=2, route="skip"),
    Case("p8-bias-swiglu-oai", T=6, E=4, K=2, bias=True, act="swiglu_oai"),
    Case("p8-ragged-160-96", T=7, E=3, K=2, D=160, F=96),
    Case("p8-words-256-128", T=9, E=3, K=2, D=256, F=128),   # kb 2 and 4 load scale words
    # Q4_0 on all three, and mixed with Q8_0 by pass (xq in gate/up's order, hq in down's)
    Case("p4-ragged-160-96", T=7, E=3, K=2, D=160, F=96, fmts=("Q4_0",)),
    Case("p4-words-skip-256-128", T=9, E=3, K=2, D=256, F=128, fmts=("Q4_0",), route="skip"),
    Case("p4-q8-down-bias-swiglu-oai", T=6, E=4, K=2, fmts=("Q4_0", "Q4_0", "Q8_0"), bias=True,
         act="swiglu_oai"),
    Case("p8-q4-down-T3", T=3, E=4, K=2, D=96, F=160, fmts=("Q8_0", "Q8_0", "Q4_0")),
    # Q4_K (256-weight super-blocks: its inputs multiples of 256) on all three, its 12 scale
    # bytes random (every sc and m, _random_k_scales); and mixed by pass: Q4_K gate/up with a
    # Q8_0 down over F 96 (gate/up's last column tile part masked, down's kb 2 and 4 leave
    # blocks over), a Q4_0 gate/up over D 160 with a Q4_K down (its last column tile masked)
    Case("pk-words-skip-256-256", T=9, E=3, K=2, D=256, F=256, fmts=("Q4_K",), route="skip"),
    Case("pk-q8-down-T3-256-96", T=3, E=4, K=2, D=256, F=96, fmts=("Q4_K", "Q4_K", "Q8_0")),
    Case("p4-qk-down-bias-swiglu-oai-160-256", T=6, E=3, K=2, D=160, F=256,
         fmts=("Q4_0", "Q4_0", "Q4_K"), bias=True, act="swiglu_oai"),
    # Q4_K_M's mix: a Q6_K down stays in ggml's layout (int8.py's kernel, hq in weight order)
    Case("pk-q6k-down-T3-256-256", T=3, E=4, K=2, D=256, F=256, fmts=("Q4_K", "Q4_K", "Q6_K")),
]
K_CASES = {"pk-words-skip-256-256"}   # their Q4_K scale bytes drawn at random


def _random_k_scales(experts, seed: int):
    """Every Q4_K block's 12 packed sc / m bytes (bytes 4-15, between the fp16 d and dmin and
    the codes) drawn at random, in place: each 6-bit sc and m, and so every bit of the plane's
    re-pack, is taken, where a quantizer's scales cluster."""
    gen = torch.Generator().manual_seed(seed)
    lay = experts.layout
    for off in experts.slot_offset.tolist():
        for m in lay.matrices:
            if off >= 0 and m.fmt.name == "Q4_K":
                blk = experts.arena[off + m.offset: off + m.offset + m.nbytes].view(-1, 144)
                blk[:, 4:16] = torch.randint(0, 256, (blk.shape[0], 12), generator=gen,
                                             dtype=torch.uint8)


def _case_inputs(c: Case):
    """_inputs(c), with _random_k_scales for the K_CASES."""
    experts, x, ids, w, grp = _inputs(c)
    if c.id in K_CASES:
        _random_k_scales(experts, len(c.id))
    return experts, x, ids, w, grp


def _poisoned(rows: int, n: int) -> Q8Rows:
    return Q8Rows(torch.full((rows, n), -128, dtype=torch.int8),
                  torch.full((rows, n // 32), float("nan")).half(),
                  torch.full((rows, n // 32), float("nan")).half())


def _ordered(a: Q8Rows, fmt="Q8_0") -> Q8Rows:
    return Q8Rows(act_order(a.q, fmt), a.d, a.s) if fmt else a


def _orders(c: Case):
    """The plane orders of xq (gate/up's format) and hq (down's; False, weight order, for a
    down kept in ggml's layout)."""
    return c.fmts[0], c.fmts[-1] if c.fmts[-1] in PLANE_FORMATS else False


@pytest.mark.parametrize("order", [True, "Q8_0", "Q4_0", "Q4_K"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_q8_1_in_plane_order_is_the_plain_codes_permuted(dtype, order):
    gen, _ = _gen(f"q8-order-{dtype}-{order}")
    x = (torch.randn(21, 96, generator=gen) * 4).to(dtype)
    plain = quantize_q8_1_torch(x)
    got = quantize_q8_1(x, out=_poisoned(21, 96), order=order)
    assert _same_q8(got, quantize_q8_1_torch(x, order=order))
    assert _same_q8(got, _ordered(plain, "Q8_0" if order is True else order))
    assert not torch.equal(got.q, plain.q)
    with pytest.raises(StrataError, match="plane order of Q8_0, Q4_0 or Q4_K .* got 'Q6_K'"):
        quantize_q8_1(x, order="Q6_K")


def test_q4_activation_order_is_the_order_a_q4_0_block_unpacks_in():
    """Place 16t + j of a 32-block holds weight 2 Q4_ORDER[j] + t: the nibble t of the plane's
    code byte j (the weight pair Q4_ORDER[j], low nibble the even weight)."""
    w = torch.arange(64)
    got = act_order(w, "Q4_0")
    want = [32 * g + 2 * Q4_ORDER[j] + t for g in range(2) for t in range(2) for j in range(16)]
    assert got.tolist() == want
    assert torch.equal(act_order(got, "Q4_0", back=True), w)
    assert torch.equal(act_order(w, "Q4_K"), got)   # Q4_K's codes unpack in the same places


@functools.cache
def _ggml_layout(c: Case) -> tuple:
    """int8.py's gate/up kernels at TILE on the case's inputs -> (h, hq): what every kb's plane
    stages equal, the same for each kb (run once per case: the interpreter is the suite's
    slowest part)."""
    experts, x, ids, w, grp = _case_inputs(c)
    xq = quantize_q8_1(x)
    return int8_gate_up(xq, grp, experts, c.K, TILE), int8_gate_up_q8(xq, grp, experts, c.K, TILE)


# kb 1, 2 and 4 for every case; 8 (a step the whole Q4_K super-block) where a matrix is Q4_K
STAGES = [(c, kb) for c in CASES for kb in (1, 2, 4)] + \
    [(c, 8) for c in CASES if "Q4_K" in c.fmts]


@pytest.mark.parametrize("c,kb", STAGES, ids=[f"{c.id}-kb{kb}" for c, kb in STAGES])
def test_plane_int8_stages_are_the_ggml_layout_int8_bits(c: Case, kb: int):
    experts, x, ids, w, grp = _case_inputs(c)
    planes = to_plane_set(experts)
    tile = Int8Tile(TILE.BLOCK_M, TILE.BLOCK_N, kb=kb)
    xo_fmt, ho_fmt = _orders(c)
    xo = quantize_q8_1(x, order=xo_fmt)
    ggml_h, ggml_hq = _ggml_layout(c)
    # gate/up, fp32 h: the ggml-layout kernel's bits; its twin's within act's exp
    h = plane_int8_gate_up(xo, grp, planes, c.K, tile)
    assert not h.isnan().any()
    assert torch.equal(_bits(h), _bits(ggml_h))
    h_ref = plane_int8_gate_up_torch(xo, grp, planes, c.K, tile)
    assert ((h - h_ref).abs() <= ACT_REL * h_ref.abs() + ACT_ABS).all()
    # h quantized in the epilogue, codes in down's order, into poisoned rows
    hq = plane_int8_gate_up_q8(xo, grp, planes, c.K, tile, out=_poisoned(h.shape[0], c.F))
    assert _same_q8(hq, quantize_q8_1(h, order=ho_fmt))
    assert _same_q8(hq, _ordered(ggml_hq, ho_fmt))
    assert _same_q8(plane_int8_gate_up_q8_torch(xo, grp, planes, c.K, tile),
                    quantize_q8_1_torch(h_ref, order=ho_fmt))
    if c.id in ("p8-words-256-128", "p4-words-skip-256-128") and kb > 1:
        assert scale_words(kb, c.D, xo.d) and scale_words(kb, c.F, hq.d)
    elif c.id == "pk-words-skip-256-256" and kb in (2, 4):
        assert scale_words(kb, c.D, xo.d, xo.s) and scale_words(kb, c.F, hq.d, hq.s)
    elif c.id in ("p8-ragged-160-96", "p4-ragged-160-96") and kb == 4:
        assert not scale_words(kb, c.D, xo.d) and not scale_words(kb, c.F, hq.d)
    # down, into rows poisoned NaN: int8.py's twin bit for bit; skipped rows stay NaN
    hq_ref = quantize_q8_1(h_ref)
    nan = lambda: torch.full((c.T * c.K, c.D), float("nan"))  # noqa: E731
    yk = plane_int8_down(_ordered(hq_ref, ho_fmt), grp, planes, w, tile, yk=nan())
    yk_ref = int8_down_torch(hq_ref, grp, experts, w, tile, yk=nan())
    assert torch.equal(yk.isnan(), yk_ref.isnan())
    assert torch.equal(_bits(torch.nan_to_num(yk)), _bits(torch.nan_to_num(yk_ref)))
    assert not yk[ids.reshape(-1) >= 0].isnan().any()
    assert torch.equal(_bits(torch.nan_to_num(yk)), _bits(torch.nan_to_num(
        plane_int8_down_torch(_ordered(hq_ref, ho_fmt), grp, planes, w, tile, yk=nan()))))


@pytest.mark.parametrize("c", CASES, ids=lambda c: c.id)
def test_moe_ffn_plane_int8_is_moe_ffn_int8(c: Case):
    experts, x, ids, w, grp = _case_inputs(c)
    planes = to_plane_set(experts)
    y = moe_ffn_plane_int8(x, ids, w, planes, tile=TILE)
    assert y.shape == (c.T, c.D) and y.dtype == torch.bfloat16 and not y.isnan().any()
    assert torch.equal(y, moe_ffn_int8(x, ids, w, experts, tile=TILE))
    # the launcher's wiring: int8.py's twin stages fed the kernel's own h
    yk = int8_down_torch(_ggml_layout(c)[1], grp, experts, w, TILE)
    assert torch.equal(y, combine_rows_torch(yk, c.T, c.K, c.D, ids, None,
                                             "mask" if grp.n_skipped else "all"))
    assert torch.equal(moe_ffn_plane_int8_torch(x, ids, w, planes, tile=TILE),
                       moe_ffn_int8_torch(x, ids, w, experts, tile=TILE))


def test_moe_ffn_plane_int8_passes_without_sync_sum_as_one_call():
    """Two passes over halves of the experts, no host sync, the first deferring its rows to
    workspace["yk"], the q8_1 rows in workspace["h"]: the bits of one checked call."""
    from strata.kernels.moe.tiles import padded_rows
    c = Case("p8-passes", T=9, E=4, K=2)
    experts, x, ids, w, _ = _inputs(c)
    planes = to_plane_set(experts)
    y_one = moe_ffn_plane_int8(x, ids, w, planes, tile=TILE, out=torch.zeros(c.T, c.D))
    h = torch.zeros(padded_rows(c.T, c.K, c.E, 64), c.F, dtype=torch.bfloat16)
    ws = {"yk": torch.empty(c.T * c.K + 3, c.D), "h": h}
    y = torch.zeros(c.T, c.D)
    for half, combine in ((0, "defer"), (1, "layer")):
        p_ids = torch.where(ids % 2 == half, ids, -1)
        moe_ffn_plane_int8(x, p_ids, w, planes, tile=TILE, out=y, workspace=ws, check=False,
                           combine=combine)
    assert torch.equal(_bits(y), _bits(y_one))
    assert h.view(torch.int16).ne(0).any()


def test_moe_ffn_plane_int8_refuses_what_it_cannot_read():
    experts = random_expert_set(2, 256, 256, "Q4_K", "Q4_K", "Q5_K")
    x = torch.zeros(2, 256).bfloat16()
    ids, w = topk_route(torch.zeros(2, 2), 1)
    with pytest.raises(StrataError, match="reads a PlaneSet .* got ExpertSet"):
        moe_ffn_plane_int8(x, ids, w, experts, tile=TILE)
    with pytest.raises(StrataError, match=r"reads Q8_0, Q4_0, Q4_K matrices \(down also Q6_K in "
                                          r"ggml's layout\); this layout has down Q5_K"):
        moe_ffn_plane_int8(x, ids, w, to_plane_set(experts), tile=TILE)
    q6 = to_plane_set(random_expert_set(2, 256, 256, "Q6_K", "Q6_K", "Q6_K"))
    with pytest.raises(StrataError, match="this layout has gate Q6_K, up Q6_K"):
        moe_ffn_plane_int8(x, ids, w, q6, tile=TILE)
    mixed = to_plane_set(random_expert_set(2, 64, 32, "Q8_0", "Q4_0", "Q8_0"))
    with pytest.raises(StrataError, match="gate and up of one format; this layout has gate "
                                          "Q8_0, up Q4_0"):
        moe_ffn_plane_int8(x, ids, w, mixed, tile=TILE)


# ---------------------------------------------------------------- on the GPU

GPU_CASES = [Case("gpu-p8", T=300, E=8, K=2, D=512, F=256),   # scale words (kb 4)
             Case("gpu-p8-ragged-bias", T=200, E=8, K=2, D=2880, F=480, bias=True,
                  act="swiglu_oai"),   # D 2880, F 480: kb 4 without words, remainders
             Case("gpu-p4", T=300, E=8, K=2, D=512, F=256, fmts=("Q4_0",)),
             Case("gpu-p4-q8-down-ragged", T=200, E=8, K=2, D=2880, F=480,
                  fmts=("Q4_0", "Q4_0", "Q8_0")),
             Case("gpu-pk", T=300, E=8, K=2, D=512, F=256, fmts=("Q4_K",)),   # scale words
             # D 2816 (11 super-blocks), F 480: a Q8_0 down's kb 4 without words, remainders
             Case("gpu-pk-q8-down-ragged-bias", T=200, E=8, K=2, D=2816, F=480, bias=True,
                  act="swiglu_oai", fmts=("Q4_K", "Q4_K", "Q8_0")),
             Case("gpu-pk-q6k-down", T=300, E=8, K=2, D=512, F=256,
                  fmts=("Q4_K", "Q4_K", "Q6_K"))]   # Q4_K_M's mix


@pytest.mark.gpu
@pytest.mark.parametrize("c", GPU_CASES, ids=lambda c: c.id)
def test_plane_int8_on_the_gpu_is_the_ggml_layout_int8(c: Case):
    """On the device, at the default tiles of both: h and hq the ggml-layout kernel's bits (the
    same device exp), yk the twin's, y moe_ffn_int8's (rows do not depend on the tile)."""
    from strata.blob import ExpertAct
    from strata.kernels.moe.plane_int8 import PLANE_INT8_TILE as tile
    gen, seed = _gen(c.id)
    dev = torch.device("cuda")
    experts = random_expert_set(c.E, c.D, c.F, *c.fmts, seed=seed, bias=c.bias,
                                act=ExpertAct(c.act), device=dev)
    planes = to_plane_set(experts)
    x = torch.randn(c.T, c.D, generator=gen).bfloat16().to(dev)
    ids, w = topk_route(torch.randn(c.T, c.E, generator=gen).to(dev), c.K)
    grp = group_blocked(ids, c.E, tile.BLOCK_M, slot_offset=experts.slot_offset,
                        skip_negative=True)
    xo_fmt, ho_fmt = _orders(c)
    xq, xo = quantize_q8_1(x), quantize_q8_1(x, order=xo_fmt)
    assert _same_q8(xo, quantize_q8_1_torch(x, order=xo_fmt))
    h = plane_int8_gate_up(xo, grp, planes, c.K, tile)
    assert torch.equal(_bits(h), _bits(int8_gate_up(xq, grp, experts, c.K, tile)))
    hq = plane_int8_gate_up_q8(xo, grp, planes, c.K, tile)
    assert _same_q8(hq, quantize_q8_1(h, order=ho_fmt))
    hq_ref = quantize_q8_1(h)
    yk = plane_int8_down(_ordered(hq_ref, ho_fmt), grp, planes, w, tile,
                         yk=torch.full((c.T * c.K, c.D), float("nan"), device=dev))
    assert torch.equal(_bits(yk), _bits(int8_down_torch(hq_ref, grp, experts, w, tile)))
    assert torch.equal(moe_ffn_plane_int8(x, ids, w, planes),
                       moe_ffn_int8(x, ids, w, experts))
