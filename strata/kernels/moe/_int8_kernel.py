"""Triton kernel of the int8 expert GEMM (see strata.kernels.moe.int8 for the op and its twin).

Legend: BM/BN tile sizes; a *tile* is BM sorted rows (one expert) x BN output features; the
reduction runs over the input in 32-wide blocks (the activations' q8_1 blocks), KB of them a
step (their activations and weight codes loaded at once, then a dot and rescale each).

One kernel, two modes (MODE constexpr), as strata.kernels.moe._ffn_kernel:
  GATE_UP: h[r, f]  = act(x[tok(r)] . gate_e[f] + bg_e[f], x[tok(r)] . up_e[f] + bu_e[f])  fp32
  DOWN:    yk[a, d] = w[a] * (h[r(a)] . down_e[d] + bd_e[d])                a = t*K + k
with every dot product taken on integers, block by block in increasing k, each block added as

    acc += P * (da * dw)         P = sum_{k in block} qa[k] * c[k]    (int32, the int8 MMA)
    acc += sa * m   (or -= )     the weight's run minimum times the activation block's sum

(qa, da, sa: the q8_1 activation block, strata.kernels.moe.q8; c, dw, m: the weight run's int8
codes, scale and minimum, read by the format's traits bundle, strata.kernels.decode). A format
whose scale covers 16 weights (Q6_K, Q2_K, Q3_K) takes two MMAs a block, each with the other half
of the codes zeroed, and its minimum (Q2_K) the half block's code sum times da.

The launch passes enable_fp_fusion=False: a fused multiply-add would round P * (da * dw) + acc
once where the torch twin rounds twice, and the twin's bits are the contract.
"""
from __future__ import annotations

from typing import NamedTuple

import triton
import triton.language as tl

from strata.kernels.moe._ffn_kernel import DOWN, GATE_UP, _act, _epilogue, _tile_rows
from strata.kernels.moe._q8_kernel import code_order, q8_1_block


class Int8Spec(NamedTuple):
    """The kernel's compile-time choices, one constexpr `S`: mode, top-k, the two matrices' format
    bundles and the sign of their minimum (MIN1/MIN2: 0 none, 1 w = d*c + m, -1 w = d*c - m),
    the tile (BM, BN, KB), and the epilogue's BIAS / ACT."""
    MODE: int
    TOPK: int
    FMT1: object
    FMT2: object
    MIN1: int
    MIN2: int
    BM: int
    BN: int
    INTERP: bool
    BIAS: bool = False
    ACT: int = 0
    QH: bool = False   # GATE_UP stores h as q8_1 rows (codes, d, s), not fp32
    KB: int = 1        # q8_1 blocks a reduction step loads at once (1, 2, 4, 8)

    @property
    def cache_key(self) -> str:
        return "|".join(str(getattr(v, "cache_key", v)) for v in self)


@triton.jit
def _run_scale(FMT: tl.constexpr, w_ptr, rb, offs_n, k, n_mask):
    """(d [BN], m [BN]) of the run holding weight k (a scalar) in rows offs_n: the format's scale
    and, for a PAIR format, its minimum (else 0). 0 where n_mask is False."""
    BN: tl.constexpr = offs_n.shape[0]
    ok = k + tl.zeros((1,), tl.int32)                                  # [1]
    m2 = n_mask[:, None]                                               # [BN, 1]
    if FMT.PAIR:
        d, mn = FMT.scale(w_ptr, rb, offs_n, ok, m2)
        mn = tl.reshape(tl.where(m2, mn, 0.0), (BN,))
    else:
        d = FMT.scale(w_ptr, rb, offs_n, ok, m2)
        mn = tl.zeros((BN,), tl.float32)
    return tl.reshape(tl.where(m2, d, 0.0), (BN,)), mn


@triton.jit
def _idot(a, c):
    """int32 [BM, BN] = a [BM, 32] int8 @ c [BN, 32]^T int8 (the int8 tensor cores)."""
    return tl.dot(a, tl.trans(c), out_dtype=tl.int32)


@triton.jit
def _i2f(P):
    """int32 -> fp32 for |P| < 2**22 without the int-to-float conversion (1/8 of the FMA rate on
    Hopper): the bits 0x4B400000 + P are the float 1.5 * 2**23 + P (one unit a step in
    [2**23, 2**24)) and subtracting 1.5 * 2**23 is exact. A block's |P| <= 32 * 128 * 128
    = 2**19."""
    return (P + 0x4B400000).to(tl.float32, bitcast=True) - 12582912.0


