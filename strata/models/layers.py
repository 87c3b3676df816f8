"""The shared per-token layers of a decoder: RMSNorm and rotary position embeddings.

Legend: T tokens, h heads, hd head dim.

    rms_norm(x, w, eps)              x * rsqrt(mean(x^2) + eps) * w over the last dim
    norm_rope(x [T, h, hd], w, cos, sin, eps)    apply_rope(rms_norm(x, w, eps).transpose(0, 1),
                                     cos, sin) -> [h, T, hd] (w None: rope only), attention's
                                     per-head q/k norm and NEOX RoPE
    rope_cos_sin(positions, hd, θ)   cos, sin [T, hd], NEOX RoPE (frequency i on dims i, i + hd/2)
    yarn_cos_sin(positions, hd, θ, factor, orig_ctx, ...)   the same with YaRN's frequencies and
                                     attention factor (GPT-OSS)
    apply_rope(x [h, T, hd], cos, sin)              NEOX; cos/sin [T, R], R < hd: on the first
                                                    R dims, the rest passed (GLM-4.5: R = hd/2)
    apply_rope_pairs(x [h, T, R], cos, sin)         interleaved pairs (2i, 2i+1) rotated by
                                                    frequency i (DeepSeek's MLA rope key; GGUF
                                                    rope type NORM)

An architecture with another RoPE (YaRN scaling, interleaved pairs, a partial rotary dim) adds its
own `*_cos_sin` / `apply_*` pair here; attention takes whatever cos/sin it is handed.

rms_norm and norm_rope run strata's fused Triton kernels for CUDA tensors in bf16/fp16 and their
plain-torch twins elsewhere (the CPU's fp32 path is the twins' code, unchanged); `pin_norm`
("torch" / "triton") forces one inside a block (strata.kernels.norm).
"""
from __future__ import annotations

import contextlib
import math

import torch

from strata.kernels import norm as _norm
from strata.kernels import rope_pairs as _rope
from strata.rope_scaling import yarn_mscale


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm over the last dim, computed in fp32 (as HF does), rounded to x's dtype, times w:
    the fused kernel where `norm_impl` says so and it takes the shape, else the torch twin
    (into `out` when given: norm_out's view of a carve's buffer)."""
    if _norm.norm_impl(x) == "triton" and _norm.rms_norm_supported(x, w):
        return _norm.rms_norm(x, w, eps, out=out)
    return _norm.rms_norm_torch(x, w, eps, out=out)


def norm_out(buf: torch.Tensor | None, x: torch.Tensor, w: torch.Tensor | None
             ) -> torch.Tensor | None:
    """rms_norm(x, w)'s output as a view of the flat `buf` (the carve's xn: strata.models.
    provider.LayerWorkspace.xn), or None where there is none, or it is too small, of another
    dtype or on another device (a CPU read in fp32 allocates its own)."""
    dt = x.dtype if w is None else torch.promote_types(w.dtype, x.dtype)
    return buf_view(buf, x.shape, dt, x.device)


def buf_view(buf: torch.Tensor | None, shape, dtype: torch.dtype, device
             ) -> torch.Tensor | None:
    """A contiguous `shape` view of the contiguous `buf`'s first values (a carve's buffer, flat
    or a view of one), or None where there is none, or it is too small, of another dtype or on
    another device, or not contiguous."""
    n = math.prod(shape)
    if buf is None or buf.dtype != dtype or buf.device != device or buf.numel() < n \
            or not buf.is_contiguous():
        return None
    return buf.reshape(-1)[:n].view(shape)


def into_view(into: torch.Tensor | None, shape, dtype: torch.dtype, device
              ) -> torch.Tensor | None:
    """`into` itself where it is a contiguous `shape` of `dtype` on `device`, else None: a
    layer's normed input once everything that reads it has (an attention's projections, an
    FFN's gate and up), whose bytes then take the layer's [T, D] output (the carve's xn), so
    that output lies in the plan, not beside it."""
    if into is None or not into.is_contiguous() or tuple(into.shape) != tuple(shape):
        return None
    return buf_view(into.view(-1), shape, dtype, device)


def matmul_into(a: torch.Tensor, wt: torch.Tensor, into: torch.Tensor | None) -> torch.Tensor:
    """a [T, n] @ wt^T [n, m] -> [T, m], written into `into` where into_view takes it, else a
    new tensor; the same bits either way."""
    shape = (a.shape[0], wt.shape[0])
    return torch.matmul(a, wt.t(), out=into_view(into, shape, torch.promote_types(
        a.dtype, wt.dtype), a.device))


def add_rounded_(x: torch.Tensor, y: torch.Tensor, rows: int = 2048) -> torch.Tensor:
    """x [T, D] += y [T, D] rounded to x's dtype first: x + y.to(x.dtype), the same bits,
    `rows` rows at a time, so the rounded copy of an fp32 y (the experts' accumulator, the
    carve's moe_out) is one block's [rows, D] rather than a [T, D] beside the plan (470 MB at a
    32K chunk of DeepSeek-V3). rows only sizes that copy: the sums are elementwise."""
    if y.dtype == x.dtype:
        return x.add_(y)
    for a in range(0, x.shape[0], rows):
        x[a:a + rows].add_(y[a:a + rows].to(x.dtype))
    return x


def norm_rope(x: torch.Tensor, w: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
              eps: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, h, hd] -> apply_rope(rms_norm(x, w, eps).transpose(0, 1), cos, sin)
    [h, T, hd] (w None: no norm; cos/sin [T, R]: RoPE on the first R dims), as one fused kernel
    pass where `norm_impl` says so and it takes the inputs (NEOX cos/sin fp32, R even), else the
    torch twin. For the projection's
    contiguous x either way the result is the [h, T, hd] transposed view of a [T, h, hd] buffer
    (the twin's elementwise ops keep their input's strides). `out`: that [T, h, hd] buffer
    given (norm_out's view of a carve's q or k)."""
    if _norm.norm_impl(x) == "triton" and _norm.qk_norm_rope_supported(x, w, cos, sin):
        return _norm.qk_norm_rope(x, w, cos, sin, eps, out=out)
    return _norm.qk_norm_rope_torch(x, w, cos, sin, eps, out=out)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, hd] (fp32) for NEOX RoPE: frequency i on dims i and i + hd/2."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32,
                                            device=positions.device) / head_dim)   # [hd/2]
    ang = positions.float()[:, None] * inv_freq[None, :]                           # [T, hd/2]
    ang = torch.cat([ang, ang], dim=-1)                                            # [T, hd]
    return ang.cos(), ang.sin()


