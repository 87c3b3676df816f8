"""Triton kernel of the expert FFN's combine (see strata.kernels.moe.combine for the op and its
reference).

Legend: T tokens, D hidden, K top-k; a program owns BT tokens x BD features.

    acc[t, d] = 0 + yk[t*K + 0, d] + yk[t*K + 1, d] + ... + yk[t*K + K-1, d]     (fp32, k order)
    MASK: a row whose topk_ids[t, k] < 0 adds 0.0 and is never loaded (it may hold NaN)
    ADD:  out[t, d] = out[t, d] + acc[t, d]      else  out[t, d] = bf16(acc[t, d])

One read of yk's live rows, one write of y: the sum over K happens in registers.
"""
from __future__ import annotations

import triton
import triton.language as tl

from strata.kernels.moe._ffn_kernel import _bf16


@triton.jit
def _combine_fwd_kernel(yk_ptr, stride_yk, ids_ptr, stride_it, stride_ik, out_ptr, stride_ot,
                        T, D, TOPK: tl.constexpr, MASK: tl.constexpr,
                        ADD: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr,
                        INTERP: tl.constexpr):
    t = (tl.program_id(0) * BT + tl.arange(0, BT)).to(tl.int64)       # [BT]
    d = tl.program_id(1) * BD + tl.arange(0, BD)                      # [BD]
    t_ok = t < T
    live = t_ok[:, None] & (d < D)[None, :]                           # [BT, BD]
    acc = tl.zeros((BT, BD), tl.float32)
    for k in tl.static_range(TOPK):
        m = live
        if MASK:
            e = tl.load(ids_ptr + t * stride_it + k * stride_ik, mask=t_ok, other=-1)   # [BT]
            m = m & (e >= 0)[:, None]
        rows = t * TOPK + k                                           # [BT] rows of yk
        acc += tl.load(yk_ptr + rows[:, None] * stride_yk + d[None, :], mask=m, other=0.0)
    o = out_ptr + t[:, None] * stride_ot + d[None, :]                 # [BT, BD]
    if ADD:
        tl.store(o, tl.load(o, mask=live, other=0.0) + acc, mask=live)
    else:
        tl.store(o, _bf16(acc, INTERP), mask=live)
