"""The int8 expert GEMM (strata.kernels.moe.int8) and its q8_1 quantizer against their plain-torch
twins, ggml's C reference, and the fp32 feed-forward, on fresh random data.

What is exact, and what is bounded (never loosened to pass; a miss is a bug to find):
- q8_1: bit for bit with quantize_q8_1_torch and with ggml's quantize_row_q8_1_ref.
- the weight split: d * c + m bit for bit with strata.formats.dequantize.
- int8_down: bit for bit with its twin (integer dots, the same fp32 rescale order, no fusion).
- int8_gate_up: its accumulators are the same bits, but act's exp is numpy's in the interpreter
  (the GPU's ex2 on the device) and torch's in the twin: the two differ by at most a couple of ulps,
  so h = g / (1 + exp(-g)) * u differs by at most a few ulps: ACT_REL = 2**-20 of |h| (4 ulps of
  the two roundings after exp, with room) plus ACT_ABS for h near 0.
- one matrix against the exact fp64 product of the unquantized activations: the elementwise bound
  derived in `_dot_bound` (the q8_1 rounding of each weight's activation, the fp16 d and s, and
  the fp32 rescale's roundings).
- the whole feed-forward against moe_ffn_torch (fp32 path, the same exact weights): FFN_REL below.
"""
from __future__ import annotations

import ctypes
import functools
import glob
import hashlib
import math
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from strata.errors import StrataError
from strata.formats import dequantize, get_format
from strata.formats.split import RUNS, split_codes
from strata.kernels.moe.ffn import moe_ffn, moe_ffn_torch
from strata.kernels.moe.grouping import group_blocked, topk_route
from strata.kernels.moe.int8 import (INT8_FORMATS, Int8Tile, int8_down, int8_down_torch,
                                     int8_gate_up, int8_gate_up_q8, int8_gate_up_torch,
                                     int8_matmul_torch, moe_ffn_int8, moe_ffn_int8_torch)
from strata.kernels.moe.q8 import Q8Rows, quantize_q8_1, quantize_q8_1_torch
from strata.kernels.moe.random_experts import encode_matrix, random_expert_set

TILE = Int8Tile(BLOCK_M=16, BLOCK_N=32)   # small (fast interpreter runs); BN holds a q8_1 block
ACT_REL = 2.0 ** -20
ACT_ABS = 2.0 ** -30
# A q8_1 block x of 32 values is rounded to d*q with |x - d*q| <= d/2, d = amax/127, so
# ||x - x^||_2 <= sqrt(32) * amax / 254 <= sqrt(32)/254 ||x||_2 (amax <= ||x||): every block, hence
# every row, carries a relative error EPS <= sqrt(32)/254 = 2.2% (the fp16 d adds 127 * 2**-11
# of d/2 at most: the factor 1 + 2**-3). Through a linear map of random weights a row's relative
# error stays that size; h = act(g) * u carries x's twice (through g, act' <= 1.1, and through u),
# then h's own quantization adds one more EPS, and the down map carries it: 3.1 EPS in all.
EPS = math.sqrt(32) / 254 * (1 + 2.0 ** -3)
FFN_REL = 3.1 * EPS
DECODED_REL = 1.5e-2   # moe_ffn (bf16 tensor cores) against moe_ffn_torch: test_moe_ffn.py


def _bits(t):
    if t.dtype in (torch.float32, torch.float16):
        return t.contiguous().view(torch.int32 if t.dtype == torch.float32 else torch.int16)
    return t


def _same_q8(a: Q8Rows, b: Q8Rows) -> bool:
    """Codes, d and s bit for bit."""
    return all(torch.equal(_bits(u), _bits(v)) for u, v in zip(a, b))


def _gen(name: str):
    seed = zlib.crc32(name.encode())
    return torch.Generator().manual_seed(seed), seed


# ---------------------------------------------------------------- q8_1

