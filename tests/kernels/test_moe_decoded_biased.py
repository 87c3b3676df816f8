"""Decode-once for experts with biases and GPT-OSS's clamped SwiGLU (strata.blob BiasSlot,
ExpertAct): the BF16 blobs carry each expert's fp32 biases bit for bit (bf16_layout keeps the
bias slot and activation), and moe_ffn_decoded equals the fused kernel bit for bit.

Why bit for bit: at one pinned tile and the "decode" dot, the fused kernel rounds every decoded
weight to bf16 before the dot, in the same BK steps as the BF16 GEMM reads the decoded blob, and
both add the same fp32 biases in the same epilogue: the same fp32 sums, the same roundings.
(The Q8_0 / Q4_0 default "swap_fast" dots scale code partial sums instead, so the pin matters.)
Against the torch twin the bound is DECODED_REL, as for the fused kernel (test_moe_epilogue).
Cases use swiglu_oai's limit 0.75 so that a good share of pre-activations is clamped.
Outputs start NaN-poisoned (tests/conftest.py); decode buffers start filled with 0xFF bytes.
"""
from __future__ import annotations

import zlib

import pytest
import torch

from strata.blob import ExpertAct, bf16_layout
from strata.errors import StrataError
from strata.kernels import moe_ffn, moe_ffn_torch, pin_tile, topk_route
from strata.kernels.moe.decoded import decode_experts, moe_ffn_decoded
from strata.kernels.moe.expert_dequant import copy_biases_into, copy_biases_into_torch
from strata.kernels.moe.ffn import dequantize_matrix
from strata.kernels.moe.grouped import grouped_ffn, last_decoded_gemm, pin_decoded_gemm
from strata.kernels.moe.random_experts import random_expert_set

DECODED_REL = 1.5e-2   # the fused GEMM's bound for decoded formats (test_moe_epilogue)
OAI = ExpertAct("swiglu_oai", alpha=1.702, limit=0.75)
# one tile for both paths, the weights rounded to bf16 before the dot (module docstring)
SAME_TILE = dict(schedule="dp", BLOCK_N=16, BLOCK_K=32, dot="decode")

CASES = [  # id, fmts, act, T, E, K, D, F
    ("mxfp4-oai", ("MXFP4",), OAI, 9, 5, 2, 64, 96),
    ("mxfp4-q8-down-oai", ("MXFP4", "MXFP4", "Q8_0"), OAI, 7, 4, 2, 96, 64),
    ("q8_0-bias-silu", ("Q8_0",), None, 8, 4, 2, 64, 64),
    ("q8_0-oai", ("Q8_0",), OAI, 6, 4, 3, 64, 32),
]


def rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def experts_of(case, **kw):
    cid, fmts, act, T, E, K, D, F = case
    return random_expert_set(E, D, F, *fmts, seed=zlib.crc32(cid.encode()), bias=True, act=act,
                             **kw)


def routing(case, device="cpu"):
    cid, fmts, act, T, E, K, D, F = case
    gen = torch.Generator().manual_seed(zlib.crc32(cid.encode()) + 1)
    x = torch.randn(T, D, generator=gen).bfloat16()
    ids, w = topk_route(torch.randn(T, E, generator=gen), K)
    return x.to(device), ids.to(device), w.to(device)


def special_biases(ex, e: int) -> torch.Tensor:
    """Write biases bf16 cannot hold (1 + 2^-20, a subnormal, -0.0, a NaN payload) into expert
    e's bias slot: a copy that rounds or goes through bf16 changes their bits."""
    at = int(ex.slot_offset[e]) + ex.layout.bias.offset
    vals = torch.tensor([1 + 2 ** -20, 1e-40, -0.0, 3.14159265], dtype=torch.float32)
    bits = vals.view(torch.int32)
    bits = torch.cat([bits, torch.tensor([0x7FC00123], dtype=torch.int32)])   # NaN payload
    ex.arena[at:at + 4 * bits.numel()] = bits.view(torch.uint8)
    return ex.arena[at:at + ex.layout.bias.nbytes].clone()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_decode_carries_the_biases_bit_for_bit(case):
    ex = experts_of(case)
    E = ex.n_expert
    raw0 = special_biases(ex, 0)
    out_lay = bf16_layout(ex.layout)
    assert out_lay.bias is not None and out_lay.act == ex.layout.act
    assert all(m.fmt.name == "BF16" for m in out_lay.matrices)
    bb = out_lay.size
    assert bb >= out_lay.bias.offset + 4 * (2 * out_lay.d_expert + out_lay.d_model)
    # experts 1 and 3 (of 4 or 5) not decoded; slots out of order; the last slot stays unwritten
    slots = [0, -1, 3 * bb, -1, bb][:E]
    dst_slot = torch.tensor(slots)
    buf = torch.full(((E + 1) * bb,), 255, dtype=torch.uint8)
    dec = decode_experts(ex, dst_slot, buf)
    assert dec.layout == out_lay
    b = out_lay.bias
    for e, at in enumerate(slots):
        if at < 0:
            continue
        src = int(ex.slot_offset[e]) + ex.layout.bias.offset
        assert torch.equal(buf[at + b.offset:at + b.offset + b.nbytes],
                           ex.arena[src:src + ex.layout.bias.nbytes]), e
        for m in ("gate", "up", "down"):
            want = dequantize_matrix(ex, e, m).bfloat16().float()
            assert torch.equal(dequantize_matrix(dec, e, m), want), (e, m)
    assert torch.equal(buf[b.offset:b.offset + b.nbytes], raw0)
    untouched = [s for s in range(E + 1) if s * bb not in slots]
    for s in untouched:
        assert torch.all(buf[s * bb:(s + 1) * bb] == 255), s


