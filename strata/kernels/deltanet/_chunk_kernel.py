"""Triton kernels of the chunked gated delta rule (op, launcher and twin:
strata.kernels.deltanet.chunk / .naive).

Legend: T tokens, HK key heads, HV value heads (value head h reads key head h // (HV / HK)),
DK / DV head dims, BT the chunk (64), BK = next_pow2(DK), BV a block of DV; G = cumsum of g
inside a chunk; all arithmetic fp32, tl.dot at PREC (the launcher's "tf32x3": products within
12 u of fp32's on the tensor cores, fp32 sums).

  _gdn_wy_fwd_kernel, grid (chunks, HV): per chunk and value head
      G = cumsum(g);  A = strict_tril(beta_i k_i.k_j exp(G_i - G_j))          [BT, BT]
      Ai = (I + A)^-1 by forward substitution, row by row in registers
      w = Ai (beta exp(G) k)  [BT, DK]     u = Ai (beta v)  [BT, DV]           (stored)
  _gdn_state_fwd_kernel, grid (DV / BV, HV): per value head and DV block, the chunks in order
      (offsets in int64: T * HV * DK passes 2^31 past 512K tokens)
      v_new = u - w S                                                          [BT, BV]
      o = (q exp(G)) S + tril(q k^T exp(G_i - G_j)) v_new                      [BT, BV]
      S = S exp(G_last) + (k exp(G_last - G))^T v_new                          [BK, BV]
The second kernel keeps S in registers and writes o as it goes, so neither the per-chunk states
nor v_new reach memory (flash-linear-attention stores both and reads them back in a third
kernel). With SPLIT it writes v_new over u and oi = (q exp(G)) S instead of o, and
  _gdn_out_fwd_kernel, grid (chunks, HV, DV / BV): o = oi + tril(q k^T exp(G_i - G_j)) v_new
adds the intra-chunk part parallel over chunks: the scan's sequential work drops the q k^T and
the [BT, BT] x [BT, BV] products; the same products, summed in the same order. Rows past T load as zeros and are never stored; the decay exponents outside the
causal triangle are set to -inf before exp (exp(G_i - G_j), i < j, overflows), so no inf or
NaN is formed.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["T"])
def _gdn_wy_fwd_kernel(k_ptr, v_ptr, g_ptr, beta_ptr, gc_ptr, w_ptr, u_ptr, T,
                       HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
                       BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                       PREC: tl.constexpr):
    i_t = tl.program_id(0).to(tl.int64)
    i_h = tl.program_id(1).to(tl.int64)
    i_hk = i_h // (HV // HK)
    o_i = tl.arange(0, BT)                                                     # [BT]
    o_t = i_t * BT + o_i
    m_t = o_t < T
    o_k = tl.arange(0, BK)
    m_k = o_k < DK
    b_g = tl.load(g_ptr + o_t * HV + i_h, mask=m_t, other=0.0).to(tl.float32)
    b_gc = tl.cumsum(b_g, axis=0)                                              # [BT]
    tl.store(gc_ptr + o_t * HV + i_h, b_gc, mask=m_t)
    b_b = tl.load(beta_ptr + o_t * HV + i_h, mask=m_t, other=0.0).to(tl.float32)
    b_k = tl.load(k_ptr + (o_t[:, None] * HK + i_hk) * DK + o_k[None, :],
                  mask=m_t[:, None] & m_k[None, :], other=0.0).to(tl.float32)  # [BT, BK]
    b_kb = b_k * b_b[:, None]
    b_A = tl.dot(b_kb, tl.trans(b_k), input_precision=PREC)                   # [BT, BT]
    m_low = (o_i[:, None] > o_i[None, :]) & m_t[:, None] & m_t[None, :]
    b_A = b_A * tl.exp(tl.where(m_low, b_gc[:, None] - b_gc[None, :], float("-inf")))
    # (I + A)^-1 = I + X, row i of X = -A[i] - sum_j A[i, j] X[j]: rows j < i are final
    b_X = -b_A
    for i in range(2, BT):
        b_a = tl.sum(tl.where((o_i == i)[:, None], b_X, 0.0), 0)              # [BT] = -A[i]
        b_a = b_a + tl.sum(b_a[:, None] * b_X, 0)
        b_X = tl.where((o_i == i)[:, None], b_a[None, :], b_X)
    b_X = b_X + tl.where(o_i[:, None] == o_i[None, :], 1.0, 0.0)
    b_w = tl.dot(b_X, b_kb * tl.exp(b_gc)[:, None], input_precision=PREC)     # [BT, BK]
    tl.store(w_ptr + (o_t[:, None] * HV + i_h) * DK + o_k[None, :], b_w,
             mask=m_t[:, None] & m_k[None, :])
    for i_v in range(0, tl.cdiv(DV, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_tv = m_t[:, None] & (o_v < DV)[None, :]
        b_v = tl.load(v_ptr + (o_t[:, None] * HV + i_h) * DV + o_v[None, :], mask=m_tv,
                      other=0.0).to(tl.float32)                                # [BT, BV]
        b_u = tl.dot(b_X, b_v * b_b[:, None], input_precision=PREC)
        tl.store(u_ptr + (o_t[:, None] * HV + i_h) * DV + o_v[None, :], b_u, mask=m_tv)


@triton.jit
def _qk_decay(b_q, b_k, b_gc, o_i, m_t, PREC: tl.constexpr):
    """tril(q k^T exp(G_i - G_j)) [BT, BT] of one chunk (q already scaled)."""
    b_qk = tl.dot(b_q, tl.trans(b_k), input_precision=PREC)                    # [BT, BT]
    m_causal = (o_i[:, None] >= o_i[None, :]) & m_t[:, None]
    return b_qk * tl.exp(tl.where(m_causal, b_gc[:, None] - b_gc[None, :], float("-inf")))


@triton.jit(do_not_specialize=["T"])
def _gdn_state_fwd_kernel(q_ptr, k_ptr, w_ptr, u_ptr, gc_ptr, h0_ptr, o_ptr, ht_ptr, oi_ptr, T,
                          scale, HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr,
                          DV: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                          BV: tl.constexpr, HAS_H0: tl.constexpr, PREC: tl.constexpr,
                          SPLIT: tl.constexpr):
    OT: tl.constexpr = o_ptr.dtype.element_ty
    i_v = tl.program_id(0).to(tl.int64)
    i_h = tl.program_id(1).to(tl.int64)
    i_hk = i_h // (HV // HK)
    o_i = tl.arange(0, BT).to(tl.int64)            # [BT]; int64 rows: i_t below is an int32
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < DK
    m_v = o_v < DV
    m_kv = m_k[:, None] & m_v[None, :]
    p_h = i_h * DK * DV + o_k[:, None] * DV + o_v[None, :]                     # [BK, BV]
    if HAS_H0:
        b_h = tl.load(h0_ptr + p_h, mask=m_kv, other=0.0)
    else:
        b_h = tl.zeros([BK, BV], dtype=tl.float32)
    for i_t in range(0, tl.cdiv(T, BT)):
        o_t = i_t * BT + o_i
        m_t = o_t < T
        m_tk = m_t[:, None] & m_k[None, :]
        m_tv = m_t[:, None] & m_v[None, :]
        b_gc = tl.load(gc_ptr + o_t * HV + i_h, mask=m_t, other=0.0)            # [BT]
        last = tl.minimum(T, i_t * BT + BT) - 1
        b_gl = tl.load(gc_ptr + last * HV + i_h)
        b_w = tl.load(w_ptr + (o_t[:, None] * HV + i_h) * DK + o_k[None, :], mask=m_tk,
                      other=0.0)                                               # [BT, BK]
        b_u = tl.load(u_ptr + (o_t[:, None] * HV + i_h) * DV + o_v[None, :], mask=m_tv,
                      other=0.0)                                               # [BT, BV]
        b_vn = b_u - tl.dot(b_w, b_h, input_precision=PREC)                    # [BT, BV]
        p_qk = (o_t[:, None] * HK + i_hk) * DK + o_k[None, :]
        b_q = tl.load(q_ptr + p_qk, mask=m_tk, other=0.0).to(tl.float32) * scale
        b_k = tl.load(k_ptr + p_qk, mask=m_tk, other=0.0).to(tl.float32)       # [BT, BK]
        p_tv = (o_t[:, None] * HV + i_h) * DV + o_v[None, :]
        if SPLIT:   # v_new over u (this program's dv block only), the inter-chunk part to oi
            b_o = tl.dot(b_q * tl.exp(b_gc)[:, None], b_h, input_precision=PREC)  # [BT, BV]
            tl.store(u_ptr + p_tv, b_vn, mask=m_tv)
            tl.store(oi_ptr + p_tv, b_o, mask=m_tv)
        else:
            # q k^T before the inter-chunk dot: with that dot first, Triton 3.6 at 8 warps,
            # tf32x3 and BK = BV = 16 (the tiny hybrids' heads) emits a scan that faults on
            # the GPU (an illegal address, H100 and H200); this order runs there
            b_qk = _qk_decay(b_q, b_k, b_gc, o_i, m_t, PREC)                   # [BT, BT]
            b_o = tl.dot(b_q * tl.exp(b_gc)[:, None], b_h, input_precision=PREC)
            b_o = b_o + tl.dot(b_qk, b_vn, input_precision=PREC)               # [BT, BV]
            tl.store(o_ptr + p_tv, b_o.to(OT), mask=m_tv)
        b_kd = b_k * tl.where(m_t, tl.exp(b_gl - b_gc), 0.0)[:, None]
        b_h = b_h * tl.exp(b_gl) + tl.dot(tl.trans(b_kd), b_vn, input_precision=PREC)
    tl.store(ht_ptr + p_h, b_h, mask=m_kv)


@triton.jit(do_not_specialize=["T"])
def _gdn_out_fwd_kernel(q_ptr, k_ptr, vn_ptr, gc_ptr, oi_ptr, o_ptr, T, scale,
                        HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
                        BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                        PREC: tl.constexpr):
    OT: tl.constexpr = o_ptr.dtype.element_ty
    i_t = tl.program_id(0).to(tl.int64)
    i_h = tl.program_id(1).to(tl.int64)
    i_v = tl.program_id(2).to(tl.int64)
    i_hk = i_h // (HV // HK)
    o_i = tl.arange(0, BT).to(tl.int64)
    o_t = i_t * BT + o_i
    m_t = o_t < T
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_tk = m_t[:, None] & (o_k < DK)[None, :]
    m_tv = m_t[:, None] & (o_v < DV)[None, :]
    b_gc = tl.load(gc_ptr + o_t * HV + i_h, mask=m_t, other=0.0)                # [BT]
    p_qk = (o_t[:, None] * HK + i_hk) * DK + o_k[None, :]
    b_q = tl.load(q_ptr + p_qk, mask=m_tk, other=0.0).to(tl.float32) * scale
    b_k = tl.load(k_ptr + p_qk, mask=m_tk, other=0.0).to(tl.float32)           # [BT, BK]
    p_tv = (o_t[:, None] * HV + i_h) * DV + o_v[None, :]
    b_vn = tl.load(vn_ptr + p_tv, mask=m_tv, other=0.0)                        # [BT, BV]
    b_o = tl.load(oi_ptr + p_tv, mask=m_tv, other=0.0)
    b_qk = _qk_decay(b_q, b_k, b_gc, o_i, m_t, PREC)                           # [BT, BT]
    b_o = b_o + tl.dot(b_qk, b_vn, input_precision=PREC)
    tl.store(o_ptr + p_tv, b_o.to(OT), mask=m_tv)
