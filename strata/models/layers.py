"""The shared per-token layers of a decoder: RMSNorm and rotary position embeddings.

Legend: T tokens, h heads, hd head dim.

    rms_norm(x, w, eps)              x * rsqrt(mean(x^2) + eps) * w over the last dim
    rope_cos_sin(positions, hd, θ)   cos, sin [T, hd], NEOX RoPE (frequency i on dims i, i + hd/2)
    apply_rope(x [h, T, hd], cos, sin)

An architecture with another RoPE (YaRN scaling, interleaved pairs, a partial rotary dim) adds its
own `*_cos_sin` / `apply_*` pair here; attention takes whatever cos/sin it is handed.
"""
from __future__ import annotations

import contextlib

import torch


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim, computed in fp32 (as HF does), result in x's dtype."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(x.dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, hd] (fp32) for NEOX RoPE: frequency i on dims i and i + hd/2."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32,
                                            device=positions.device) / head_dim)   # [hd/2]
    ang = positions.float()[:, None] * inv_freq[None, :]                           # [T, hd/2]
    ang = torch.cat([ang, ang], dim=-1)                                            # [T, hd]
    return ang.cos(), ang.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [h, T, hd]: x*cos + rotate_half(x)*sin, rotate_half(a, b) = (-b, a)."""
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x.float() * cos + rot.float() * sin).to(x.dtype)


def on_device(device: torch.device):
    """The device context of a CUDA device (a no-op elsewhere): Triton launches on the current
    device's stream, so a layer split makes each layer's GPU current while it runs."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
