"""Triton kernel of the log-sum-exp merge of attention blocks (see strata.kernels.attention.merge
for the op and its plain-torch twin).

Legend: R = H·n rows (head h, query i: row h·n + i), D the value width, BM rows a program,
BD = next_pow2(D).

    FIRST:  acc[r] = o[r],  lse[r] = lb[r]
    else:   new = max(l, lb) + log(1 + exp(-|l - lb|))       l = lse[r], lb = lse_b[r]
            acc[r] = acc[r]·exp(l - new) + o[r]·exp(lb - new),  lse[r] = new
acc fp32 [R, D] and lse fp32 [R] contiguous (the scratch's state); o [H, n, D] in the kernel's
dtype and lse_b fp32 [H, n] at their own head and query strides, last dim contiguous (a
kernel's output as it comes, padded or not). One pass: acc and o read once, acc written once,
where the twin takes two passes over acc and a handful of [H, n] launches.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["n_rows", "n"])
def _lse_merge_kernel(acc_ptr, lse_ptr, o_ptr, lb_ptr, n_rows, n, stride_oh, stride_on,
                      stride_lh, D: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr,
                      FIRST: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)               # [BM]
    cols = tl.arange(0, BD)                                                    # [BD]
    live = rows < n_rows
    m = live[:, None] & (cols < D)[None, :]                                    # [BM, BD]
    h, i = rows // n, rows % n
    o = tl.load(o_ptr + (h * stride_oh + i * stride_on)[:, None] + cols[None, :], mask=m,
                other=0.0).to(tl.float32)
    lb = tl.load(lb_ptr + h * stride_lh + i, mask=live, other=0.0)
    at = acc_ptr + rows[:, None] * D + cols[None, :]
    if FIRST:
        acc = o
        new = lb
    else:
        l = tl.load(lse_ptr + rows, mask=live, other=0.0)
        new = tl.maximum(l, lb) + tl.log(1.0 + tl.exp(-tl.abs(l - lb)))
        acc = (tl.load(at, mask=m, other=0.0) * tl.exp(l - new)[:, None] +
               o * tl.exp(lb - new)[:, None])
    tl.store(at, acc, mask=m)
    tl.store(lse_ptr + rows, new, mask=live)