def test_bias_copy_matches_its_twin():
    """copy_biases_into (Triton) and its plain-torch twin write the same bytes, and only the
    bias slots of the experts with dst_slot >= 0."""
    ex = experts_of(CASES[0])
    special_biases(ex, 2)
    bb = bf16_layout(ex.layout).size
    off = bf16_layout(ex.layout).bias.offset
    dst_slot = torch.tensor([2 * bb, -1, 0, -1, 4 * bb])
    bufs = [torch.full((5 * bb,), 255, dtype=torch.uint8) for _ in range(2)]
    copy_biases_into(ex, dst_slot, bufs[0], off)
    copy_biases_into_torch(ex, dst_slot, bufs[1], off)
    assert torch.equal(bufs[0], bufs[1])
    written = torch.zeros(5 * bb, dtype=torch.bool)
    for at in (2 * bb, 0, 4 * bb):
        written[at + off:at + off + ex.layout.bias.nbytes] = True
    assert torch.all(bufs[0][~written] == 255) and not torch.all(bufs[0][written] == 255)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_decoded_equals_fused(case):
    ex = experts_of(case)
    x, ids, w = routing(case)
    with pin_tile(**SAME_TILE):
        fused = moe_ffn(x, ids, w, ex)
        dec = moe_ffn_decoded(x, ids, w, ex)
    assert not torch.isnan(dec).any(), "output not fully written (NaN poison survived)"
    assert torch.equal(dec, fused)
    ref = moe_ffn_torch(x, ids, w, ex)
    assert rel(dec, ref) < DECODED_REL
    # the case means something: biases and activation change the result
    cid, fmts, act, T, E, K, D, F = case
    plain = random_expert_set(E, D, F, *fmts, seed=zlib.crc32(cid.encode()))
    assert rel(moe_ffn_torch(x, ids, w, plain), ref) > 10 * DECODED_REL


def test_decoded_passes_add_as_the_fused_passes():
    """Passes over some experts (ids of the others -1) adding into an fp32 accumulator, as the
    streaming engine runs a layer: the same sums as the fused kernel's passes."""
    case = CASES[0]
    ex = experts_of(case)
    x, ids, w = routing(case)
    accs = [torch.zeros(x.shape[0], x.shape[1]) for _ in range(2)]
    with pin_tile(**SAME_TILE):
        for group in ([0, 3], [1, 2, 4]):
            part = torch.where(torch.isin(ids, torch.tensor(group)), ids, -1)
            moe_ffn(x, part, w, ex, out=accs[0])
            moe_ffn_decoded(x, part, w, ex, out=accs[1])
    assert torch.equal(accs[0], accs[1])
    assert rel(accs[1], moe_ffn_torch(x, ids, w, ex)) < DECODED_REL


def test_unchecked_decode_reads_nothing_on_the_host():
    """check=False with a decode buffer (the engine's call inside a chunk): no host read by
    strata code (strata.engine.syncs.SyncGuard: on the CPU every tensor counts as a device
    tensor), and the same bits as the checked call."""
    from strata.engine.syncs import SyncGuard
    case = CASES[1]
    ex = experts_of(case)
    x, ids, w = routing(case)
    bb = bf16_layout(ex.layout).size
    wdec = torch.full((ex.n_expert * bb,), 255, dtype=torch.uint8)
    with pin_tile(**SAME_TILE):
        want = moe_ffn_decoded(x, ids, w, ex)
        with SyncGuard() as g:
            got = moe_ffn_decoded(x, ids, w, ex, check=False, workspace={"wdec": wdec})
    assert not g.caught, g.report()
    assert torch.equal(got, want)


