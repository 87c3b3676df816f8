"""Triton kernels of the expert GEMM (see strata.kernels.moe.ffn for the op and its reference).

Legend: BM/BN/BK tile sizes; a *tile* is BM sorted rows (one expert) x BN output features; an
*iteration* is one BK step of a tile's reduction, KI = cdiv(n_in, BK) per tile.

One kernel, two modes (MODE constexpr):
  GATE_UP: h[r, f]  = act(x[tok(r)] . gate_e[f] + bg_e[f], x[tok(r)] . up_e[f] + bu_e[f])
  DOWN:    yk[a, d] = w[a] * (h[r(a)] . down_e[d] + bd_e[d])                a = t*K + k
act (ACT constexpr, strata.blob.ExpertAct): 0 silu(g)·u; 1 GPT-OSS's clamped SwiGLU. The biases
(BIAS constexpr) are fp32 vectors inside the expert's blob (strata.blob.BiasSlot), at byte
offsets boff1 (gate, or down) and boff2 (up) from the blob's start; without BIAS they are 0.
and two schedules (SCHED constexpr):
  DP:       one program per tile, the whole reduction.
  STREAM_K: P programs; program p owns iterations [s_p, s_{p+1}) of the n_tiles*KI total
            (s_p = p*base + min(p, extra)). A tile a program covers whole gets the epilogue at
            once; a piece of a split tile goes as fp32 to fixup scratch slot 2p (the program's
            first piece) or 2p+1 (its last piece), and `_moe_fixup_kernel` sums every split
            tile's pieces in program order and applies the epilogue: deterministic, no atomics,
            no waiting on other programs.
Both read the row-block count from the device (`n_blocks_ptr`, int32 [1]): n_tiles =
n_blocks * cdiv(n_out, BN), so routing never has to reach the host to size a launch; the DP grid
is the plan's bound (LaunchPlan.max_blocks) and programs past n_tiles do nothing.
"""
from __future__ import annotations

from typing import NamedTuple

import triton
import triton.language as tl

from strata.kernels.decode import (FAST_CODE_FORMATS, SCALED_CODE_FORMATS,  # noqa: F401
                                   TRITON_FORMATS, code_run, codes_from_bytes,
                                   decode_codes, decode_run_scale, decode_tile,
                                   decode_tile_runs, load_code_bytes)
from strata.kernels.moe.tiles import DOT_VARIANTS


def dot_plan(fmt1: str, fmt2: str, block_k: int, variant: str) -> dict:
    """The kernel's constexprs (SC1, SC2, RUN, SW, FAST, PF, W16, MAGIC) for matrices of formats
    fmt1/fmt2 (names) under dot variant `variant` (strata.kernels.moe.tiles.DOT_VARIANTS; a
    TileConfig's `dot`). A swap_fast* variant applies to Q8_0/Q4_0 pairs; other pairs decode.

    A matrix takes the scaled-code path when its format is in SCALED_CODE_FORMATS and BLOCK_K
    holds whole runs; when both qualify with different runs (Q2_0's 64 beside a 32), matrix 2
    falls back to decoding."""
    assert variant in DOT_VARIANTS, variant
    fast = (variant.startswith("swap_fast") and fmt1 in FAST_CODE_FORMATS
            and fmt2 in FAST_CODE_FORMATS and block_k % 32 == 0)
    if variant.startswith("swap_fast") and not fast:
        # outside Q8_0/Q4_0 the generic scaled paths measured slower than decoding (H200,
        # experiments/results/decoded_dot_ab.csv: scaled_swap 20.6 vs decode 25.0 TFLOP/s)
        variant = "decode"

    def ok(f):
        return variant != "decode" and f in SCALED_CODE_FORMATS and block_k % code_run(f) == 0
    sc1, sc2 = ok(fmt1), ok(fmt2)
    run = code_run(fmt1) if sc1 else code_run(fmt2) if sc2 else 32
    if sc1 and sc2 and code_run(fmt2) != run:
        sc2 = False
    sw = variant != "decode" and variant != "scaled"
    return dict(SC1=sc1, SC2=sc2, RUN=run, SW=sw, FAST=fast, PF=fast and "_pf" in variant,
                W16=fast and "_w16" in variant, MAGIC=fast and variant.endswith("_magic"))


