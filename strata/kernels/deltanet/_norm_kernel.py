"""Triton kernels of the DeltaNet layer's two per-row norms (ops and twins:
strata.kernels.deltanet.norms).

Legend: R rows, N row width, BM rows per program, BN = next_pow2(N).

  _l2norm_fwd_kernel:      y[r] = rnd_o(x[r] * rsqrt(sum(x[r]^2) + eps))  (rnd_o: to out's dtype)
  _gated_rms_norm_fwd_kernel:
      n = rnd_x(x[r] * rsqrt(mean(x[r]^2) + eps));  p = rnd_p(w * n)
      y[r] = rnd_x(p * silu(z[r]))                     silu(z) = z / (1 + exp(-z)), fp32
rnd_x rounds to x's dtype, rnd_p to promote(w, x)'s (to nearest even): the steps transformers'
Qwen3NextRMSNormGated takes. All arithmetic in between is fp32.
"""
from __future__ import annotations

import triton
import triton.language as tl

from strata.kernels._norm_kernel import _rnd   # fp32 rounded to the output dtype, as RMSNorm's


@triton.jit(do_not_specialize=["n_rows", "n_head"])
def _l2norm_fwd_kernel(x_ptr, out_ptr, n_rows, stride_x, stride_h, n_head, eps,
                       N: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                       INTERP: tl.constexpr):
    # row r of x is at (r // n_head) * stride_x + (r % n_head) * stride_h: rows of a [T, H, N]
    # view with any row strides (q and k as split views of the conv's output: no copy first);
    # n_head 1 for plain [R, N] rows
    OT: tl.constexpr = out_ptr.dtype.element_ty
    rows = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)               # [BM]
    cols = tl.arange(0, BN)                                                    # [BN]
    m = (rows < n_rows)[:, None] & (cols < N)[None, :]                         # [BM, BN]
    at = (rows // n_head) * stride_x + (rows % n_head) * stride_h              # [BM]
    x = tl.load(x_ptr + at[:, None] + cols[None, :], mask=m, other=0.0).to(tl.float32)
    r = tl.math.rsqrt(tl.sum(x * x, axis=1) + eps)                             # [BM]
    y = _rnd(x * r[:, None], OT, INTERP).to(OT)
    tl.store(out_ptr + rows[:, None] * N + cols[None, :], y, mask=m)


@triton.jit(do_not_specialize=["n_rows"])
def _gated_rms_norm_fwd_kernel(x_ptr, z_ptr, w_ptr, out_ptr, n_rows, stride_x, stride_z, eps,
                               N: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                               PT: tl.constexpr, INTERP: tl.constexpr):
    XT: tl.constexpr = x_ptr.dtype.element_ty
    rows = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)               # [BM]
    cols = tl.arange(0, BN)                                                    # [BN]
    m = (rows < n_rows)[:, None] & (cols < N)[None, :]                         # [BM, BN]
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=m,
                other=0.0).to(tl.float32)
    z = tl.load(z_ptr + rows[:, None] * stride_z + cols[None, :], mask=m,
                other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)        # [BN]
    r = tl.math.rsqrt(tl.sum(x * x, axis=1) / N + eps)                        # [BM]
    p = _rnd(w[None, :] * _rnd(x * r[:, None], XT, INTERP), PT, INTERP)        # rnd_p(w rnd_x)
    y = p * (z / (1.0 + tl.exp(-z)))
    tl.store(out_ptr + rows[:, None] * N + cols[None, :], _rnd(y, XT, INTERP).to(XT), mask=m)
