"""MLA's block-attention kernel (forward). See strata.kernels.attention.mla_block.

Legend: H heads, n queries, m keys of the block, hd = DA + DB the q/k head width split into a
power of two DA and the rest DB (DeepSeek-V3: 192 = 128 + 64, the nope and rope parts), DV the
value width, BM queries per program, BN keys per step. Scores live in the log2 domain
(qk_scale = sm_scale·log2 e, so exp2 gives the softmax's exp).

A program owns BM queries of one head and runs the online softmax over the block's keys: the
scores are two dots accumulated (q[:, :DA] k[:, :DA]^T, then q[:, DA:] k[:, DA:]^T into the
same fp32 tile), so no tile is padded past hd and the value product runs DV wide. MASKED: query
i sees keys 0..i + m - n (bottom-right); key tiles every row of the program sees whole run
without a mask, the diagonal ones with it, the ones beyond are never visited. RESUME starts from
a carried state (acc normalized, lse natural log: MLA's fp32 scratch state) as m = lse·log2 e,
l = 1, acc = the stored o: the same sums, so a query block's key blocks chain through it; the
end writes o = acc / l (o's dtype) and lse = (m + log2 l)·ln 2.
"""
from typing import NamedTuple

import triton
import triton.language as tl

from strata.kernels.attention._kernel import _mma
from strata.kernels.moe._ffn_kernel import _bf16


class MLASpec(NamedTuple):
    """The kernel's compile-time choices, one constexpr argument `S`: the widths (DA, DB, DV)
    and their power-of-two tiles (BDA, BDB, BDV >= 16, the columns past the width masked), the
    tile (BM, BN), MASKED, RESUME and the interpreter flag."""
    DA: int
    DB: int
    DV: int
    BDA: int
    BDB: int
    BDV: int
    BM: int
    BN: int
    MASKED: bool
    RESUME: bool
    INTERP: bool


@triton.jit
def _cols(base, rows, stride, D: tl.constexpr, BD: tl.constexpr, row_ok, EDGE: tl.constexpr):
    """A [rows, BD] tile of a [*, D] operand at `base`, rows `stride` apart: zeros past D and,
    EDGE, in rows that are not row_ok (masks only where they can bite)."""
    offs = tl.arange(0, BD)
    ptr = base + rows.to(tl.int64)[:, None] * stride + offs[None, :]
    if EDGE and BD != D:
        t = tl.load(ptr, mask=row_ok[:, None] & (offs < D)[None, :], other=0)
    elif EDGE:
        t = tl.load(ptr, mask=row_ok[:, None], other=0)
    elif BD != D:
        t = tl.load(ptr, mask=(offs < D)[None, :], other=0)
    else:
        t = tl.load(ptr)
    return t


@triton.jit
def _mla_tile(acc, m_i, l_i, qa, qb, K, V, n0, m, row_last, qk_scale, S: tl.constexpr,
              EDGE: tl.constexpr):
    """One [BM, BN] step over keys n0..n0+BN. K (k base, stride_kt), V (v base, stride_vt): the
    head's keys and values. EDGE: keys past m cut and, MASKED, key j seen only by rows whose
    last visible key row_last >= j."""
    k_base, stride_kt = K
    v_base, stride_vt = V
    BM: tl.constexpr = S.BM
    BN: tl.constexpr = S.BN
    offs_n = n0 + tl.arange(0, BN)                                       # [BN]
    live = offs_n < m
    ka = _cols(k_base, offs_n, stride_kt, S.DA, S.BDA, live, EDGE)       # [BN, BDA]
    s = _mma(qa, tl.trans(ka), tl.zeros([BM, BN], tl.float32), S.INTERP)
    if S.DB > 0:
        kb = _cols(k_base + S.DA, offs_n, stride_kt, S.DB, S.BDB, live, EDGE)   # [BN, BDB]
        s = _mma(qb, tl.trans(kb), s, S.INTERP)                          # [BM, BN] fp32
    s = s * qk_scale
    if EDGE:
        seen = live[None, :]
        if S.MASKED:
            seen = seen & (offs_n[None, :] <= row_last[:, None])
        s = tl.where(seen, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))                                # [BM]
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])                                      # [BM, BN] fp32
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    v = _cols(v_base, offs_n, stride_vt, S.DV, S.BDV, live, EDGE)        # [BN, BDV]
    if v_base.dtype.element_ty != tl.float32:
        p = _bf16(p, S.INTERP)
    acc = _mma(p, v, acc, S.INTERP)                                      # [BM, BDV] fp32
    return acc, m_new, l_i