def yarn_inv_freq(head_dim: int, theta: float, factor: float, orig_ctx: int,
                  beta_fast: float = 32.0, beta_slow: float = 1.0, truncate: bool = True
                  ) -> tuple[torch.Tensor, float]:
    """YaRN (arXiv 2309.00071) as Hugging Face computes it: inverse frequencies [hd/2] (fp32)
    blended between interpolated (/factor) and original by a linear ramp over the dims whose
    wavelength lies between beta_fast and beta_slow rotations of the original context, and the
    attention factor 0.1 ln(factor) + 1 that scales cos and sin. `truncate` rounds the ramp's
    ends to whole dims."""
    dim = head_dim
    pos_freqs = theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)      # [hd/2]
    extrapolated, interpolated = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)

    def corr_dim(rotations: float) -> float:
        return dim * math.log(orig_ctx / (rotations * 2 * math.pi)) / (2 * math.log(theta))
    low, high = corr_dim(beta_fast), corr_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001   # a one-dim ramp would divide by zero
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp                     # 1: the original frequency, 0: the interpolated one
    inv_freq = interpolated * (1 - keep) + extrapolated * keep
    return inv_freq, yarn_mscale(factor)


def yarn_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, factor: float,
                 orig_ctx: int, beta_fast: float = 32.0, beta_slow: float = 1.0,
                 truncate: bool = True, attn: float | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, hd] (fp32) of NEOX RoPE with YaRN frequencies, times the attention factor
    (`attn`; None: YaRN's own, yarn_mscale(factor))."""
    inv_freq, own = yarn_inv_freq(head_dim, theta, factor, orig_ctx, beta_fast, beta_slow,
                                  truncate)
    attn = own if attn is None else attn
    ang = positions.float()[:, None] * inv_freq.to(positions.device)[None, :]      # [T, hd/2]
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos() * attn, ang.sin() * attn


def shape_cos_sin(positions: torch.Tensor, shape, dim: int | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, dim] of a model shape's RoPE over `dim` rotary dims (default its rot_dim):
    YaRN's (shape.yarn, strata.shapes.Yarn: factor, original context, betas, truncation and
    the cos/sin multiplier attn, 0 for YaRN's own) or plain. The one table every wiring reads."""
    dim = shape.rot_dim if dim is None else dim
    y = shape.yarn
    if y is not None:
        return yarn_cos_sin(positions, dim, shape.rope_theta, y.factor, y.orig_ctx,
                            y.beta_fast, y.beta_slow, y.truncate, attn=y.attn or None)
    return rope_cos_sin(positions, dim, shape.rope_theta)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [h, T, hd]: x*cos + rotate_half(x)*sin, rotate_half(a, b) = (-b, a) (in fp32, rounded to
    x's dtype: strata.kernels.norm.neox_rope_torch, the fused kernel's twin); cos/sin [T, R]
    with R < hd rotate x[..., :R] only (partial rotary), x[..., R:] passed through."""
    return _norm.neox_rope_torch(x, cos, sin)


def apply_rope_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., T, R]: pairs (x[2i], x[2i+1]) rotated by angle i (cos/sin [T, R] as rope_cos_sin
    gives them: angle i on dims i and i + R/2), a new tensor (strata.kernels.rope_pairs.
    rotated_pairs; rope_pairs_in_place rotates a view where it lies)."""
    return _rope.rotated_pairs(x, cos, sin)


def rope_pairs_in_place(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [G, T, R] (any strides, a unit last one) rotated as apply_rope_pairs, written into x:
    the fused kernel where `norm_impl` says so, else its twin a group of heads at a time; the
    same bits either way, and no fp32 copy of x's columns beside it on the GPU."""
    if _norm.norm_impl(x) == "triton":
        return _rope.rope_pairs_(x, cos, sin)
    return _rope.rope_pairs_torch_(x, cos, sin)


def on_device(device: torch.device):
    """The device context of a CUDA device (a no-op elsewhere): Triton launches on the current
    device's stream, so a layer split makes each layer's GPU current while it runs."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
