"""Triton kernels over plane-layout Q8_0 / Q4_0 / Q4_K experts (strata.planes; the op:
strata.kernels.moe.plane).

Legend: BM/BN/BK tile sizes, R = BK / 32 scale runs per step, RB row blocks a program; a *tile*
is RB·BM sorted rows (one expert) x BN output features, data-parallel (one program a tile, the
whole reduction).

    GATE_UP: h[r, f]  = act(x[tok(r)] . gate_e[f] (+ bg), x[tok(r)] . up_e[f] (+ bu))
    DOWN:    yk[a, d] = w[a] * (h[r(a)] . down_e[d] (+ bd))

Each reduction step loads the codes as one plain byte tile (Q8_0 [BN, BK], Q4_0 / Q4_K [BN, BK / 2]
nibble pairs; rows 16-byte aligned: vector loads, cp.async / TMA pipelined by num_stages), the
step's scales apart (Q8_0 / Q4_0 [BN, R] fp16 d; Q4_K each 32-weight sub-block's d·sc and dmin·m
[BN, R] from its super-block's 16-byte entry), forms each weight in fp32 as the ggml decoder
does (q * d, d * (q - 8), (d·sc) * q - dmin·m: the products are exact, so an FMA cannot change
the one rounding of the last; MAGIC: the codes to float by a float add on their bits, full rate,
where an int->float convert runs at a quarter), rounds it to bf16 once and runs one bf16 tl.dot
with fp32 accumulation. SWAP puts the
weights first (acc [BN, BM] = w @ a^T): the decoded weights stay in registers as the MMA's A
operand and the token rows, the short side at small T, become the MMA's N (Hopper's wgmma needs
M >= 64, not N). The routing rows, the epilogue (activation, biases, routing weight) and the bf16
rounding are the fused GEMM's own (strata.kernels.moe._ffn_kernel), so both kernels compute the same
function.
"""
from __future__ import annotations

from typing import NamedTuple

import triton
import triton.language as tl

from strata.kernels.decode.plane_codes import load_codes, plane_scales, plane_weights
from strata.kernels.moe._ffn_kernel import GATE_UP, GemmSpec, _bf16, _dot, _epilogue, _tile_rows


class PlaneSpec(NamedTuple):
    """The plane GEMM's compile-time choices, one constexpr argument `S` (plane_ffn builds it
    once a mode): MODE, TOPK, the tile (BM, RB row blocks, BN, BK), the two matrices' format
    bundles, PlaneTile's swap / tma / magic, the interpreter flag, EVEN (whole tiles), and the
    epilogue's BIAS / ACT."""
    MODE: int
    TOPK: int
    BM: int
    RB: int
    BN: int
    BK: int
    FMT1: object
    FMT2: object
    SWAP: bool
    TMA: bool
    MAGIC: bool
    INTERP: bool
    EVEN: bool = False
    BIAS: bool = False
    ACT: int = 0

    cache_key = GemmSpec.cache_key   # the bundles' own keys: an edited decoder recompiles