# ggml's quantize_row_q8_1_ref on test_q8_1_matches_twin_and_ggml's two inputs (their sha256
# beside): codes, and d / s as fp16 bits; remade by _ggml_q8_1 with llama-cpp-python 0.3.36's
# libggml-base.so (tests/models/make_llama_cpp_logits.py builds it)
GGML_Q8_1 = Path(__file__).parent / "data" / "ggml_q8_1.npz"


def _ggml_q8_1(x: torch.Tensor) -> Q8Rows | None:
    """ggml's quantize_row_q8_1_ref through ctypes (block_q8_1: fp16 d, fp16 s, int8 qs[32]),
    None where the llama.cpp build is not installed (CI, the GPU image: the record holds its
    bits)."""
    libs = glob.glob("/work/lcp-venv/lib/python3*/site-packages/llama_cpp/lib/libggml-base.so")
    if not libs:
        return None
    lib = ctypes.CDLL(libs[0])
    R, D = x.shape
    xs = x.float().contiguous()
    buf = torch.zeros(R * D // 32 * 36, dtype=torch.uint8)
    lib.quantize_row_q8_1_ref(ctypes.c_void_p(xs.data_ptr()), ctypes.c_void_p(buf.data_ptr()),
                              ctypes.c_int64(R * D))
    blk = buf.reshape(R, D // 32, 36)
    f16 = lambda b: b.contiguous().view(torch.float16)[..., 0]  # noqa: E731
    return Q8Rows(blk[..., 4:].contiguous().view(torch.int8).reshape(R, D), f16(blk[..., 0:2]),
                  f16(blk[..., 2:4]))


def _q8_input(name: str, R: int, D: int) -> torch.Tensor:
    gen, _ = _gen(name)
    x = torch.randn(R, D, generator=gen) * torch.rand(R, 1, generator=gen) * 8
    # pinned cases, one block each (row 0 .. 3):
    x[0, :32] = 0.0                                    # all zero: d = 0, codes 0, s = 0
    x[1, :32] = torch.tensor([127.0, 2.5, -2.5, 0.5, -0.5, 1.5, 0.49999997, -0.49999997] * 4)
    #   d = 1 exactly: halves go away from zero (roundf, not rint: 2.5 -> 3, 0.5 -> 1), and
    #   0.49999997 -> 0 (floor(v + 0.5) would give 1)
    x[2, :32] = torch.linspace(-1e-3, 3e-4, 32)        # small values: fp16 d near its low range
    x[3, :32] = -x[3, :32].abs()                       # amax from a negative value
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_q8_1_matches_twin_and_ggml(dtype):
    x = _q8_input(f"q8-{dtype}", 21, 96).to(dtype)
    out = Q8Rows(torch.full((21, 96), -128, dtype=torch.int8), torch.empty(21, 3).half(),
                 torch.empty(21, 3).half())      # poisoned: -128 is no code, NaN no scale
    got = quantize_q8_1(x, out=out)
    ref = quantize_q8_1_torch(x)
    assert _same_q8(got, ref)
    if dtype == torch.float32:   # (bf16 holds 0.49999997 as 0.5)
        assert ref.q[1, :8].tolist() == [127, 3, -3, 1, -1, 2, 0, 0]
    # ggml's own bits: the committed record (GGML_Q8_1, made by _ggml_q8_1 on these inputs), and
    # the library itself where the llama.cpp build is installed
    rec = np.load(GGML_Q8_1)
    tag = "fp32" if dtype == torch.float32 else "bf16"
    assert hashlib.sha256(x.float().numpy().tobytes()).digest() == rec[f"{tag}_x_sha"].tobytes()
    assert _same_q8(Q8Rows(torch.from_numpy(rec[f"{tag}_q"]),
                           torch.from_numpy(rec[f"{tag}_d"]).view(torch.float16),
                           torch.from_numpy(rec[f"{tag}_s"]).view(torch.float16)), ref)
    ggml = _ggml_q8_1(x)
    if ggml is not None:
        assert _same_q8(ggml, ref)


def test_q8_1_refuses_ragged_rows():
    with pytest.raises(StrataError, match="multiple of 32"):
        quantize_q8_1(torch.zeros(2, 40))


# ---------------------------------------------------------------- the weight split

@pytest.mark.parametrize("fmt", INT8_FORMATS)
def test_split_codes_equal_dequantize(fmt):
    f = get_format(fmt)
    gen, seed = _gen(fmt)
    rows, cols = 4, 512
    raw = encode_matrix(torch.randn(rows, cols, generator=gen) / 20, f)
    c, d, m = split_codes(raw, f, rows, cols)
    run = RUNS[fmt]
    w = d.repeat_interleave(run, 1) * c.float()
    if m is not None:
        w = w + m.repeat_interleave(run, 1)
    assert torch.equal(_bits(w), _bits(dequantize(raw, f).reshape(rows, cols)))


# ---------------------------------------------------------------- one matrix, bounded

def _dot_bound(x, xq: Q8Rows, c, d, m, run):
    """Elementwise bound on |int8_matmul_torch - x @ W^T| (fp64), W = d*c + m, derived term by term:
    - weight k of block b: the kernel multiplies d16*q_k (d16 the stored fp16 d) where x has x_k,
      |d16 q_k - x_k| <= |d16 - d| 127 + d (1/2 + 2**-17) = e_b (d = amax/127; x_k/d is formed in
      fp32, within 2**-17 of its at most 127); times |d c_k| and summed.
    - a minimum m of a 32-run takes s16 (fp16 of d sum q) for sum_b x:
      |s16 - sum_b x| <= 2**-10 |s16| + 32 e_b; of a 16-run (Q2_K) da*sum_half q: <= 16 e_b.
    - the fp32 rescale: at most 5 roundings a run, each <= 2**-24 of the running sum, so
      <= 5 (runs) 2**-24 times the sum of the terms' sizes.
    """
    R, n = x.shape
    x64 = x.double().reshape(R, n // 32, 32)
    dd = x64.abs().amax(2) / 127                                          # [R, B]
    e = (xq.d.double() - dd).abs() * 127 + dd * (0.5 + 2.0 ** -17)        # [R, B]
    wd = (d.double().repeat_interleave(run, 1) * c.double()).abs()        # [N, n] |d c|
    bound = e.repeat_interleave(32, 1) @ wd.T
    terms = (xq.q.double().abs() * xq.d.double().repeat_interleave(32, 1)) @ wd.T
    if m is not None:
        mm = m.double().abs()                                             # [N, n/run]
        if run == 32:
            bound = bound + (32 * e + 2.0 ** -10 * xq.s.double().abs()) @ mm.T
            terms = terms + xq.s.double().abs() @ mm.T
        else:
            bound = bound + (16 * e).repeat_interleave(2, 1) @ mm.T
            half = xq.q.double().abs().reshape(R, -1, 16).sum(2)          # [R, n/16]
            terms = terms + (half * xq.d.double().repeat_interleave(2, 1)) @ mm.T
    return bound + 5 * (n // run) * 2.0 ** -24 * terms


@pytest.mark.parametrize("fmt", INT8_FORMATS)
def test_int8_matmul_is_the_product_within_its_bound(fmt):
    f = get_format(fmt)
    gen, _ = _gen("mm-" + fmt)
    n = max(64, f.block)
    x = torch.randn(6, n, generator=gen) * torch.rand(6, 1, generator=gen) * 4
    raw = encode_matrix(torch.randn(8, n, generator=gen) / n ** 0.5, f)
    c, d, m = split_codes(raw, f, 8, n)
    run = RUNS[fmt]
    xq = quantize_q8_1_torch(x)
    got = int8_matmul_torch(xq.q, xq.d.float(), xq.s.float(), c, d, m, run).double()
    ref = x.double() @ dequantize(raw, f).reshape(8, n).double().T
    bound = _dot_bound(x, xq, c, d, m, run)
    assert ((got - ref).abs() <= bound).all(), ((got - ref).abs() / bound).max()
    # not vacuous: a wrong run scale (the first run's doubled, as an off-by-one block would
    # misread it) leaves the bound
    d2 = d.clone()
    d2[:, 0] *= 2
    bad = int8_matmul_torch(xq.q, xq.d.float(), xq.s.float(), c, d2, m, run).double()
    assert ((bad - ref).abs() > bound).any()


# ---------------------------------------------------------------- the GEMM stages and the FFN

@dataclass(frozen=True)
class Case:
    id: str
    T: int
    E: int
    K: int
    D: int = 64
    F: int = 32
    fmts: tuple = ("Q8_0",)
    route: str = "random"   # "random" | "one" (every token on expert 0) | "skip" (ids of -1)
    bias: bool = False
    act: str = "silu"


CASES = [
    Case("q8-T3-lt-tile", T=3, E=4, K=2),                              # T < BLOCK_M
    Case("q8-all-on-one", T=20, E=4, K=1, route="one"),                # one expert, two blocks
    Case("q8-skip-E7", T=11, E=7, K=2, route="skip"),                  # ids of -1: rows unwritten
    # 256-weight blocks: k-quant gate/up need D = 256, a k-quant down F = 256
    Case("q4k-q5k-gate-up", T=5, E=3, K=2, D=256, fmts=("Q4_K", "Q5_K", "Q8_0")),
    Case("q6k-down", T=5, E=3, K=2, D=32, F=256, fmts=("Q8_0", "Q8_0", "Q6_K")),
    Case("q2k-q3k-16-runs", T=4, E=3, K=2, D=256, fmts=("Q2_K", "Q3_K", "Q8_0")),
    Case("q4_0-q4_1-q5_1", T=6, E=3, K=2, fmts=("Q4_0", "Q4_1", "Q5_1")),
    Case("iq4nl-iq4xs-q5_0", T=4, E=3, K=2, D=256, F=32, fmts=("IQ4_NL", "IQ4_XS", "Q5_0")),
    Case("mxfp4-bias-swiglu-oai", T=6, E=4, K=2, fmts=("MXFP4",), bias=True, act="swiglu_oai"),
]


def _inputs(c: Case):
    from strata.blob import ExpertAct
    gen, seed = _gen(c.id)
    experts = random_expert_set(c.E, c.D, c.F, *c.fmts, seed=seed, bias=c.bias,
                                act=ExpertAct(c.act))
    x = torch.randn(c.T, c.D, generator=gen).bfloat16()
    logits = torch.randn(c.T, c.E, generator=gen)
    if c.route == "one":
        logits[:, 0] += 100.0
    ids, w = topk_route(logits, c.K)
    if c.route == "skip":
        ids = torch.where(ids == 1, -1, ids)
    grp = group_blocked(ids, c.E, TILE.BLOCK_M, slot_offset=experts.slot_offset,
                        skip_negative=True)
    return experts, x, ids, w, grp


@pytest.mark.parametrize("c", CASES, ids=lambda c: c.id)
def test_int8_gemm_stages_match_twins(c: Case):
    experts, x, ids, w, grp = _inputs(c)
    xq = quantize_q8_1(x)
    h = int8_gate_up(xq, grp, experts, c.K, TILE)
    h_ref = int8_gate_up_torch(xq, grp, experts, c.K, TILE)
    assert not torch.isnan(h).any(), "h not fully written (NaN poison survived)"
    assert ((h - h_ref).abs() <= ACT_REL * h_ref.abs() + ACT_ABS).all(), \
        ((h - h_ref).abs() / h_ref.abs()).max()
    # h quantized in the GEMM's epilogue: the separate quantizer's bits on the same h
    hq_fused = int8_gate_up_q8(xq, grp, experts, c.K, TILE)
    assert _same_q8(hq_fused, quantize_q8_1(h))
    hq = quantize_q8_1(h_ref)
    yk = int8_down(hq, grp, experts, w, TILE)
    yk_ref = int8_down_torch(hq, grp, experts, w, TILE)
    # bit for bit; rows of skipped assignments stay NaN (poison) in both
    assert torch.equal(yk.isnan(), yk_ref.isnan())
    assert torch.equal(_bits(torch.nan_to_num(yk)), _bits(torch.nan_to_num(yk_ref)))
    written = (ids.reshape(-1) >= 0)
    assert not yk[written].isnan().any()


@pytest.mark.parametrize("c", CASES, ids=lambda c: c.id)
def test_moe_ffn_int8_matches_twin_and_fp32_path(c: Case):
    experts, x, ids, w, grp = _inputs(c)
    y = moe_ffn_int8(x, ids, w, experts, tile=TILE)
    assert y.shape == (c.T, c.D) and y.dtype == torch.bfloat16 and not y.isnan().any()
    # the launcher's wiring, bit for bit: the twins' stages fed the kernel's own h
    from strata.kernels.moe.combine import combine_rows_torch
    hq = int8_gate_up_q8(quantize_q8_1(x), grp, experts, c.K, TILE)
    yk = int8_down_torch(hq, grp, experts, w, TILE)
    rows = "mask" if grp.n_skipped else "all"
    assert torch.equal(y, combine_rows_torch(yk, c.T, c.K, c.D, ids, None, rows))
    ref = moe_ffn_torch(x, ids, w, experts)
    twin = moe_ffn_int8_torch(x, ids, w, experts, tile=TILE)
    for got, bound in ((y, FFN_REL), (twin, FFN_REL)):
        err = ((got.float() - ref.float()).norm() / ref.float().norm()).item()
        assert err < bound, f"normalized error {err:.2e} against the fp32 path"


def test_moe_ffn_int8_near_the_bf16_kernel():
    """Against moe_ffn itself (bf16 tensor cores): the two paths' bounds against the fp32 path
    add (triangle inequality)."""
    c = CASES[3]
    experts, x, ids, w, _ = _inputs(c)
    y = moe_ffn_int8(x, ids, w, experts, tile=TILE)
    yb = moe_ffn(x, ids, w, experts)
    err = ((y.float() - yb.float()).norm() / yb.float().norm()).item()
    assert err < FFN_REL + DECODED_REL


def test_moe_ffn_int8_out_adds_in_fp32():
    """out: y's fp32 sum added in place of a bf16 y: got - base is that sum, which y rounds to
    bf16 (<= 2**-9 of |y|), up to the ulps of base lost in the addition."""
    c = CASES[0]
    experts, x, ids, w, _ = _inputs(c)
    base = torch.randn(c.T, c.D)
    got = moe_ffn_int8(x, ids, w, experts, tile=TILE, out=base.clone())
    y = moe_ffn_int8(x, ids, w, experts, tile=TILE).float()
    assert got.dtype == torch.float32
    assert ((got - base - y).abs() <= 2 ** -8 * y.abs() + 2 ** -22 * base.abs()).all()


def test_moe_ffn_int8_passes_without_sync_sum_as_one_call():
    """The engine's convention: two passes over halves of the experts, no host sync
    (check=False), the first deferring its rows to workspace["yk"], the second summing the
    layer's rows once: the same bits as one checked call over all experts (each row is computed
    from its token and expert alone; the sum over K runs once, in k order, either way)."""
    c = Case("passes", T=9, E=4, K=2)
    experts, x, ids, w, _ = _inputs(c)
    y_one = moe_ffn_int8(x, ids, w, experts, tile=TILE, out=torch.zeros(c.T, c.D))
    ws = {"yk": torch.empty(c.T * c.K + 3, c.D)}       # more rows than needed: a carve's view
    y = torch.zeros(c.T, c.D)
    for half, combine in ((0, "defer"), (1, "layer")):
        mine = (ids % 2 == half)
        p_ids = torch.where(mine, ids, -1)
        moe_ffn_int8(x, p_ids, w, experts, tile=TILE, out=y, workspace=ws, check=False,
                     combine=combine)
    assert torch.equal(_bits(y), _bits(y_one))


def test_moe_ffn_int8_takes_its_q8_rows_from_the_workspace_h():
    """workspace["h"] (the bf16 GEMM's h, padded rows x F) lends its bytes to the q8_1 rows of x
    and h: the same y, and the rows live in the buffer (its bytes change)."""
    from strata.kernels.moe.tiles import padded_rows
    c = CASES[0]
    experts, x, ids, w, _ = _inputs(c)
    rows = padded_rows(c.T, c.K, c.E, 64)                 # the bf16 kernel's BLOCK_M of 64
    h = torch.zeros(rows, c.F, dtype=torch.bfloat16)
    y = moe_ffn_int8(x, ids, w, experts, tile=TILE, workspace={"h": h})
    assert torch.equal(y, moe_ffn_int8(x, ids, w, experts, tile=TILE))
    assert h.view(torch.int16).ne(0).any()


def test_moe_ffn_int8_refuses_formats_without_a_split():
    experts = random_expert_set(2, 256, 32, "IQ3_S", "Q8_0", "Q8_0")
    x = torch.zeros(2, 256).bfloat16()
    ids, w = topk_route(torch.zeros(2, 2), 1)
    with pytest.raises(StrataError, match="no int8 split for \\['IQ3_S'\\]"):
        moe_ffn_int8(x, ids, w, experts, tile=TILE)


# ---------------------------------------------------------------- on the GPU

# the device's exp (ex2.approx of g log2 e): 2 ulps, plus the argument's rounding carried as
# |g log2 e| 2**-24 relative; activations here stay |g| < 64: 2**-24 (2 + 93) < 2**-17, so
# h's relative gap to the twin stays below 2**-16
ACT_REL_GPU = 2.0 ** -16
GPU_CASES = [Case("gpu-q8", T=300, E=8, K=2, D=512, F=256),
             Case("gpu-q4k-q6k", T=300, E=8, K=2, D=512, F=256, fmts=("Q4_K", "Q4_K", "Q6_K")),
             Case("gpu-mxfp4-bias", T=200, E=8, K=2, D=256, F=256, fmts=("MXFP4",), bias=True,
                  act="swiglu_oai")]


@pytest.mark.gpu
@pytest.mark.parametrize("c", GPU_CASES, ids=lambda c: c.id)
def test_int8_gemm_on_the_gpu_matches_twins(c: Case):
    from strata.blob import ExpertAct
    gen, seed = _gen(c.id)
    dev = torch.device("cuda")
    experts = random_expert_set(c.E, c.D, c.F, *c.fmts, seed=seed, bias=c.bias,
                                act=ExpertAct(c.act), device=dev)
    x = torch.randn(c.T, c.D, generator=gen).bfloat16().to(dev)
    ids, w = topk_route(torch.randn(c.T, c.E, generator=gen).to(dev), c.K)
    tile = Int8Tile()
    grp = group_blocked(ids, c.E, tile.BLOCK_M, slot_offset=experts.slot_offset,
                        skip_negative=True)
    xq = quantize_q8_1(x)
    assert _same_q8(xq, quantize_q8_1_torch(x))
    h = int8_gate_up(xq, grp, experts, c.K, tile)
    h_ref = int8_gate_up_torch(xq, grp, experts, c.K, tile)
    assert ((h - h_ref).abs() <= ACT_REL_GPU * h_ref.abs() + ACT_ABS).all()
    assert _same_q8(int8_gate_up_q8(xq, grp, experts, c.K, tile), quantize_q8_1(h))
    hq = quantize_q8_1(h_ref)
    yk = int8_down(hq, grp, experts, w, tile)
    assert torch.equal(_bits(yk), _bits(int8_down_torch(hq, grp, experts, w, tile)))
    y = moe_ffn_int8(x, ids, w, experts, tile=tile)
    ref = moe_ffn_torch(x, ids, w, experts)
    assert ((y.float() - ref.float()).norm() / ref.float().norm()).item() < FFN_REL


def test_int8_tiles_parse_and_refuse_in_one_line():
    """Int8Tile.parse reads its own name back; a tile the kernel cannot run is one line."""
    from strata.kernels.moe.int8 import Int8Tile
    for t in (Int8Tile(), Int8Tile(128, 256, 8, 3), Int8Tile(16, 32, 1, 1)):
        assert Int8Tile.parse(t.name) == t
    for bad in ("128x48/w4s2", "100x64/w4s2", "64x16/w4s2", "64x64/w3s2", "64x64/w4s0",
                "64x64", "64x64/4s2", "axb/w4s2"):
        with pytest.raises(StrataError, match="an int8 tile is BMxBN/wWsS"):
            Int8Tile.parse(bad)


# ---------------------------------------------------------------- steps of several q8_1 blocks

# Int8Tile.kb: a reduction step loads kb blocks at once, then adds each block's terms in
# increasing order, and the blocks past the last whole step one a step: the same fp32 additions
# in the same order, so every kb gives kb 1's bits. K-quant rows (256-weight super-blocks) are
# whole steps for every kb; the 32-weight formats leave remainders: D 160 is 5 blocks (kb 2: two
# steps and one left; kb 4: one and one), F 96 is 3 (kb 4: no whole step at all).
KB_CASES = [Case("kb-q4k-q6k", T=5, E=3, K=2, D=256, F=256, fmts=("Q4_K", "Q4_K", "Q6_K")),
            Case("kb-q8-q4_1-ragged", T=6, E=3, K=2, D=160, F=96, fmts=("Q8_0", "Q4_1", "Q4_1"))]
KB_TILE = Int8Tile(BLOCK_M=16, BLOCK_N=128)   # wide: the interpreter's time goes by programs


@functools.cache
def _kb_one(c: Case) -> tuple:
    """kb 1's gate/up h and feed-forward y on the case's inputs (each kb's test compares with
    them: run once per case)."""
    experts, x, ids, w, grp = _inputs(c)
    return (int8_gate_up(quantize_q8_1(x), grp, experts, c.K, KB_TILE),
            moe_ffn_int8(x, ids, w, experts, tile=KB_TILE))


@pytest.mark.parametrize("kb", [2, 4])
@pytest.mark.parametrize("c", KB_CASES, ids=lambda c: c.id)
def test_int8_gemm_steps_of_kb_blocks_give_the_same_bits(c: Case, kb: int):
    experts, x, ids, w, grp = _inputs(c)
    one = KB_TILE
    tile = Int8Tile(one.BLOCK_M, one.BLOCK_N, one.num_warps, one.num_stages, kb)
    xq = quantize_q8_1(x)
    # gate/up: the accumulators are kb 1's (act's exp keeps the twin a few ulps off: see above)
    h = int8_gate_up(xq, grp, experts, c.K, tile)
    assert not h.isnan().any()
    h_one, y_one = _kb_one(c)
    assert torch.equal(_bits(h), _bits(h_one))
    h_ref = int8_gate_up_torch(xq, grp, experts, c.K, tile)
    assert ((h - h_ref).abs() <= ACT_REL * h_ref.abs() + ACT_ABS).all()
    rows = h.shape[0]
    poison = Q8Rows(torch.full((rows, c.F), -128, dtype=torch.int8),
                    torch.full((rows, c.F // 32), float("nan")).half(),
                    torch.full((rows, c.F // 32), float("nan")).half())
    assert _same_q8(int8_gate_up_q8(xq, grp, experts, c.K, tile, out=poison), quantize_q8_1(h))
    # down: the twin's bits, into rows poisoned NaN (every assignment is routed: all written)
    hq = quantize_q8_1(h_ref)
    yk = int8_down(hq, grp, experts, w, tile, yk=torch.full((c.T * c.K, c.D), float("nan")))
    assert not yk.isnan().any()
    assert torch.equal(_bits(yk), _bits(int8_down_torch(hq, grp, experts, w, tile)))
    # the whole feed-forward: kb 1's y
    assert torch.equal(moe_ffn_int8(x, ids, w, experts, tile=tile), y_one)


def test_int8_tile_kb_names_and_refusals():
    """kb 1 keeps the name without a suffix; a step of other than 1, 2, 4 or 8 blocks is one
    line, from parse and from the launch."""
    assert Int8Tile(128, 128, 8, 3).name == "128x128/w8s3"
    assert Int8Tile(128, 128, 8, 3, 4).name == "128x128/w8s3k4"
    for t in (Int8Tile(64, 64, 4, 2, 2), Int8Tile(128, 256, 8, 3, 8), Int8Tile(16, 32, 1, 1, 4)):
        assert Int8Tile.parse(t.name) == t
    assert Int8Tile.parse("64x64/w4s2k1") == Int8Tile()
    for bad in ("64x64/w4s2k3", "64x64/w4s2k0", "64x64/w4s2k16", "64x64/w4s2k", "64x64/w4s2kx",
                "64x64/w4k2s2", "64x64/k2w4s2"):
        with pytest.raises(StrataError, match=r"an int8 tile is BMxBN/wWsS\[kK\].*1, 2, 4, 8"):
            Int8Tile.parse(bad)
    c = CASES[0]
    experts, x, ids, w, grp = _inputs(c)
    with pytest.raises(StrataError, match="covers 1, 2, 4, 8 q8_1 blocks, got kb=3"):
        int8_down(quantize_q8_1(x), grp, experts, w, Int8Tile(16, 32, 4, 2, 3))


@pytest.mark.gpu
@pytest.mark.parametrize("kb", [2, 4, 8])
@pytest.mark.parametrize("c", [GPU_CASES[1], Case("gpu-q8-q4_1-ragged", T=300, E=8, K=2, D=2880,
                                                  F=480, fmts=("Q8_0", "Q4_1", "Q4_1"))],
                         ids=lambda c: c.id)
def test_int8_gemm_steps_of_kb_blocks_on_the_gpu(c: Case, kb: int):
    """The device's kb steps give kb 1's bits (gate/up h and y) and the twin's (down); D 2880 is
    gpt-oss's 90 blocks, F 480 15: remainders for every kb."""
    gen, seed = _gen(c.id)
    dev = torch.device("cuda")
    experts = random_expert_set(c.E, c.D, c.F, *c.fmts, seed=seed, device=dev)
    x = torch.randn(c.T, c.D, generator=gen).bfloat16().to(dev)
    ids, w = topk_route(torch.randn(c.T, c.E, generator=gen).to(dev), c.K)
    one = Int8Tile()
    tile = Int8Tile(one.BLOCK_M, one.BLOCK_N, one.num_warps, one.num_stages, kb)
    grp = group_blocked(ids, c.E, one.BLOCK_M, slot_offset=experts.slot_offset,
                        skip_negative=True)
    xq = quantize_q8_1(x)
    h = int8_gate_up(xq, grp, experts, c.K, tile)
    assert torch.equal(_bits(h), _bits(int8_gate_up(xq, grp, experts, c.K, one)))
    hq = quantize_q8_1(h)
    yk = int8_down(hq, grp, experts, w, tile,
                   yk=torch.full((c.T * c.K, c.D), float("nan"), device=dev))
    assert torch.equal(_bits(yk), _bits(int8_down_torch(hq, grp, experts, w, tile)))
    assert torch.equal(moe_ffn_int8(x, ids, w, experts, tile=tile),
                       moe_ffn_int8(x, ids, w, experts, tile=one))
