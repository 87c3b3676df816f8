"""Triton kernel of the interleaved-pair RoPE in place (see strata.kernels.rope_pairs).

Legend: a row is one (g, t) of x [G, T, R]; P = R / 2 pairs, PB = next_pow2(P); BM rows a
program.

  a, b = x[g, t, 2i], x[g, t, 2i + 1]      (fp32)
  x[g, t, 2i]     = rnd(a * cos[t, i] - b * sin[t, i])
  x[g, t, 2i + 1] = rnd(b * cos[t, i] + a * sin[t, i])

Each product and each sum rounded to fp32 apart (the launch turns fp fusion off: an FMA would
round a * cos - b * sin once, torch's twin rounds three times), then rnd to x's dtype to nearest
even. A program reads its rows' pairs and writes them back; rows are disjoint across programs,
so the update in place is safe.
"""
from __future__ import annotations

import triton
import triton.language as tl

from strata.kernels._norm_kernel import _rnd


@triton.jit(do_not_specialize=["n_rows"])
def _rope_pairs_kernel(x_ptr, cos_ptr, sin_ptr, n_rows, T, stride_g, stride_t, stride_c,
                       stride_s, P: tl.constexpr, PB: tl.constexpr, BM: tl.constexpr,
                       INTERP: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BM + tl.arange(0, BM)                                   # [BM]
    i = tl.arange(0, PB)                                                 # [PB]
    live = (rows < n_rows)[:, None] & (i < P)[None, :]
    g, t = rows // T, rows % T
    base = x_ptr + g.to(tl.int64)[:, None] * stride_g + t.to(tl.int64)[:, None] * stride_t
    pa = base + 2 * i[None, :]
    a = tl.load(pa, mask=live, other=0.0).to(tl.float32)
    b = tl.load(pa + 1, mask=live, other=0.0).to(tl.float32)
    c = tl.load(cos_ptr + t[:, None] * stride_c + i[None, :], mask=live, other=0.0)
    s = tl.load(sin_ptr + t[:, None] * stride_s + i[None, :], mask=live, other=0.0)
    c, s = c.to(tl.float32), s.to(tl.float32)
    DT: tl.constexpr = x_ptr.dtype.element_ty
    ya = _rnd(a * c - b * s, DT, INTERP)
    yb = _rnd(b * c + a * s, DT, INTERP)
    tl.store(pa, ya.to(DT), mask=live)
    tl.store(pa + 1, yb.to(DT), mask=live)
