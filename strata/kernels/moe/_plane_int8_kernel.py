"""Triton kernel of the int8 expert GEMM over plane-layout Q8_0 / Q4_0 / Q4_K experts (see
strata.kernels.moe.plane_int8 for the op and its twin).

Legend: BM/BN tile sizes; a *tile* is BM sorted rows (one expert) x BN output features; the
reduction runs over the input in 32-wide blocks (the q8_1 blocks, and Q8_0's), KB of them a step.

The op and the arithmetic are strata.kernels.moe._int8_kernel's (MODE GATE_UP / DOWN, the same
epilogues), for Q8_0 and Q4_0 weights (no minimum, one fp16 d a block; Q4_0's codes c = q - 8),
and Q4_K's (below: a scale and a minimum a block):

    acc += P * (da * dw)         P = sum_{k in block} qa[k] * c[k]    (int32, the int8 MMA)

block by block in increasing k, with that kernel's own helpers (_idot, _add_run, _store_q8_1).
What differs is where the weights come from: the plane layout (strata.planes) keeps a matrix's
codes as int8 [N, n_in] row-major (rows 16-byte aligned) and its scales as fp16 [N, n_in / 32],
so a block's codes are one plain [BN, 32] int8 tile (8- or 16-byte cp.async, pipelined) and its
scales a [BN] fp16 gather (or, with WORDS, one word a row for a step's KB blocks), where the
ggml blocks (34 bytes) are read byte by byte.

The plane's codes are in Q8_ORDER inside each 16-group (a permutation for the bf16 GEMM's
register operand); an integer dot is the same whatever the order of its terms, so the
activations' codes come in that order too (strata.kernels.moe.q8's order=True, and the gate/up
epilogue's q8_1 store with ORDER: both permute in registers, _q8_kernel.q8_order, so their
stores stay vectors) and P is the dot in weight order, bit for bit.

A Q4_0 block's codes are 16 bytes (strata.planes: weight pairs in Q4_ORDER, low nibble the even
weight), a step's KB blocks loaded as one [BN, 16 KB] tile and unpacked in registers:
x = byte ^ 0x88 turns each nibble q into the 4-bit two's complement of q - 8, so (x << 4) >> 4
and x >> 4 (int8, arithmetic) are the two weights' int8 codes, byte j's at places j (low) and
16 + j (high) of its block: the k an int8 wgmma's register operand gives lane i of a quad
(4i .. 4i + 3, 16 + 4i .. 16 + 4i + 3) are then four whole code bytes. So the codes are that
operand: the product is taken transposed (acc [BN, BM] += c @ a^T, the same integers and fp32
products, d * da = da * d) and acc transposed once before the epilogue, where codes as the
shared operand were stored to shared memory a byte at a time. The activations come in that
order (strata.planes._q4_act_order; q8_1's ORDER 2).

A Q4_K 32-block (sub-block s of a 256-weight super-block) has the same 16 code bytes (codes q,
0..15: the nibbles unpacked as they are, no - 8, in the same places, so the activation order is
Q4_0's), its scale d * sc[s] and minimum dmin * m[s] (each product exact in fp32: an fp16 times a
6-bit integer), and adds int8.py's minimum term from the activation block's sum sa:

    acc += P * (da * (d sc));   acc -= sa * (dmin m)

The super-block's 16 scale bytes (strata.planes: d, dmin, then sc[s] | m[s] bits 4-5 at byte
4 + s, m's low nibbles at 12 + s / 2) are two 8-byte loads a row a step (_k_words; a step's KB
blocks, KB | 8, lie in one super-block, and there are no blocks left over); a block's sc and m
are constant shifts and masks of words shifted once a step. The activation block sums sa come as
the scales da do (one word a row a step with WORDS).

The launch passes enable_fp_fusion=False (the twin rounds P * (da * dw) and + acc apart).
"""
from __future__ import annotations

from typing import NamedTuple

import triton
import triton.language as tl

from strata.kernels.moe._ffn_kernel import DOWN, GATE_UP, _act, _epilogue, _tile_rows
from strata.kernels.moe._int8_kernel import _add_run, _i2f, _idot, _part, _store_q8_1


