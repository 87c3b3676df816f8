"""Triton kernels of the per-token norms (see strata.kernels.norm for the ops and references).

Legend: R rows, N row width, BM rows per program, BN = next_pow2(N); for the q/k kernel a row is
one (token t, head h) pair of x [T, NH, HD], HB = next_pow2(HD / 2).

  _rms_norm_fwd_kernel:  y[r] = w * rnd_x(x[r] * rsqrt(mean(x[r]^2) + eps))    (w optional)
  _qk_norm_rope_fwd_kernel:
      n[t, h] = rnd_o(w * rnd_x(x[t, h] * rsqrt(mean(x[t, h]^2) + eps)))   (NORM; else x[t, h])
      o[t, h, :HD/2] = rnd_o(n1 * cos1[t] - n2 * sin1[t])
      o[t, h, HD/2:] = rnd_o(n2 * cos2[t] + n1 * sin2[t])                 n1, n2: n's halves
  partial rotary (ROT < HD: cos/sin [T, ROT], GLM-4.5, MiniMax-M2, Qwen3.5/Qwen3-Next): the
  same on the first ROT dims, their halves at ROT/2, and o[t, h, ROT:] = rnd_o(n[ROT:]). The
  whole row is one [BM, HF] tile; each rotated dim's partner is read again (an L1 hit) and
  normed the same way, so it carries the same bits as in its own column.
rnd_x rounds to x's dtype and rnd_o to the output's (to nearest even), the steps torch's
rms_norm and apply_rope take (strata.models.layers); all arithmetic in between is fp32. A
program owns BM whole rows, so each row's mean square is one in-register reduction, and x is
read once and written once. The output of the q/k kernel is [T, NH, HD], contiguous.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _rnd(v, DT: tl.constexpr, INTERP: tl.constexpr):
    """fp32 v rounded to DT, to nearest even, as fp32. The GPU's cvt rounds so; the
    interpreter's bf16 cast truncates, so there bf16 is rounded on the bits (a NaN kept one)."""
    if DT == tl.float32:
        return v
    elif INTERP and DT == tl.bfloat16:
        u = v.to(tl.uint32, bitcast=True)
        u = tl.where(v != v, u | 0x00400000, u + 0x7FFF + ((u >> 16) & 1))
        return (u >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True).to(tl.float32)
    else:
        return v.to(DT).to(tl.float32)


@triton.jit(do_not_specialize=["n_rows"])
def _rms_norm_fwd_kernel(x_ptr, w_ptr, out_ptr, n_rows, stride_x, stride_o, eps,
                         N: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                         HAS_W: tl.constexpr, INTERP: tl.constexpr):
    XT: tl.constexpr = x_ptr.dtype.element_ty
    OT: tl.constexpr = out_ptr.dtype.element_ty
    rows = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)               # [BM]
    cols = tl.arange(0, BN)                                                    # [BN]
    m = (rows < n_rows)[:, None] & (cols < N)[None, :]                         # [BM, BN]
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=m,
                other=0.0).to(tl.float32)
    r = tl.math.rsqrt(tl.sum(x * x, axis=1) / N + eps)                        # [BM]
    y = _rnd(x * r[:, None], XT, INTERP)                                       # rnd_x
    if HAS_W:
        w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)    # [BN]
        y = w[None, :] * y
    tl.store(out_ptr + rows[:, None] * stride_o + cols[None, :],
             _rnd(y, OT, INTERP).to(OT), mask=m)


