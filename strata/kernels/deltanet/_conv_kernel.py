"""Triton kernel of the DeltaNet layer's short causal depthwise conv (launcher and twin:
strata.kernels.deltanet.conv).

Legend: T rows of this call, C channels, K taps (a power of two is not needed), BT x BC the
program's tile of [T, C].

    y[t, c] = rnd_y(silu(bias[c] + sum_j w[c, j] * xp[t + j, c]))      j = 0 .. K-1 in order
    xp[i] = state[i] for i < K-1, else x[i - (K-1)]               (the carried K-1 inputs first)

All arithmetic is fp32; x is read K times from the tile's neighbourhood (L2 holds it), y written
once in its dtype: one pass over [T, C] where the twin's K multiply-adds make 2K + 3 fp32 ones.
With SPLIT the columns land in two contiguous outputs, [T, SPLIT] and [T, C - SPLIT].
"""
from __future__ import annotations

import triton
import triton.language as tl

from strata.kernels._norm_kernel import _rnd


@triton.jit(do_not_specialize=["T"])
def _causal_conv1d_fwd_kernel(x_ptr, w_ptr, b_ptr, s_ptr, y_ptr, y2_ptr, T, stride_x, stride_y,
                              C: tl.constexpr, K: tl.constexpr, HAS_B: tl.constexpr,
                              SILU: tl.constexpr, SPLIT: tl.constexpr, BT: tl.constexpr,
                              BC: tl.constexpr, INTERP: tl.constexpr):
    # SPLIT > 0: columns c < SPLIT go to y [T, SPLIT], the rest to y2 [T, C - SPLIT], each
    # contiguous (q and k, then v: the delta rule reads v without a copy)
    YT: tl.constexpr = y_ptr.dtype.element_ty
    rows = tl.program_id(0).to(tl.int64) * BT + tl.arange(0, BT)               # [BT]
    cols = tl.program_id(1) * BC + tl.arange(0, BC)                            # [BC]
    cm = cols < C
    acc = tl.zeros((BT, BC), dtype=tl.float32)
    if HAS_B:
        acc += tl.load(b_ptr + cols, mask=cm, other=0.0).to(tl.float32)[None, :]
    for j in tl.static_range(K):
        src = rows + (j - (K - 1))                                             # row of x
        in_x = (src >= 0) & (src < T)
        xv = tl.load(x_ptr + src[:, None] * stride_x + cols[None, :],
                     mask=in_x[:, None] & cm[None, :], other=0.0).to(tl.float32)
        st = src + (K - 1)                                                     # row of state
        in_s = (src < 0) & (st >= 0)
        sv = tl.load(s_ptr + st[:, None] * C + cols[None, :],
                     mask=in_s[:, None] & cm[None, :], other=0.0).to(tl.float32)
        wj = tl.load(w_ptr + cols * K + j, mask=cm, other=0.0).to(tl.float32)   # [BC]
        acc += (xv + sv) * wj[None, :]
    if SILU:
        acc = acc / (1.0 + tl.exp(-acc))
    m = (rows < T)[:, None] & cm[None, :]
    val = _rnd(acc, YT, INTERP).to(YT)
    if SPLIT > 0:
        left = (cols < SPLIT)[None, :]
        tl.store(y_ptr + rows[:, None] * SPLIT + cols[None, :], val, mask=m & left)
        tl.store(y2_ptr + rows[:, None] * (C - SPLIT) + (cols - SPLIT)[None, :], val,
                 mask=m & ~left)
    else:
        tl.store(y_ptr + rows[:, None] * stride_y + cols[None, :], val, mask=m)