@triton.jit
def _mla_attention_kernel(Q, K, V, O, ACC, LSE, n, m, qk_scale, S: tl.constexpr):
    """S: the MLASpec. Descriptors, (head, row) strides each, unit last strides: Q (q_ptr,
    stride_qh, stride_qt) [H, n, hd]; K (k_ptr, stride_kh, stride_kt) [H, m, hd]; V (v_ptr,
    stride_vh, stride_vt) [H, m, DV]; O (o_ptr, stride_oh, stride_ot) [H, n, DV] written;
    ACC (acc_ptr, stride_ah, stride_at) fp32 [H, n, DV] read under RESUME (may be O);
    LSE (lse_ptr, stride_lh) fp32 [H, n], read under RESUME and written."""
    q_ptr, stride_qh, stride_qt = Q
    k_ptr, stride_kh, stride_kt = K
    v_ptr, stride_vh, stride_vt = V
    o_ptr, stride_oh, stride_ot = O
    acc_ptr, stride_ah, stride_at = ACC
    lse_ptr, stride_lh = LSE
    BM: tl.constexpr = S.BM
    BN: tl.constexpr = S.BN
    BDV: tl.constexpr = S.BDV
    # under the mask the last row blocks see the most keys: start them first (shorter tail)
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    rows = pid_m * BM + tl.arange(0, BM)                                 # [BM] queries
    live = rows < n
    qa = _cols(q_ptr + h * stride_qh, rows, stride_qt, S.DA, S.BDA, live, True)   # [BM, BDA]
    qb = qa
    if S.DB > 0:
        qb = _cols(q_ptr + h * stride_qh + S.DA, rows, stride_qt, S.DB, S.BDB, live, True)
    offs_v = tl.arange(0, BDV)
    v_ok = live[:, None] & (offs_v < S.DV)[None, :]
    lse_off = h * stride_lh + rows
    if S.RESUME:
        acc = tl.load(acc_ptr + h * stride_ah + rows.to(tl.int64)[:, None] * stride_at
                      + offs_v[None, :], mask=v_ok, other=0)
        m_i = tl.load(lse_ptr + lse_off, mask=live, other=0) * 1.4426950408889634
        l_i = tl.full([BM], 1.0, dtype=tl.float32)
    else:
        acc = tl.zeros([BM, BDV], dtype=tl.float32)
        m_i = tl.full([BM], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BM], dtype=tl.float32)
    KH = (k_ptr + h * stride_kh, stride_kt)
    VH = (v_ptr + h * stride_vh, stride_vt)
    row_last = rows + (m - n)                                            # MASKED: last key seen
    if S.MASKED:
        full = ((pid_m * BM + m - n + 1) // BN) * BN     # every row of the block sees these
        end = tl.minimum(pid_m * BM + BM + m - n, m)
    else:
        full = (m // BN) * BN
        end = m
    for n0 in range(0, full, BN):
        acc, m_i, l_i = _mla_tile(acc, m_i, l_i, qa, qb, KH, VH, n0, m, row_last, qk_scale, S,
                                  False)
    for n0 in range(full, end, BN):
        acc, m_i, l_i = _mla_tile(acc, m_i, l_i, qa, qb, KH, VH, n0, m, row_last, qk_scale, S,
                                  True)
    o = acc / l_i[:, None]
    if o_ptr.dtype.element_ty == tl.bfloat16:
        o = _bf16(o, S.INTERP)
    tl.store(o_ptr + h * stride_oh + rows.to(tl.int64)[:, None] * stride_ot + offs_v[None, :],
             o, mask=v_ok)
    tl.store(lse_ptr + lse_off, (m_i + tl.log2(l_i)) * 0.6931471805599453, mask=live)


def grid(n: int, H: int, BM: int) -> tuple[int, int]:
    return (triton.cdiv(n, BM), H)
