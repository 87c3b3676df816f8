"""Triton kernels around the grouped decoded FFN's two torch._grouped_mm calls (see
strata.kernels.moe.grouped for the ops and their references).

Legend: M rows sorted by expert (n_valid of them live, read from the device), F expert width,
D hidden, TK = T·K assignments; a program owns BR rows x BC columns.

    _silu_mul_kernel:  h[i, c] = bf16(silu(g[i, c]) * u[i, c])          i < n_valid
    _scatter_kernel:   yk[order[i], d] = yd[i, d] * tw[order[i]]         i < n_valid (fp32)
    _combine_sorted_kernel: y[t] = sum over k of yd[inv[t*K + k]] * tw[t*K + k]   (no yk)

Rows at or past n_valid are neither read nor written: a streamed pass's rows past its own
assignments belong to other passes (and the grouped GEMM left them unwritten).
"""
from __future__ import annotations

import triton
import triton.language as tl

from strata.kernels.moe._ffn_kernel import _act, _bf16


@triton.jit
def _silu_mul_kernel(g_ptr, u_ptr, stride_gu, h_ptr, stride_h, n_valid_ptr, F,
                     BR: tl.constexpr, BC: tl.constexpr, INTERP: tl.constexpr):
    i = (tl.program_id(0) * BR + tl.arange(0, BR)).to(tl.int64)       # [BR]
    c = tl.program_id(1) * BC + tl.arange(0, BC)                      # [BC]
    live = (i < tl.load(n_valid_ptr))[:, None] & (c < F)[None, :]     # [BR, BC]
    at = i[:, None] * stride_gu + c[None, :]
    g = tl.load(g_ptr + at, mask=live, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + at, mask=live, other=0.0).to(tl.float32)
    h = _act(g, u, 0.0, 0.0, 0)                                       # the GEMM's silu epilogue
    tl.store(h_ptr + i[:, None] * stride_h + c[None, :], _bf16(h, INTERP), mask=live)


@triton.jit
def _scatter_kernel(yd_ptr, stride_yd, order_ptr, tw_ptr, yk_ptr, stride_yk, n_valid_ptr, D,
                    BR: tl.constexpr, BC: tl.constexpr):
    i = tl.program_id(0) * BR + tl.arange(0, BR)                      # [BR]
    d = tl.program_id(1) * BC + tl.arange(0, BC)                      # [BC]
    ok = i < tl.load(n_valid_ptr)
    a = tl.load(order_ptr + i, mask=ok, other=0).to(tl.int64)         # [BR] assignment rows
    w = tl.load(tw_ptr + a, mask=ok, other=0.0)                       # [BR] routing weight
    live = ok[:, None] & (d < D)[None, :]
    y = tl.load(yd_ptr + i.to(tl.int64)[:, None] * stride_yd + d[None, :], mask=live, other=0.0)
    tl.store(yk_ptr + a[:, None] * stride_yk + d[None, :], y.to(tl.float32) * w[:, None],
             mask=live)


@triton.jit
def _combine_sorted_kernel(yd_ptr, stride_yd, inv_ptr, tw_ptr, ids_ptr, stride_it, stride_ik,
                           out_ptr, stride_ot, T, D, TOPK: tl.constexpr, MASK: tl.constexpr,
                           ADD: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr,
                           INTERP: tl.constexpr):
    """combine_rows over rows yd[inv[a]] * tw[a] instead of yk[a] (strata.kernels.moe.combine's
    order: k = 0..K-1 from +0.0; MASK: a k whose id is < 0 adds +0.0, its row never loaded)."""
    t = (tl.program_id(0) * BT + tl.arange(0, BT)).to(tl.int64)       # [BT]
    d = tl.program_id(1) * BD + tl.arange(0, BD)                      # [BD]
    t_ok = t < T
    live = t_ok[:, None] & (d < D)[None, :]                           # [BT, BD]
    acc = tl.zeros((BT, BD), tl.float32)
    for k in tl.static_range(TOPK):
        ok = t_ok
        if MASK:
            e = tl.load(ids_ptr + t * stride_it + k * stride_ik, mask=t_ok, other=-1)   # [BT]
            ok = ok & (e >= 0)
        a = t * TOPK + k                                              # [BT] assignments
        r = tl.load(inv_ptr + a, mask=ok, other=0).to(tl.int64)       # [BT] their sorted rows
        w = tl.load(tw_ptr + a, mask=ok, other=0.0)                   # [BT]
        y = tl.load(yd_ptr + r[:, None] * stride_yd + d[None, :], mask=live & ok[:, None],
                    other=0.0).to(tl.float32)
        acc += y * w[:, None]
    o = out_ptr + t[:, None] * stride_ot + d[None, :]                 # [BT, BD]
    if ADD:
        tl.store(o, tl.load(o, mask=live, other=0.0) + acc, mask=live)
    else:
        tl.store(o, _bf16(acc, INTERP), mask=live)