@triton.jit
def _add_run(acc, P, da, d, sa, mn, MIN: tl.constexpr):
    """acc + P * (da * d), then the minimum term sa * mn added (MIN 1) or taken off (MIN -1)."""
    acc = acc + _i2f(P) * (da[:, None] * d[None, :])
    if MIN == 1:
        acc = acc + sa[:, None] * mn[None, :]
    elif MIN == -1:
        acc = acc - sa[:, None] * mn[None, :]
    return acc


@triton.jit
def _block(FMT: tl.constexpr, MIN: tl.constexpr, a, da, sa, c, w_ptr, rb, offs_n, n_mask, k0,
           acc):
    """acc [BM, BN] += one 32-weight block (first weight k0) of a matrix, its codes c [BN, 32]
    int8, against activations a [BM, 32] int8 (scale da [BM], sum sa [BM] as fp32)."""
    if FMT.RUN == 32:
        d, mn = _run_scale(FMT, w_ptr, rb, offs_n, k0, n_mask)
        acc = _add_run(acc, _idot(a, c), da, d, sa, mn, MIN)
    else:
        tl.static_assert(FMT.RUN == 16, "the int8 GEMM reads runs of 32 or 16 weights")
        for half in tl.static_range(2):
            sel = ((tl.arange(0, 32) // 16) == half)[None, :]           # [1, 32] this half
            ch = tl.where(sel, c, tl.zeros_like(c))
            d, mn = _run_scale(FMT, w_ptr, rb, offs_n, k0 + 16 * half, n_mask)
            if MIN != 0:   # the half block's sum: da * (int sum of its codes)
                ah = tl.where(sel, a, tl.zeros_like(a))
                sa = tl.sum(ah.to(tl.int32), axis=1).to(tl.float32) * da
            acc = _add_run(acc, _idot(a, ch), da, d, sa, mn, MIN)
    return acc


@triton.jit
def _part(x, J: tl.constexpr, KB: tl.constexpr):
    """Columns [J W, J W + W) of x [R, KB W] as [R, W]: the KB parts as a [R, W, KB] view,
    halved log2 KB times (bit b of J picks the half at level b). Moves data only: exact."""
    if KB == 1:
        y = x
    else:
        tl.static_assert(KB == 2 or KB == 4 or KB == 8, "a step covers 1, 2, 4 or 8 blocks")
        R: tl.constexpr = x.shape[0]
        W: tl.constexpr = x.shape[1] // KB
        y = tl.permute(tl.reshape(x, (R, KB, W)), (0, 2, 1))          # [R, W, KB]
        if KB == 4:
            y = tl.reshape(y, (R, W, 2, 2))                            # part 2 j1 + j0
        elif KB == 8:
            y = tl.reshape(y, (R, W, 2, 2, 2))
        for b in tl.static_range(3):
            if (KB >> b) > 1:   # level b of log2 KB
                lo, hi = tl.split(y)
                if (J >> b) & 1:
                    y = hi
                else:
                    y = lo
    return y


@triton.jit
def _ds(v, J: tl.constexpr, KB: tl.constexpr):
    """[BM] fp32: block J's column of the step's q8_1 scales or sums v ([BM] when KB is 1, else
    [BM, KB])."""
    if KB == 1:
        y = v
    else:
        y = tl.reshape(_part(v, J, KB), (v.shape[0],))
    return y


@triton.jit
def _load_ds(p, ds_at, j0, valid, KB: tl.constexpr):
    """fp32 q8_1 scales (or sums) at p of blocks j0 .. j0 + KB - 1 in rows ds_at: [BM] for one
    block, else [BM, KB]; 0 where not valid."""
    if KB == 1:
        v = tl.load(p + ds_at + j0, mask=valid, other=0.0)
    else:
        at = ds_at[:, None] + j0 + tl.arange(0, KB)[None, :]
        v = tl.load(p + at, mask=valid[:, None], other=0.0)
    return v.to(tl.float32)


@triton.jit
def _blocks(FMT: tl.constexpr, MIN: tl.constexpr, KB: tl.constexpr, a, da, sa, w_ptr, rb, offs_n,
            n_mask, k0, acc):
    """acc [BM, BN] += KB consecutive 32-weight blocks from weight k0, in increasing order, of a
    matrix against a [BM, 32 KB] int8 (da, sa as _load_ds gives them): the weights' codes of
    the KB blocks decoded at once, then one block's dot and rescale after the other."""
    offs_k = k0 + tl.arange(0, 32 * KB)
    c = FMT.code(w_ptr, rb, offs_n, offs_k, n_mask[:, None], None)     # fp32 [BN, 32 KB] integers
    c = tl.where(n_mask[:, None], c, 0.0).to(tl.int8)
    for j in tl.static_range(KB):
        acc = _block(FMT, MIN, _part(a, j, KB), _ds(da, j, KB), _ds(sa, j, KB),
                     _part(c, j, KB), w_ptr, rb, offs_n, n_mask, k0 + 32 * j, acc)
    return acc


@triton.jit
def _step(qa_base, da_ptr, sa_ptr, ds_at, valid, w1_ptr, rb1, w2_ptr, rb2, offs_n, n_mask, j0,
          acc1, acc2, S: tl.constexpr, KB: tl.constexpr):
    """One reduction step: q8_1 blocks j0 .. j0 + KB - 1 of the activations (loaded at once)
    against matrix 1 (and 2 in GATE_UP)."""
    # bound as constexprs: a bundle passed on as S.FMT1 would travel as a tuple of values
    TWO: tl.constexpr = S.MODE == GATE_UP
    FMT1: tl.constexpr = S.FMT1
    FMT2: tl.constexpr = S.FMT2
    MIN1: tl.constexpr = S.MIN1
    MIN2: tl.constexpr = S.MIN2
    k0 = j0 * 32
    a = tl.load(qa_base + k0 + tl.arange(0, 32 * KB)[None, :], mask=valid[:, None], other=0)
    da = _load_ds(da_ptr, ds_at, j0, valid, KB)
    sa = _load_ds(sa_ptr, ds_at, j0, valid, KB)
    acc1 = _blocks(FMT1, MIN1, KB, a, da, sa, w1_ptr, rb1, offs_n, n_mask, k0, acc1)
    if TWO:
        acc2 = _blocks(FMT2, MIN2, KB, a, da, sa, w2_ptr, rb2, offs_n, n_mask, k0, acc2)
    return acc1, acc2


@triton.jit
def _int8_mma(qa_ptr, da_ptr, sa_ptr, stride_qa, stride_da, a_rows, valid, w1_ptr, rb1, w2_ptr,
              rb2, offs_n, n_mask, n_in, S: tl.constexpr):
    """(acc1, acc2) fp32 [BM, BN]: rows a_rows of the q8_1 activations against matrix 1 (and 2
    in GATE_UP) over the whole input, 32-weight blocks in increasing order: steps of S.KB blocks,
    then the blocks left over (n_in / 32 not a multiple of S.KB) one a step, so every block's
    terms are added in the same order whatever S.KB is."""
    BM: tl.constexpr = S.BM
    BN: tl.constexpr = S.BN
    KB: tl.constexpr = S.KB
    acc1 = tl.zeros((BM, BN), tl.float32)
    acc2 = tl.zeros((BM, BN), tl.float32)
    r64 = a_rows.to(tl.int64)
    qa_base = qa_ptr + r64[:, None] * stride_qa                        # [BM, 1]
    ds_at = r64 * stride_da                                            # [BM]
    n_blk = n_in // 32
    n_main = n_blk // KB
    for i in range(0, n_main):
        acc1, acc2 = _step(qa_base, da_ptr, sa_ptr, ds_at, valid, w1_ptr, rb1, w2_ptr, rb2,
                           offs_n, n_mask, i * KB, acc1, acc2, S, KB)
    if KB > 1:
        for j in range(n_main * KB, n_blk):
            acc1, acc2 = _step(qa_base, da_ptr, sa_ptr, ds_at, valid, w1_ptr, rb1, w2_ptr, rb2,
                               offs_n, n_mask, j, acc1, acc2, S, 1)
    return acc1, acc2


@triton.jit
def _store_q8_1(h, ptr, hd_ptr, hs_ptr, stride_hd, offs_m, nb, n_mask, BM: tl.constexpr,
                BN: tl.constexpr, ORDER: tl.constexpr = 0):
    """h fp32 [BM, BN] as q8_1 rows: codes int8 at ptr [BM, BN], d and s (fp16) of its BN/32
    blocks at row offs_m, block nb*BN/32 + j; blocks past the matrix's width are not stored.
    ORDER: the codes in a plane format's order (_q8_kernel.code_order)."""
    tl.static_assert(BN % 32 == 0, "a fused q8_1 epilogue needs whole 32-blocks a tile")
    NJ: tl.constexpr = BN // 32
    q, d, s = q8_1_block(tl.reshape(h, (BM * NJ, 32)))
    q = q.to(tl.int8)
    q = code_order(q, ORDER)
    tl.store(ptr, tl.reshape(q, (BM, BN)), mask=n_mask[None, :])
    j = nb * NJ + tl.arange(0, NJ)                                     # [NJ] block index
    jm = tl.reshape(n_mask, (NJ, 32)).to(tl.int32)
    j_ok = (tl.max(jm, axis=1) > 0)[None, :]                           # [1, NJ]
    at = offs_m[:, None].to(tl.int64) * stride_hd + j[None, :]
    tl.store(hd_ptr + at, tl.reshape(d, (BM, NJ)).to(tl.float16), mask=j_ok)
    tl.store(hs_ptr + at, tl.reshape(s, (BM, NJ)).to(tl.float16), mask=j_ok)


@triton.jit
def _int8_gemm_kernel(
        qa_ptr, da_ptr, sa_ptr, stride_qa, stride_da, sorted_ids_ptr, block_expert_ptr, n_assign,
        arena_ptr, slot_ptr, off1, rb1, off2, rb2, out_ptr, stride_out, tw_ptr, n_out, n_in,
        n_blocks_ptr, boff1, boff2, alpha, limit, hd_ptr, hs_ptr, stride_hd, S: tl.constexpr):
    """One program a tile, the whole reduction (data-parallel); programs past the device's block
    count exit. GATE_UP stores h for every row of the tile (padding rows as act(bias)): fp32 at
    out_ptr, or with S.QH its q8_1 rows (codes at out_ptr, d and s at hd_ptr / hs_ptr; BN a
    multiple of 32, so a tile holds whole blocks). DOWN stores the valid rows times their
    routing weight (the fused GEMM's epilogue)."""
    pid = tl.program_id(0)
    NB = tl.cdiv(n_out, S.BN)
    if pid < tl.load(n_blocks_ptr) * NB:
        mb = pid // NB
        nb = pid % NB
        e = tl.load(block_expert_ptr + mb)
        blob = arena_ptr + tl.multiple_of(tl.load(slot_ptr + e), 256)  # uint8* of expert e's blob
        offs_m, ids, valid, a_rows = _tile_rows(S.MODE, sorted_ids_ptr, mb, n_assign, S.TOPK, S.BM)
        offs_n = nb * S.BN + tl.arange(0, S.BN)
        n_mask = offs_n < n_out
        acc1, acc2 = _int8_mma(qa_ptr, da_ptr, sa_ptr, stride_qa, stride_da, a_rows, valid,
                               blob + off1, rb1, blob + off2, rb2, offs_n, n_mask, n_in, S)
        f32 = tl.pointer_type(tl.float32)
        b1 = (blob + boff1).to(f32, bitcast=True)   # the biases (read only with BIAS)
        b2 = (blob + boff2).to(f32, bitcast=True)
        if S.MODE == GATE_UP:
            if S.BIAS:
                acc1 += tl.load(b1 + offs_n, mask=n_mask, other=0.0)[None, :]
                acc2 += tl.load(b2 + offs_n, mask=n_mask, other=0.0)[None, :]
            h = _act(acc1, acc2, alpha, limit, S.ACT)
            ptr = out_ptr + offs_m[:, None].to(tl.int64) * stride_out + offs_n[None, :]
            if S.QH:
                _store_q8_1(h, ptr, hd_ptr, hs_ptr, stride_hd, offs_m, nb, n_mask, S.BM, S.BN)
            else:
                tl.store(ptr, h, mask=n_mask[None, :])
        else:
            _epilogue(DOWN, acc1, acc2, out_ptr, stride_out, offs_m, ids, valid, offs_n, n_mask,
                      tw_ptr, S.INTERP, b1, b2, alpha, limit, S.BIAS, S.ACT)