@triton.jit
def _weights(c_ptr, desc, s, m, n_in, offs_n, n_mask, nb, k0, FMT: tl.constexpr,
             S: tl.constexpr):
    """bf16 [BN, BK]: one step's decoded weights of a matrix of format FMT (code bytes by TMA when
    S.TMA, else vector loads; the step's factors s, m loaded a step ahead), each rounded to bf16
    once."""
    BN: tl.constexpr = S.BN
    BK: tl.constexpr = S.BK
    INTERP: tl.constexpr = S.INTERP
    if S.TMA:
        b = desc.load([nb * BN, k0 // FMT.PLANE_PACK])                 # out of bounds: 0
    else:
        b = load_codes(c_ptr, n_in // FMT.PLANE_PACK, offs_n, n_mask, k0, BK, FMT, S.EVEN)
    return _bf16(plane_weights(b, s, m, FMT, S.MAGIC, True, INTERP), INTERP)


@triton.jit
def _span_rows(MODE: tl.constexpr, sorted_ids_ptr, mb, row_end, n_assign, TOPK: tl.constexpr,
               BM: tl.constexpr, RBM: tl.constexpr):
    """_tile_rows over RBM padded rows from block mb's first, those at or past row_end (the
    next expert's) invalid like padding."""
    offs_m = mb * BM + tl.arange(0, RBM)
    ids = tl.load(sorted_ids_ptr + offs_m, mask=offs_m < row_end, other=n_assign)
    valid = ids < n_assign
    if MODE == GATE_UP:
        a_rows = ids // TOPK
    else:
        a_rows = offs_m
    return offs_m, ids, valid, a_rows


@triton.jit
def _acc_dot(w, a, acc, SWAP: tl.constexpr, INTERP: tl.constexpr):
    if SWAP:
        acc = _dot(w, a, acc, INTERP)          # [BN, BM] += w @ a^T
    else:
        acc = _dot(a, w, acc, INTERP)          # [BM, BN] += a @ w^T
    return acc


@triton.jit
def _plane_gemm_kernel(ROWS, WTS, OUT, n_out, n_in, n_blocks_ptr, padded_ptr, EPI,
                       S: tl.constexpr):
    """One tile of GATE_UP (S.MODE 0: gate c1/s1 and up c2/s2) or DOWN (MODE 1: c1/s1). S: the
    PlaneSpec. The launch data come as descriptors: ROWS (a_ptr, stride_a, sorted_ids_ptr,
    block_expert_ptr, n_assign) and OUT (out_ptr, stride_out, tw_ptr), the fused GEMM's (_tile);
    WTS (arena_ptr, slot_ptr, c1_off, s1_off, c2_off, s2_off): c*_off / s*_off the byte offsets of
    the code and scale planes from the blob's start, S.FMT1 / S.FMT2 their formats' traits
    bundles (Q8_0, Q4_0, Q4_K: strata.kernels.decode.plane_codes); EPI (boff1, boff2, alpha,
    limit), the epilogue's. The grid is an upper bound; the row-block count is read on the device
    (n_blocks_ptr). RB > 1: a program takes RB consecutive BM-row blocks of one expert (the first,
    RB-th, ... of its blocks; the others' programs return at once), so the weights are decoded
    once for RB·BM rows while the routing, and the workspace the planner sized for it, keep
    BLOCK_M = BM; padded_ptr (the routing's padded offsets, int64 [E+1]) says where the expert's
    blocks end. EVEN: n_out a multiple of BN and n_in of BK (the real shapes), so the loads keep
    only their row masks."""
    a_ptr, stride_a, sorted_ids_ptr, block_expert_ptr, n_assign = ROWS
    arena_ptr, slot_ptr, c1_off, s1_off, c2_off, s2_off = WTS
    out_ptr, stride_out, tw_ptr = OUT
    boff1, boff2, alpha, limit = EPI
    MODE: tl.constexpr = S.MODE
    TOPK: tl.constexpr = S.TOPK
    BM: tl.constexpr = S.BM
    RB: tl.constexpr = S.RB
    BN: tl.constexpr = S.BN
    BK: tl.constexpr = S.BK
    FMT1: tl.constexpr = S.FMT1
    FMT2: tl.constexpr = S.FMT2
    SWAP: tl.constexpr = S.SWAP
    INTERP: tl.constexpr = S.INTERP
    EVEN: tl.constexpr = S.EVEN
    pid = tl.program_id(0)
    NB = tl.cdiv(n_out, BN)
    mb = pid // NB
    lead = pid < tl.load(n_blocks_ptr) * NB
    if RB > 1:
        e = tl.load(block_expert_ptr + mb, mask=lead, other=0)
        lead &= (mb - tl.load(padded_ptr + e) // BM) % RB == 0
    if lead:
        TWO: tl.constexpr = MODE == GATE_UP
        nb = pid % NB
        e = tl.load(block_expert_ptr + mb)
        # blobs start 256-byte aligned and planes 16 (strata.planes): code rows load as vectors
        blob = arena_ptr + tl.multiple_of(tl.load(slot_ptr + e), 256)
        f16 = tl.pointer_type(tl.float16)
        c1 = blob + c1_off
        s1 = (blob + s1_off).to(f16, bitcast=True)
        c2 = blob + c2_off
        s2 = (blob + s2_off).to(f16, bitcast=True)
        if S.TMA:
            B1: tl.constexpr = BK // FMT1.PLANE_PACK                  # code bytes a step
            B2: tl.constexpr = BK // FMT2.PLANE_PACK
            rb1 = n_in // FMT1.PLANE_PACK
            rb2 = n_in // FMT2.PLANE_PACK
            d1 = tl.make_tensor_descriptor(c1, shape=[n_out, rb1], strides=[rb1, 1],
                                           block_shape=[BN, B1])
            d2 = tl.make_tensor_descriptor(c2, shape=[n_out, rb2], strides=[rb2, 1],
                                           block_shape=[BN, B2])
        else:
            d1 = c1
            d2 = c2
        if RB > 1:
            row_end = tl.load(padded_ptr + e + 1)                   # the expert's blocks end here
            offs_m, ids, valid, a_rows = _span_rows(MODE, sorted_ids_ptr, mb, row_end, n_assign,
                                                    TOPK, BM, RB * BM)
        else:
            row_end = None
            offs_m, ids, valid, a_rows = _tile_rows(MODE, sorted_ids_ptr, mb, n_assign, TOPK, BM)
        offs_n = nb * BN + tl.arange(0, BN)
        if EVEN:    # no masks on whole tiles (their compares and selects cost a step ~7%)
            n_mask = tl.full((BN,), True, tl.int1)
        else:
            n_mask = offs_n < n_out
        RBM: tl.constexpr = RB * BM                                   # the program's rows
        if SWAP:
            acc1 = tl.zeros((BN, RBM), tl.float32)
            acc2 = tl.zeros((BN, RBM), tl.float32)
        else:
            acc1 = tl.zeros((RBM, BN), tl.float32)
            acc2 = tl.zeros((RBM, BN), tl.float32)
        a_base = a_ptr + a_rows[:, None].to(tl.int64) * stride_a           # [RBM, 1]
        # Q8_0 / Q4_0's scales are 2-byte gathers the cp.async pipeline does not take: each
        # step's are loaded one step ahead, so their latency hides behind a step of decode and
        # MMA (Q4_K's 16-byte entries it would stage if loaded in their step: the same SASS
        # count at 32x64x64/w4s4/r2, so one path for all)
        f1, g1 = plane_scales(s1, n_in, offs_n, n_mask, 0, BK, FMT1)
        f2, g2 = plane_scales(s2, n_in, offs_n, n_mask & TWO, 0, BK, FMT2)
        # without it the loop may run zero times, that path sets the accumulators to zero by
        # plain moves, and ptxas (C7515) then waits on every wgmma before the next issues
        tl.assume(n_in > 0)
        for k0 in range(0, n_in, BK):
            offs_k = k0 + tl.arange(0, BK)
            if EVEN:
                a_mask = valid[:, None]
            else:
                a_mask = valid[:, None] & (offs_k < n_in)[None, :]
            a = tl.load(a_base + offs_k[None, :], mask=a_mask, other=0.0)   # [RBM, BK] bf16
            nf1, ng1 = plane_scales(s1, n_in, offs_n, n_mask, k0 + BK, BK, FMT1)
            w1 = _weights(c1, d1, f1, g1, n_in, offs_n, n_mask, nb, k0, FMT1, S)
            f1 = nf1
            g1 = ng1
            if TWO:
                nf2, ng2 = plane_scales(s2, n_in, offs_n, n_mask, k0 + BK, BK, FMT2)
                w2 = _weights(c2, d2, f2, g2, n_in, offs_n, n_mask, nb, k0, FMT2, S)
                f2 = nf2
                g2 = ng2
            acc1 = _acc_dot(w1, a, acc1, SWAP, INTERP)
            if TWO:
                acc2 = _acc_dot(w2, a, acc2, SWAP, INTERP)
        if SWAP:
            acc1 = tl.trans(acc1)
            acc2 = tl.trans(acc2)
        f32 = tl.pointer_type(tl.float32)
        _epilogue(MODE, acc1, acc2, out_ptr, stride_out, offs_m, ids, valid, offs_n, n_mask,
                  tw_ptr, INTERP, (blob + boff1).to(f32, bitcast=True),
                  (blob + boff2).to(f32, bitcast=True), alpha, limit, S.BIAS, S.ACT, row_end)


@triton.jit
def _plane_dequant_kernel(c_ptr, s_ptr, out_ptr, n_rows, n_in, BN: tl.constexpr,
                          BK: tl.constexpr, FMT: tl.constexpr, MAGIC: tl.constexpr,
                          FMA: tl.constexpr, INTERP: tl.constexpr):
    """fp32 out [n_rows, n_in] of one matrix's planes (FMT Q8_0 / Q4_0 / Q4_K), through the GEMM's
    own loads and products (load_codes, decoded; FMA True is the GEMM's form), a [BN, BK] tile a
    program (axis 0 rows, axis 1 columns). s_ptr: the scale plane (fp16 d, or Q4_K's bytes)."""
    offs_n = tl.program_id(0) * BN + tl.arange(0, BN)
    k0 = tl.program_id(1) * BK
    n_mask = offs_n < n_rows
    b = load_codes(c_ptr, n_in // FMT.PLANE_PACK, offs_n, n_mask, k0, BK, FMT)
    s, m = plane_scales(s_ptr, n_in, offs_n, n_mask, k0, BK, FMT)
    v = plane_weights(b, s, m, FMT, MAGIC, FMA, INTERP)
    offs_k = k0 + tl.arange(0, BK)
    tl.store(out_ptr + offs_n[:, None].to(tl.int64) * n_in + offs_k[None, :], v,
             mask=n_mask[:, None] & (offs_k < n_in)[None, :])