def test_biased_experts_take_the_triton_gemm_and_say_why():
    """torch._grouped_mm's path has no bias or swiglu_oai epilogue: asked for it (a pin), the
    decoded FFN warns and runs the Triton GEMM, and the record says why; grouped_ffn refuses."""
    case = CASES[0]
    ex = experts_of(case)
    x, ids, w = routing(case)
    with pin_tile(**SAME_TILE):
        want = moe_ffn(x, ids, w, ex)
        got = moe_ffn_decoded(x, ids, w, ex)
        choice = last_decoded_gemm()
        assert choice.backend == "triton" and "biases" in choice.reason
        with pin_decoded_gemm("grouped"), pytest.warns(UserWarning, match="Triton GEMM"):
            pinned = moe_ffn_decoded(x, ids, w, ex)
    assert last_decoded_gemm().backend == "triton"
    assert torch.equal(got, want) and torch.equal(pinned, want)
    bb = bf16_layout(ex.layout).size
    dec = decode_experts(ex, torch.arange(ex.n_expert) * bb,
                         torch.zeros(ex.n_expert * bb, dtype=torch.uint8))
    with pytest.raises(StrataError, match="only the Triton GEMM's epilogue"):
        grouped_ffn(x, ids, w, dec)
    # a plain layout keeps the grouped path's answer (no reason recorded for it)
    plain = random_expert_set(3, 64, 32, "Q8_0", seed=1)
    xp = torch.randn(2, 64).bfloat16()
    idp, wp = topk_route(torch.randn(2, 3), 2)
    moe_ffn_decoded(xp, idp, wp, plain)
    assert last_decoded_gemm().reason is None


def test_auto_chooses_by_the_table_for_biased_experts(monkeypatch):
    """strata.models.moe's auto_path: GPT-OSS-style experts follow the measured table like plain
    ones (a table made here: MXFP4's kernel wins below 64 rows)."""
    from strata.kernels.moe import choices
    from strata.models.moe import auto_path
    pts = [{"rows": r, "tflops": {"kernel": k, "decoded": d}}
           for r, k, d in ((16, 20.0, 5.0), (64, 40.0, 40.0), (256, 60.0, 200.0))]
    monkeypatch.setattr(choices, "table", lambda: choices.FfnTable({"GPU": {"MXFP4": pts}}, ()))
    monkeypatch.setattr(choices, "device_name", lambda i: "GPU")
    ex = experts_of(CASES[0])
    assert not ex.layout.plain
    got = [auto_path(ex, rows, torch.device("cpu")) for rows in (8, 32, 128, 512)]
    assert got == ["kernel", "kernel", "decoded", "decoded"]


@pytest.mark.gpu
def test_decoded_equals_fused_gpt_oss_width_gpu():
    """GPT-OSS's real width (D = F = 2880, MXFP4, biases, swiglu_oai at its limit 7.0), a few
    experts, T = 256: the decoded path equals the fused kernel at one pinned tile and the decode
    dot, and the biases reach the BF16 blobs bit for bit. Bound if the two GEMMs' MMA
    instructions sum a tile's products in another order (they read the same bf16 operands):
    fp32 sums that differ in the last bits move h's bf16 rounding by at most one step, 2^-8
    relative, so the outputs stay within 2^-8 of each other; bit-exactness is printed."""
    E, D, F, T, K = 4, 2880, 2880, 256, 2
    act = ExpertAct("swiglu_oai", alpha=1.702, limit=7.0)
    ex = random_expert_set(E, D, F, "MXFP4", seed=7, bias=True, act=act, device="cuda")
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(T, D, generator=gen).bfloat16().cuda()
    ids, w = topk_route(torch.randn(T, E, generator=gen), K)
    ids, w = ids.cuda(), w.cuda()
    with pin_tile(schedule="dp", BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, dot="decode"):
        fused = moe_ffn(x, ids, w, ex)
        dec = moe_ffn_decoded(x, ids, w, ex)
    assert not torch.isnan(dec).any()
    print(f"decoded == fused bit for bit: {torch.equal(dec, fused)}; "
          f"max |diff| {(dec.float() - fused.float()).abs().max().item():.3g}")
    assert rel(dec, fused) < 2 ** -8
    bb = bf16_layout(ex.layout).size
    buf = torch.full((E * bb,), 255, dtype=torch.uint8, device="cuda")
    decode_experts(ex, torch.arange(E, device="cuda") * bb, buf)
    b, src = bf16_layout(ex.layout).bias, ex.layout.bias
    for e in range(E):
        at = int(ex.slot_offset[e]) + src.offset
        assert torch.equal(buf[e * bb + b.offset:e * bb + b.offset + b.nbytes],
                           ex.arena[at:at + src.nbytes])