@triton.jit(do_not_specialize=["n_rows"])
def _qk_norm_rope_fwd_kernel(x_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr, n_rows, stride_xt,
                             stride_xh, stride_ct, stride_st, eps,
                             NH: tl.constexpr, HD: tl.constexpr, HB: tl.constexpr,
                             BM: tl.constexpr, NORM: tl.constexpr, INTERP: tl.constexpr,
                             ROT: tl.constexpr = 0, HF: tl.constexpr = 0):
    XT: tl.constexpr = x_ptr.dtype.element_ty
    OT: tl.constexpr = out_ptr.dtype.element_ty
    HALF: tl.constexpr = HD // 2
    rows = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)               # [BM]
    t, h = rows // NH, rows % NH
    if ROT > 0 and ROT < HD:
        _partial_rope_rows(x_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr, n_rows, rows, t, h,
                           stride_xt, stride_xh, stride_ct, stride_st, eps, HD, ROT, HF,
                           NORM, XT, OT, INTERP)
    else:
        c = tl.arange(0, HB)                                                       # [HB]
        m = (rows < n_rows)[:, None] & (c < HALF)[None, :]                         # [BM, HB]
        xa = x_ptr + (t * stride_xt + h * stride_xh)[:, None] + c[None, :]
        x1 = tl.load(xa, mask=m, other=0.0).to(tl.float32)                         # [BM, HB]
        x2 = tl.load(xa + HALF, mask=m, other=0.0).to(tl.float32)
        if NORM:
            r = tl.math.rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / HD + eps)
            w1 = tl.load(w_ptr + c, mask=c < HALF, other=0.0).to(tl.float32)       # [HB]
            w2 = tl.load(w_ptr + HALF + c, mask=c < HALF, other=0.0).to(tl.float32)
            n1 = _rnd(w1[None, :] * _rnd(x1 * r[:, None], XT, INTERP), OT, INTERP)  # rnd_o(w rnd_x)
            n2 = _rnd(w2[None, :] * _rnd(x2 * r[:, None], XT, INTERP), OT, INTERP)
        else:
            n1, n2 = x1, x2
        ca = cos_ptr + (t * stride_ct)[:, None] + c[None, :]
        sa = sin_ptr + (t * stride_st)[:, None] + c[None, :]
        cos1, cos2 = tl.load(ca, mask=m, other=0.0), tl.load(ca + HALF, mask=m, other=0.0)
        sin1, sin2 = tl.load(sa, mask=m, other=0.0), tl.load(sa + HALF, mask=m, other=0.0)
        o1 = n1 * cos1 - n2 * sin1                                                 # [BM, HB]
        o2 = n2 * cos2 + n1 * sin2
        oa = out_ptr + rows[:, None] * HD + c[None, :]                             # [T, NH, HD]
        tl.store(oa, _rnd(o1, OT, INTERP).to(OT), mask=m)
        tl.store(oa + HALF, _rnd(o2, OT, INTERP).to(OT), mask=m)


@triton.jit
def _partial_rope_rows(x_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr, n_rows, rows, t, h, stride_xt,
                       stride_xh, stride_ct, stride_st, eps, HD: tl.constexpr,
                       ROT: tl.constexpr, HF: tl.constexpr, NORM: tl.constexpr, XT: tl.constexpr,
                       OT: tl.constexpr, INTERP: tl.constexpr):
    """_qk_norm_rope_fwd_kernel's rows with RoPE on their first ROT dims only."""
    HR: tl.constexpr = ROT // 2
    c = tl.arange(0, HF)                                                       # [HF]
    live = rows < n_rows
    m = live[:, None] & (c < HD)[None, :]                                      # [BM, HF]
    rot = c < ROT
    mr = live[:, None] & rot[None, :]
    base = (t * stride_xt + h * stride_xh)[:, None]
    x = tl.load(x_ptr + base + c[None, :], mask=m, other=0.0).to(tl.float32)   # [BM, HF]
    p = tl.where(c < HR, c + HR, c - HR)                  # a rotated dim's partner (c < ROT)
    xp = tl.load(x_ptr + base + p[None, :], mask=mr, other=0.0).to(tl.float32)
    if NORM:
        r = tl.math.rsqrt(tl.sum(x * x, axis=1) / HD + eps)                    # [BM]
        w = tl.load(w_ptr + c, mask=c < HD, other=0.0).to(tl.float32)          # [HF]
        wp = tl.load(w_ptr + p, mask=rot, other=0.0).to(tl.float32)
        n = _rnd(w[None, :] * _rnd(x * r[:, None], XT, INTERP), OT, INTERP)    # rnd_o(w rnd_x)
        npr = _rnd(wp[None, :] * _rnd(xp * r[:, None], XT, INTERP), OT, INTERP)
    else:
        n, npr = x, xp
    cs = tl.load(cos_ptr + (t * stride_ct)[:, None] + c[None, :], mask=mr, other=0.0)
    sn = tl.load(sin_ptr + (t * stride_st)[:, None] + c[None, :], mask=mr, other=0.0)
    first = (c < HR)[None, :]
    o = tl.where(first, n * cs - npr * sn, n * cs + npr * sn)                  # [BM, HF]
    o = tl.where(rot[None, :], o, n)
    tl.store(out_ptr + rows[:, None] * HD + c[None, :], _rnd(o, OT, INTERP).to(OT), mask=m)