class PlaneInt8Spec(NamedTuple):
    """The kernel's compile-time choices, one constexpr `S`: mode, top-k, the tile (BM, BN, KB:
    32-blocks a reduction step, each its own loads and dot), the epilogue's BIAS / ACT, and QH
    (GATE_UP stores h as q8_1 rows, codes in HORD's order: _q8_kernel.code_order), Q4 (the
    matrices read have 4-bit codes: Q4_0, or Q4_K with KQ; else Q8_0), KQ (they are Q4_K: its
    sub-block scales and minimums)."""
    MODE: int
    TOPK: int
    BM: int
    BN: int
    INTERP: bool
    BIAS: bool = False
    ACT: int = 0
    QH: bool = False
    KB: int = 1
    WORDS: bool = False   # a step's KB (2 or 4) scales a row loaded as one word (_scale_words)
    Q4: bool = False
    HORD: int = 1
    KQ: bool = False

    @property
    def cache_key(self) -> str:
        return "|".join(map(str, self))


@triton.jit
def _q4_codes(c_row, j0, n_mask, Q4: tl.constexpr, KB: tl.constexpr, KQ: tl.constexpr = False):
    """With Q4, int8 [BN, 32 KB]: the codes of the 4-bit 32-blocks j0 .. j0 + KB - 1 (c_row
    [BN, 1] uint8 code rows; Q4_0's q - 8, with KQ Q4_K's q), one load a row (16 KB bytes), byte
    j's nibbles at places j and 16 + j of its block (module docstring). Else None."""
    if Q4:
        b = tl.load(c_row + j0 * 16 + tl.arange(0, 16 * KB)[None, :], mask=n_mask[:, None],
                    other=0)
        if KQ:   # 0..15 as they are
            c = tl.join((b & 0xF).to(tl.int8, bitcast=True), (b >> 4).to(tl.int8, bitcast=True))
        else:
            x = (b ^ 0x88).to(tl.int8, bitcast=True)                   # [BN, 16 KB]
            c = tl.join((x << 4) >> 4, x >> 4)                         # [BN, 16 KB, 2]
        c = tl.permute(tl.reshape(c, (c.shape[0], KB, 16, 2)), (0, 1, 3, 2))
        c = tl.reshape(c, (c.shape[0], 32 * KB))
    else:
        c = None
    return c