class GemmSpec(NamedTuple):
    """The GEMM's compile-time choices, one constexpr argument `S` (the launcher builds it once a
    mode): MODE, TOPK, the two matrices' format bundles (strata.kernels.decode.format_traits),
    the tile, the interpreter flag, dot_plan's path constexprs, and the epilogue's BIAS / ACT."""
    MODE: int
    TOPK: int
    FMT1: object
    FMT2: object
    BM: int
    BN: int
    BK: int
    INTERP: bool
    SC1: bool = False
    SC2: bool = False
    RUN: int = 32
    SW: bool = False
    FAST: bool = False
    PF: bool = False
    W16: bool = False
    MAGIC: bool = False
    BIAS: bool = False
    ACT: int = 0

    @property
    def cache_key(self) -> str:
        """Triton's on-disk cache key of a kernel specialised on it (the bundles' own keys)."""
        return "|".join(str(getattr(v, "cache_key", v)) for v in self)


GATE_UP: tl.constexpr = tl.constexpr(0)
DOWN: tl.constexpr = tl.constexpr(1)


@triton.jit
def _bf16(x, INTERP: tl.constexpr):
    """fp32 -> bf16, round to nearest even. The GPU's cvt does that; the interpreter's cast
    truncates (and its "rtne" mode mis-carries into the exponent), so there the rounding is done
    on the bits: add 0x7FFF plus the lowest kept bit, keep the top 16."""
    if INTERP:
        u = x.to(tl.uint32, bitcast=True)
        u = u + 0x7FFF + ((u >> 16) & 1)
        y = (u >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        y = x.to(tl.bfloat16)
    return y


@triton.jit
def _w_tile(FMT: tl.constexpr, w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr,
            INTERP: tl.constexpr):
    """Weights [BN, BK] as bf16 for tl.dot: BF16 read as is, every other format decoded."""
    if FMT.NATIVE:
        # cast the scalar base, not a pointer tensor (triton 3.6's coalesce pass asserts on a
        # tensor-of-pointers bitcast between element sizes); rows are 2-byte aligned
        p16 = w_ptr.to(tl.pointer_type(tl.bfloat16), bitcast=True)
        idx = offs_n[:, None].to(tl.int64) * (row_bytes >> 1) + offs_k[None, :]
        w = tl.load(p16 + idx, mask=mask, other=0.0)
    elif offs_k.shape[0] % 32 == 0:
        # whole aligned runs of 32 (K loop steps are multiples of BK): scales read once per run
        w = _bf16(decode_tile_runs(FMT, w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr), INTERP)
    else:
        w = _bf16(decode_tile(FMT, w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr), INTERP)
    return w


@triton.jit
def _dot(a, w, acc, INTERP: tl.constexpr):
    """acc += a @ w^T. The interpreter stores bf16 as raw uint16 and its tl.dot multiplies those
    bit patterns, so there (INTERP) both operands go up to fp32 first: bf16 products are exact in
    fp32, so the result is the same math; on the GPU the dot runs on bf16 tensor cores."""
    if INTERP:
        acc = tl.dot(a.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
    else:
        acc = tl.dot(a, tl.trans(w), acc)
    return acc


@triton.jit
def _tile_rows(MODE: tl.constexpr, sorted_ids_ptr, mb, n_assign, TOPK: tl.constexpr,
               BM: tl.constexpr):
    offs_m = mb * BM + tl.arange(0, BM)                              # [BM] padded row
    ids = tl.load(sorted_ids_ptr + offs_m)                            # [BM] assignment or sentinel
    valid = ids < n_assign
    if MODE == GATE_UP:
        a_rows = ids // TOPK                                          # token of the assignment
    else:
        a_rows = offs_m                                               # row of h
    return offs_m, ids, valid, a_rows


@triton.jit
def _dot_nt(a, b, INTERP: tl.constexpr):
    """a @ b^T from a fresh fp32 accumulator (bf16 operands; fp32 in the interpreter, see _dot)."""
    acc = tl.zeros((a.shape[0], b.shape[0]), tl.float32)
    return _dot(a, b, acc, INTERP)


@triton.jit
def _scaled_run(FMT: tl.constexpr, w_ptr, rb, a_r, offs_n, n_mask, k_run, kr_mask, n_in, acc,
                SW: tl.constexpr, INTERP: tl.constexpr):
    """acc += (a_r @ codes^T) * s: one run (RUN weights sharing a scale) of a scaled-code format.
    The codes go to the tensor cores as exact bf16, the run's scale multiplies the partial sum.
    SW: acc is [BN, BM] and the codes are the dot's first operand (kept in registers by the MMA;
    only a_r goes through shared memory), else acc is [BM, BN]."""
    c = decode_codes(FMT, w_ptr, rb, offs_n, k_run + tl.arange(0, a_r.shape[1]),
                     n_mask[:, None] & kr_mask[None, :]).to(tl.bfloat16)   # [BN, RUN] exact
    s = decode_run_scale(FMT, w_ptr, rb, offs_n, k_run, n_mask & (k_run < n_in))   # [BN]
    if SW:
        acc += _dot_nt(c, a_r, INTERP) * s[:, None]
    else:
        acc += _dot_nt(a_r, c, INTERP) * s[None, :]
    return acc


@triton.jit
def _fast_part(FMT: tl.constexpr, lo, hi, a_lo, a_hi, W16: tl.constexpr, MAGIC: tl.constexpr,
               INTERP: tl.constexpr):
    """[BN, BM] codes @ a^T of one 32-weight run, the codes as two 16-wide halves."""
    c_lo, c_hi = codes_from_bytes(FMT, lo, hi, W16, MAGIC)
    part = _dot_nt(c_lo.to(tl.bfloat16), a_lo, INTERP)
    return _dot(c_hi.to(tl.bfloat16), a_hi, part, INTERP)


@triton.jit
def _fast_runs(a_base, valid, w1_ptr, rb1, w2_ptr, rb2, offs_n, n_mask, k_lo, k_hi, n_in, acc1,
               acc2, S: tl.constexpr):
    """The FAST path of _mma (accumulators [BN, BM]): one iteration per 32-weight run of steps
    [k_lo, k_hi); S.PF loads run r+1's code bytes and scales during run r."""
    FMT1: tl.constexpr = S.FMT1
    FMT2: tl.constexpr = S.FMT2
    TWO: tl.constexpr = S.MODE == GATE_UP
    BK: tl.constexpr = S.BK
    INTERP: tl.constexpr = S.INTERP
    PF: tl.constexpr = S.PF
    W16: tl.constexpr = S.W16
    MAGIC: tl.constexpr = S.MAGIC
    R: tl.constexpr = BK // 32
    r_lo = k_lo * R
    r_hi = k_hi * R
    if PF:
        m0 = n_mask & (r_lo * 32 < n_in)
        l1, h1 = load_code_bytes(FMT1, w1_ptr, rb1, offs_n, r_lo * 32, m0, W16)
        s1 = decode_run_scale(FMT1, w1_ptr, rb1, offs_n, r_lo * 32, m0)
        if TWO:
            l2, h2 = load_code_bytes(FMT2, w2_ptr, rb2, offs_n, r_lo * 32, m0, W16)
            s2 = decode_run_scale(FMT2, w2_ptr, rb2, offs_n, r_lo * 32, m0)
    for rr in range(r_lo, r_hi):
        k_run = rr * 32
        ok = k_run < n_in
        if PF:
            cl1, ch1, cs1 = l1, h1, s1
            mn = n_mask & (k_run + 32 < n_in) & (rr + 1 < r_hi)
            l1, h1 = load_code_bytes(FMT1, w1_ptr, rb1, offs_n, k_run + 32, mn, W16)
            s1 = decode_run_scale(FMT1, w1_ptr, rb1, offs_n, k_run + 32, mn)
            if TWO:
                cl2, ch2, cs2 = l2, h2, s2
                l2, h2 = load_code_bytes(FMT2, w2_ptr, rb2, offs_n, k_run + 32, mn, W16)
                s2 = decode_run_scale(FMT2, w2_ptr, rb2, offs_n, k_run + 32, mn)
        else:
            m = n_mask & ok
            cl1, ch1 = load_code_bytes(FMT1, w1_ptr, rb1, offs_n, k_run, m, W16)
            cs1 = decode_run_scale(FMT1, w1_ptr, rb1, offs_n, k_run, m)
            if TWO:
                cl2, ch2 = load_code_bytes(FMT2, w2_ptr, rb2, offs_n, k_run, m, W16)
                cs2 = decode_run_scale(FMT2, w2_ptr, rb2, offs_n, k_run, m)
        offs_a = k_run + tl.arange(0, 16)
        am = valid[:, None] & ok
        a_lo = tl.load(a_base + offs_a[None, :], mask=am, other=0.0)           # [BM, 16]
        a_hi = tl.load(a_base + 16 + offs_a[None, :], mask=am, other=0.0)
        # both matrices' dots before either is scaled: the MMAs can overlap
        p1 = _fast_part(FMT1, cl1, ch1, a_lo, a_hi, W16, MAGIC, INTERP)
        if TWO:
            p2 = _fast_part(FMT2, cl2, ch2, a_lo, a_hi, W16, MAGIC, INTERP)
            acc2 += p2 * cs2[:, None]
        acc1 += p1 * cs1[:, None]
    return acc1, acc2


@triton.jit
def _mma(a_ptr, a_rows, valid, stride_a, w1_ptr, rb1, w2_ptr, rb2, offs_n, n_mask, k_lo, k_hi,
         n_in, tab_ptr, S: tl.constexpr):
    """acc1 (and acc2 when S.MODE is GATE_UP) [BM, BN] fp32 over reduction steps [k_lo, k_hi).

    S.SC1/SC2: matrix 1/2 takes the scaled-code path (_scaled_run, RUN weights a run, BK % RUN ==
    0; both scaled ones share RUN, see dot_plan), else the weights are decoded to bf16 (_w_tile)."""
    FMT1: tl.constexpr = S.FMT1
    FMT2: tl.constexpr = S.FMT2
    SC1: tl.constexpr = S.SC1
    SC2: tl.constexpr = S.SC2
    SW: tl.constexpr = S.SW
    TWO: tl.constexpr = S.MODE == GATE_UP
    BM: tl.constexpr = S.BM
    BN: tl.constexpr = S.BN
    BK: tl.constexpr = S.BK
    RUN: tl.constexpr = S.RUN
    INTERP: tl.constexpr = S.INTERP
    S1: tl.constexpr = SC1 and SW
    S2: tl.constexpr = SC2 and SW and TWO
    if S1:
        acc1 = tl.zeros((BN, BM), tl.float32)
    else:
        acc1 = tl.zeros((BM, BN), tl.float32)
    if S2:
        acc2 = tl.zeros((BN, BM), tl.float32)
    else:
        acc2 = tl.zeros((BM, BN), tl.float32)
    PLAIN: tl.constexpr = (not SC1) or (TWO and not SC2)
    SCALED: tl.constexpr = SC1 or (TWO and SC2)
    a_base = a_ptr + a_rows[:, None].to(tl.int64) * stride_a          # [BM, 1]
    if S.FAST:
        acc1, acc2 = _fast_runs(a_base, valid, w1_ptr, rb1, w2_ptr, rb2, offs_n, n_mask, k_lo,
                                k_hi, n_in, acc1, acc2, S)
    else:
        for kk in range(k_lo, k_hi):
            if PLAIN:
                offs_k = kk * BK + tl.arange(0, BK)                    # [BK]
                k_mask = offs_k < n_in
                a = tl.load(a_base + offs_k[None, :], mask=valid[:, None] & k_mask[None, :],
                            other=0.0)
                wmask = n_mask[:, None] & k_mask[None, :]              # [BN, BK]
                if not SC1:
                    w1 = _w_tile(FMT1, w1_ptr, rb1, offs_n, offs_k, wmask, tab_ptr, INTERP)
                    acc1 = _dot(a, w1, acc1, INTERP)
                if TWO and not SC2:
                    w2 = _w_tile(FMT2, w2_ptr, rb2, offs_n, offs_k, wmask, tab_ptr, INTERP)
                    acc2 = _dot(a, w2, acc2, INTERP)
            if SCALED:
                for r in tl.static_range(BK // RUN):
                    k_run = kk * BK + r * RUN
                    offs_r = k_run + tl.arange(0, RUN)                 # [RUN]
                    kr_mask = offs_r < n_in
                    a_r = tl.load(a_base + offs_r[None, :],
                                  mask=valid[:, None] & kr_mask[None, :], other=0.0)  # [BM, RUN]
                    if SC1:
                        acc1 = _scaled_run(FMT1, w1_ptr, rb1, a_r, offs_n, n_mask, k_run,
                                           kr_mask, n_in, acc1, SW, INTERP)
                    if TWO and SC2:
                        acc2 = _scaled_run(FMT2, w2_ptr, rb2, a_r, offs_n, n_mask, k_run,
                                           kr_mask, n_in, acc2, SW, INTERP)
    if S1:
        acc1 = tl.trans(acc1)
    if S2:
        acc2 = tl.trans(acc2)
    return acc1, acc2


@triton.jit
def _bias_ptr(arena_ptr, slot_ptr, e, boff):
    """fp32* of a bias vector boff bytes into expert e's blob (bias regions are 256-aligned)."""
    blob = arena_ptr + tl.multiple_of(tl.load(slot_ptr + e), 256)
    return (blob + boff).to(tl.pointer_type(tl.float32), bitcast=True)


@triton.jit
def _act(g, u, alpha, limit, ACT: tl.constexpr):
    """h = act(g, u) in fp32 (see strata.blob.ExpertAct)."""
    if ACT == 0:
        h = g / (1.0 + tl.exp(-g)) * u                                  # silu(gate) * up
    else:
        g = tl.minimum(g, limit)
        u = tl.minimum(tl.maximum(u, -limit), limit)
        h = g / (1.0 + tl.exp(-alpha * g)) * (u + 1.0)                  # g·sigmoid(αg)·(u+1)
    return h


@triton.jit
def _epilogue(MODE: tl.constexpr, acc1, acc2, out_ptr, stride_out, offs_m, ids, valid, offs_n,
              n_mask, tw_ptr, INTERP: tl.constexpr, b1_ptr, b2_ptr, alpha, limit,
              BIAS: tl.constexpr, ACT: tl.constexpr, row_end=None):
    """GATE_UP stores every row of the tile (its padding rows too, as act(0, 0)) below row_end
    (None: all of them; a tile that spans blocks of one expert stops where the next expert's
    rows begin), DOWN only its valid rows, each times its routing weight."""
    if BIAS:
        acc1 += tl.load(b1_ptr + offs_n, mask=n_mask, other=0.0)[None, :]
        if MODE == GATE_UP:
            acc2 += tl.load(b2_ptr + offs_n, mask=n_mask, other=0.0)[None, :]
    if MODE == GATE_UP:
        h = _act(acc1, acc2, alpha, limit, ACT)
        ptr = out_ptr + offs_m[:, None].to(tl.int64) * stride_out + offs_n[None, :]
        if row_end is None:
            tl.store(ptr, _bf16(h, INTERP), mask=n_mask[None, :])
        else:
            tl.store(ptr, _bf16(h, INTERP), mask=(offs_m < row_end)[:, None] & n_mask[None, :])
    else:
        w = tl.load(tw_ptr + ids, mask=valid, other=0.0)                # [BM] routing weight
        ptr = out_ptr + ids[:, None].to(tl.int64) * stride_out + offs_n[None, :]
        tl.store(ptr, acc1 * w[:, None], mask=valid[:, None] & n_mask[None, :])


@triton.jit
def _tile(t, k_lo, k_hi, pid, last, ROWS, WTS, OUT, tab_ptr, EPI, n_out, n_in, S: tl.constexpr,
          SPLIT: tl.constexpr):
    """Reduction steps [k_lo, k_hi) of tile t: the epilogue if that is the whole tile, else an
    fp32 piece into scratch slot 2*pid + last. The launch data are the kernel's descriptors:
    ROWS (a_ptr, stride_a, sorted_ids_ptr, block_expert_ptr, n_assign), WTS (arena_ptr,
    slot_ptr, off1, rb1, off2, rb2), OUT (out_ptr, stride_out, tw_ptr, scratch_ptr), EPI (boff1,
    boff2, alpha, limit); tab_ptr the i-quant grids."""
    a_ptr, stride_a, sorted_ids_ptr, block_expert_ptr, n_assign = ROWS
    arena_ptr, slot_ptr, off1, rb1, off2, rb2 = WTS
    out_ptr, stride_out, tw_ptr, scratch_ptr = OUT
    boff1, boff2, alpha, limit = EPI
    MODE: tl.constexpr = S.MODE
    BM: tl.constexpr = S.BM
    BN: tl.constexpr = S.BN
    BK: tl.constexpr = S.BK
    INTERP: tl.constexpr = S.INTERP
    BIAS: tl.constexpr = S.BIAS
    ACT: tl.constexpr = S.ACT
    NB = tl.cdiv(n_out, BN)
    KI = tl.cdiv(n_in, BK)
    TWO: tl.constexpr = MODE == GATE_UP
    NACC: tl.constexpr = 2 if MODE == GATE_UP else 1
    mb = t // NB
    nb = t % NB
    e = tl.load(block_expert_ptr + mb)
    # blobs and their matrices start 256-byte aligned (strata.blob): say so, so loads vectorize
    blob = arena_ptr + tl.multiple_of(tl.load(slot_ptr + e), 256)      # uint8* of expert e's blob
    TOPK: tl.constexpr = S.TOPK
    offs_m, ids, valid, a_rows = _tile_rows(MODE, sorted_ids_ptr, mb, n_assign, TOPK, BM)
    offs_n = nb * BN + tl.arange(0, BN)
    n_mask = offs_n < n_out
    acc1, acc2 = _mma(a_ptr, a_rows, valid, stride_a, blob + off1, rb1, blob + off2, rb2,
                      offs_n, n_mask, k_lo, k_hi, n_in, tab_ptr, S)
    f32 = tl.pointer_type(tl.float32)
    b1 = (blob + boff1).to(f32, bitcast=True)   # the biases (read only with BIAS)
    b2 = (blob + boff2).to(f32, bitcast=True)
    if SPLIT == 0:
        _epilogue(MODE, acc1, acc2, out_ptr, stride_out, offs_m, ids, valid, offs_n, n_mask,
                  tw_ptr, INTERP, b1, b2, alpha, limit, BIAS, ACT)
    elif (k_lo == 0) & (k_hi == KI):
        _epilogue(MODE, acc1, acc2, out_ptr, stride_out, offs_m, ids, valid, offs_n, n_mask,
                  tw_ptr, INTERP, b1, b2, alpha, limit, BIAS, ACT)
    else:
        slot = 2 * pid + last
        r = tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]   # [BM, BN]
        sp = scratch_ptr + slot.to(tl.int64) * (NACC * BM * BN) + r
        tl.store(sp, acc1)
        if TWO:
            tl.store(sp + BM * BN, acc2)


@triton.jit
def _moe_gemm_kernel(ROWS, WTS, OUT, tab_ptr, n_out, n_in, n_blocks_ptr, n_programs, EPI,
                     SCHED: tl.constexpr, S: tl.constexpr):
    """S: the GemmSpec. ROWS, WTS, OUT, EPI: the launch data as descriptors (see _tile)."""
    pid = tl.program_id(0)
    KI = tl.cdiv(n_in, S.BK)
    # the row blocks are counted on the device (no host sync sizes the launch): the grid is an
    # upper bound and the tiles past the count exit at once
    n_tiles = tl.load(n_blocks_ptr) * tl.cdiv(n_out, S.BN)
    if SCHED == 0:
        # data-parallel: one tile, the whole reduction (no loop around it, so the K loop pipelines)
        if pid < n_tiles:
            _tile(pid, 0, KI, pid, 0, ROWS, WTS, OUT, tab_ptr, EPI, n_out, n_in, S, 0)
    else:
        total = n_tiles * KI
        base = total // n_programs
        extra = total % n_programs
        start = pid * base + tl.minimum(pid, extra)
        end = start + base + (pid < extra).to(tl.int32)
        it = start
        while it < end:
            k_lo = it % KI
            k_hi = tl.minimum(KI, k_lo + end - it)
            # slot 2p: this program's first piece; 2p+1: its last
            _tile(it // KI, k_lo, k_hi, pid, (it != start).to(tl.int32), ROWS, WTS, OUT,
                  tab_ptr, EPI, n_out, n_in, S, 1)
            it += k_hi - k_lo


class FixupSpec(NamedTuple):
    """The fixup's compile-time choices, one constexpr argument `S`: GemmSpec's fields it reads
    (none of the matrices', so one compiled fixup serves every format)."""
    MODE: int
    TOPK: int
    BM: int
    BN: int
    BK: int
    INTERP: bool
    BIAS: bool = False
    ACT: int = 0


@triton.jit
def _moe_fixup_kernel(GRP, OUT, n_out, n_in, n_blocks_ptr, n_programs, BLOBS, EPI,
                      S: tl.constexpr):
    """Program b looks at the boundary s_b between programs b-1 and b; the first boundary inside a
    tile sums that tile's pieces, program by program in increasing order, and stores the result.
    S: the FixupSpec; GRP (sorted_ids_ptr, block_expert_ptr, n_assign): the routing's groups;
    OUT and EPI the GEMM's (_tile); BLOBS (arena_ptr, slot_ptr): where the biases are."""
    sorted_ids_ptr, block_expert_ptr, n_assign = GRP
    out_ptr, stride_out, tw_ptr, scratch_ptr = OUT
    arena_ptr, slot_ptr = BLOBS
    boff1, boff2, alpha, limit = EPI
    MODE: tl.constexpr = S.MODE
    BM: tl.constexpr = S.BM
    BN: tl.constexpr = S.BN
    BK: tl.constexpr = S.BK
    b = tl.program_id(0)
    NB = tl.cdiv(n_out, BN)
    KI = tl.cdiv(n_in, BK)
    NACC: tl.constexpr = 2 if MODE == GATE_UP else 1
    total = tl.load(n_blocks_ptr) * NB * KI
    base = total // n_programs
    extra = total % n_programs
    s_b = b * base + tl.minimum(b, extra)
    s_prev = (b - 1) * base + tl.minimum(b - 1, extra)
    t = s_b // KI
    first_inside = (b > 0) & (s_b < total) & (s_b % KI != 0) & (s_prev <= t * KI)
    if first_inside:
        r = tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]
        acc1 = tl.zeros((BM, BN), tl.float32)
        acc2 = tl.zeros((BM, BN), tl.float32)
        p = b - 1
        s_p = s_prev
        while (p < n_programs) & (s_p < (t + 1) * KI):
            slot = 2 * p + (s_p // KI != t).to(tl.int32)
            sp = scratch_ptr + slot.to(tl.int64) * (NACC * BM * BN) + r
            acc1 += tl.load(sp)
            if MODE == GATE_UP:
                acc2 += tl.load(sp + BM * BN)
            p += 1
            s_p = p * base + tl.minimum(p, extra)
        mb = t // NB
        nb = t % NB
        offs_m, ids, valid, a_rows = _tile_rows(MODE, sorted_ids_ptr, mb, n_assign, S.TOPK, BM)
        offs_n = nb * BN + tl.arange(0, BN)
        e = tl.load(block_expert_ptr + mb)
        _epilogue(MODE, acc1, acc2, out_ptr, stride_out, offs_m, ids, valid, offs_n,
                  offs_n < n_out, tw_ptr, S.INTERP, _bias_ptr(arena_ptr, slot_ptr, e, boff1),
                  _bias_ptr(arena_ptr, slot_ptr, e, boff2), alpha, limit, S.BIAS, S.ACT)