@triton.jit
def _k_words(k_row, j0, n_mask, KQ: tl.constexpr):
    """With KQ, what the blocks j0 .. j0 + KB - 1 (KB | 8, j0 a multiple of KB) read of their
    Q4_K super-block's 16 plane scale bytes in rows k_row ([BN] int64 pointers to the scale
    rows), as int32 [BN] words: (d | dmin << 16 (fp16 bits), sc_lo, sc_hi, m_lo) where byte jj
    of sc_lo (jj < 4) or jj - 4 of sc_hi is block j0 + jj's sc | m bits 4-5 and nibble jj of m_lo
    its m's low 4 bits. Two 8-byte loads a row (0 where not n_mask) in the layout the scales are
    used in (one [BN, 4] load took a layout of its own and a conversion); the words shifted once
    a step, so each block's fields are constant shifts. Else None."""
    if KQ:
        at = k_row + (j0 // 8) * 2
        lo = tl.load(at, mask=n_mask, other=0)                         # bytes 0-7
        hi = tl.load(at + 1, mask=n_mask, other=0)                     # bytes 8-15
        s0 = j0 % 8                                                    # sub-block of block j0
        w2 = hi.to(tl.int32)
        sc_lo = tl.where(s0 >= 4, w2, (lo >> 32).to(tl.int32)) >> (8 * (s0 % 4))
        k = (lo.to(tl.int32), sc_lo, w2, (hi >> 32).to(tl.int32) >> (4 * s0))
    else:
        k = None
    return k


@triton.jit
def _k_scale(k, jj: tl.constexpr):
    """fp32 (d * sc, dmin * m) [BN] of Q4_K block j0 + jj from _k_words' k: sc the low 6 bits of
    its byte, m its top 2 bits above its nibble. Both products exact (fp16 times 6 bits)."""
    dd, sc_lo, sc_hi, m_lo = k
    d = (dd & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    dmin = (dd >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    if jj < 4:
        b = sc_lo >> (8 * jj)
    else:
        b = sc_hi >> (8 * (jj - 4))
    sc = b & 63
    m = ((b >> 2) & 0x30) | ((m_lo >> (4 * jj)) & 0xF)
    return d * sc.to(tl.float32), dmin * m.to(tl.float32)


@triton.jit
def _plane_block(acc, a, da, c_row, d, k0, n_mask, cs, jj: tl.constexpr, KB: tl.constexpr,
                 Q4: tl.constexpr, KQ: tl.constexpr = False, dm=None, sa=None):
    """acc [BM, BN] (Q4: [BN, BM]) += the 32-block of weights k0 .. k0 + 31 of a Q8_0 (Q4:
    Q4_0, with KQ Q4_K) plane matrix (c_row [BN, 1] its code rows' pointers, int8; d [BN] fp32
    its scales; with Q4 its codes the jj-th 32 columns of the step's cs) against a [BM, 32] int8
    (scales da [BM] fp32) in the matrix's code order; with KQ less the minimum term dm [BN]
    times the activation block sums sa [BM] (fp32)."""
    if Q4:   # transposed: the unpacked codes the MMA's register operand
        c = _part(cs, jj, KB)
        P = tl.dot(c, tl.trans(a), out_dtype=tl.int32)
        acc = acc + _i2f(P) * (d[:, None] * da[None, :])
        if KQ:
            acc = acc - dm[:, None] * sa[None, :]
    else:
        c = tl.load(c_row + k0 + tl.arange(0, 32)[None, :], mask=n_mask[:, None], other=0)
        acc = _add_run(acc, _idot(a, c), da, d, da, d, 0)
    return acc


@triton.jit
def _scale_words(p, at, j0, mask, KB: tl.constexpr, WORDS: tl.constexpr):
    """With WORDS, the fp16 scales of blocks j0 .. j0 + KB - 1 (KB 2 or 4) of rows at (element
    offsets from p, multiples of KB) as one int32 / int64 word a row (0 where not mask): one
    load a row a step where fp16 loads take KB (a thread holds 16 columns of a wgmma
    accumulator, so these loads, not the codes, were most of a step's). Else None."""
    if WORDS:
        tl.static_assert(KB == 2 or KB == 4, "a scale word holds 2 or 4 fp16")
        if KB == 4:
            wp = p.to(tl.pointer_type(tl.int64), bitcast=True)
        else:
            wp = p.to(tl.pointer_type(tl.int32), bitcast=True)
        w = tl.load(wp + at // KB + j0 // KB, mask=mask, other=0)
    else:
        w = None
    return w


@triton.jit
def _scale(w, p, at, j, mask, jj: tl.constexpr, WORDS: tl.constexpr):
    """fp32 [R] scales of block j = j0 + jj in rows at: the jj-th fp16 of the step's words w
    (WORDS), else loaded (0 where not mask)."""
    if WORDS:
        d = ((w >> (16 * jj)) & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True)
    else:
        d = tl.load(p + at + j, mask=mask, other=0.0)
    return d.to(tl.float32)


@triton.jit
def _w_scale(w, k, p, at, j, mask, jj: tl.constexpr, WORDS: tl.constexpr, KQ: tl.constexpr):
    """(d, dm) fp32 [BN] of a matrix's block j = j0 + jj: with KQ Q4_K's from _k_words' k
    (_k_scale), else (_scale's d, d: no minimum)."""
    if KQ:
        d, dm = _k_scale(k, jj)
    else:
        d = _scale(w, p, at, j, mask, jj, WORDS)
        dm = d
    return d, dm


@triton.jit
def _plane_step(qa_base, da_ptr, sa_ptr, ds_at, valid, c1_row, s1_ptr, c2_row, s2_ptr, s_at,
                n_mask, j0, acc1, acc2, TWO: tl.constexpr, KB: tl.constexpr,
                WORDS: tl.constexpr, Q4: tl.constexpr, KQ: tl.constexpr):
    """Blocks j0 .. j0 + KB - 1 of the activations (rows qa_base, scales at da_ptr + ds_at, with
    KQ their sums at sa_ptr + ds_at) against matrix 1 (and 2; scale rows at s*_ptr + s_at, with
    KQ those of int64 words), in increasing order: each block's codes and activations a
    tile of their own (cp.async), the step's scales one word a row where WORDS (Q4_K's weight
    scales: two 8-byte loads a row, _k_words)."""
    wa = _scale_words(da_ptr, ds_at, j0, valid, KB, WORDS)
    if KQ:
        ws = _scale_words(sa_ptr, ds_at, j0, valid, KB, WORDS)
        w1 = None
        k1 = _k_words(s1_ptr + s_at, j0, n_mask, KQ)
    else:
        w1 = _scale_words(s1_ptr, s_at, j0, n_mask, KB, WORDS)
        k1 = None
    cs1 = _q4_codes(c1_row, j0, n_mask, Q4, KB, KQ)
    if TWO:
        if KQ:
            w2 = None
            k2 = _k_words(s2_ptr + s_at, j0, n_mask, KQ)
        else:
            w2 = _scale_words(s2_ptr, s_at, j0, n_mask, KB, WORDS)
            k2 = None
        cs2 = _q4_codes(c2_row, j0, n_mask, Q4, KB, KQ)
    else:
        w2 = w1
        k2 = k1
        cs2 = cs1
    for jj in tl.static_range(KB):
        j = j0 + jj
        k0 = j * 32
        a = tl.load(qa_base + k0 + tl.arange(0, 32)[None, :], mask=valid[:, None], other=0)
        da = _scale(wa, da_ptr, ds_at, j, valid, jj, WORDS)
        if KQ:
            sa = _scale(ws, sa_ptr, ds_at, j, valid, jj, WORDS)
        else:
            sa = da
        d1, dm1 = _w_scale(w1, k1, s1_ptr, s_at, j, n_mask, jj, WORDS, KQ)
        acc1 = _plane_block(acc1, a, da, c1_row, d1, k0, n_mask, cs1, jj, KB, Q4, KQ, dm1, sa)
        if TWO:
            d2, dm2 = _w_scale(w2, k2, s2_ptr, s_at, j, n_mask, jj, WORDS, KQ)
            acc2 = _plane_block(acc2, a, da, c2_row, d2, k0, n_mask, cs2, jj, KB, Q4, KQ, dm2,
                                sa)
    return acc1, acc2


@triton.jit
def _plane_int8_gemm_kernel(
        qa_ptr, da_ptr, sa_ptr, stride_qa, stride_da, sorted_ids_ptr, block_expert_ptr,
        n_assign, arena_ptr, slot_ptr, c1_off, s1_off, c2_off, s2_off, c_rb, out_ptr, stride_out,
        tw_ptr, n_out, n_in, n_blocks_ptr, boff1, boff2, alpha, limit, hd_ptr, hs_ptr, stride_hd,
        S: tl.constexpr):
    """One program a tile, the whole reduction; programs past the device's block count exit.
    sa_ptr: the activations' q8_1 block sums (read only with S.KQ). c*_off / s*_off: byte
    offsets of the code and scale planes from the blob's start, c_rb the bytes of a 4-bit code
    row (n_in / 2: passed, a multiple of 16, so a launch knows its rows 16-byte aligned, where
    n_in // 2 would be known 8-aligned). GATE_UP
    stores h for every row of the tile (fp32 at out_ptr, or with S.QH q8_1 rows: codes in
    S.HORD's order at out_ptr, d and s at hd_ptr / hs_ptr); DOWN the valid rows times their routing
    weight."""
    TWO: tl.constexpr = S.MODE == GATE_UP
    KB: tl.constexpr = S.KB
    BM: tl.constexpr = S.BM
    BN: tl.constexpr = S.BN
    pid = tl.program_id(0)
    NB = tl.cdiv(n_out, BN)
    if pid < tl.load(n_blocks_ptr) * NB:
        mb = pid // NB
        nb = pid % NB
        e = tl.load(block_expert_ptr + mb)
        blob = arena_ptr + tl.multiple_of(tl.load(slot_ptr + e), 256)  # uint8* of expert e's blob
        offs_m, ids, valid, a_rows = _tile_rows(S.MODE, sorted_ids_ptr, mb, n_assign, S.TOPK, BM)
        offs_n = nb * BN + tl.arange(0, BN)
        n_mask = offs_n < n_out
        n64 = offs_n.to(tl.int64)
        if S.Q4:   # 16 uint8 a block
            c1_row = blob + c1_off + n64[:, None] * c_rb                           # [BN, 1]
            c2_row = blob + c2_off + n64[:, None] * c_rb
        else:      # 32 int8 a block
            i8 = tl.pointer_type(tl.int8)
            c1_row = (blob + c1_off).to(i8, bitcast=True) + n64[:, None] * n_in
            c2_row = (blob + c2_off).to(i8, bitcast=True) + n64[:, None] * n_in
        if S.KQ:   # 16 bytes a super-block, as 2 int64 words
            i64 = tl.pointer_type(tl.int64)
            s1 = (blob + s1_off).to(i64, bitcast=True)
            s2 = (blob + s2_off).to(i64, bitcast=True)
            s_at = n64 * (n_in // 128)                                     # [BN] scale rows
        else:
            f16 = tl.pointer_type(tl.float16)
            s1 = (blob + s1_off).to(f16, bitcast=True)
            s2 = (blob + s2_off).to(f16, bitcast=True)
            s_at = n64 * (n_in // 32)                                      # [BN] scale rows
        r64 = a_rows.to(tl.int64)
        qa_base = qa_ptr + r64[:, None] * stride_qa                         # [BM, 1]
        ds_at = r64 * stride_da                                            # [BM]
        if S.Q4:
            acc1 = tl.zeros((BN, BM), tl.float32)
            acc2 = tl.zeros((BN, BM), tl.float32)
        else:
            acc1 = tl.zeros((BM, BN), tl.float32)
            acc2 = tl.zeros((BM, BN), tl.float32)
        n_blk = n_in // 32
        n_main = n_blk // KB
        for i in range(0, n_main):
            acc1, acc2 = _plane_step(qa_base, da_ptr, sa_ptr, ds_at, valid, c1_row, s1, c2_row,
                                     s2, s_at, n_mask, i * KB, acc1, acc2, TWO, KB, S.WORDS,
                                     S.Q4, S.KQ)
        if KB > 1 and not S.KQ:   # the blocks left over, in order (Q4_K: none, KB | 8)
            for j in range(n_main * KB, n_blk):
                acc1, acc2 = _plane_step(qa_base, da_ptr, sa_ptr, ds_at, valid, c1_row, s1,
                                         c2_row, s2, s_at, n_mask, j, acc1, acc2, TWO, 1, False,
                                         S.Q4, S.KQ)
        if S.Q4:
            acc1 = tl.trans(acc1)
            acc2 = tl.trans(acc2)
        f32 = tl.pointer_type(tl.float32)
        b1 = (blob + boff1).to(f32, bitcast=True)   # the biases (read only with BIAS)
        b2 = (blob + boff2).to(f32, bitcast=True)
        if TWO:
            if S.BIAS:
                acc1 += tl.load(b1 + offs_n, mask=n_mask, other=0.0)[None, :]
                acc2 += tl.load(b2 + offs_n, mask=n_mask, other=0.0)[None, :]
            h = _act(acc1, acc2, alpha, limit, S.ACT)
            row = out_ptr + offs_m[:, None].to(tl.int64) * stride_out
            if S.QH:   # codes in the down matrix's order: the down pass's activations
                _store_q8_1(h, row + offs_n[None, :], hd_ptr, hs_ptr, stride_hd, offs_m, nb,
                            n_mask, BM, BN, S.HORD)
            else:
                tl.store(row + offs_n[None, :], h, mask=n_mask[None, :])
        else:
            _epilogue(DOWN, acc1, acc2, out_ptr, stride_out, offs_m, ids, valid, offs_n, n_mask,
                      tw_ptr, S.INTERP, b1, b2, alpha, limit, S.BIAS, S.ACT)
