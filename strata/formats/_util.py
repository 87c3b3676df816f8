"""Small torch helpers shared by the format references (byte fields -> numbers)."""
from __future__ import annotations

import torch


def f16(b: torch.Tensor) -> torch.Tensor:
    """[..., 2] little-endian fp16 bytes -> fp32 [..., 1] (exact)."""
    return b.contiguous().view(torch.float16).to(torch.float32)


def f16_bytes(x: torch.Tensor) -> torch.Tensor:
    """fp32 [..., 1] -> fp16 (round to nearest even) as [..., 2] uint8."""
    return x.to(torch.float16).contiguous().view(torch.uint8)


def nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[..., n] bytes -> [..., 2n] int32: all low nibbles, then all high nibbles (ggml's order)."""
    qs = qs.to(torch.int32)
    return torch.cat([qs & 0xF, qs >> 4], dim=-1)


def bits(b: torch.Tensor, width: int = 1) -> torch.Tensor:
    """[..., n] bytes -> [..., n * 8/width] int32 fields, least significant first in each byte."""
    shifts = torch.arange(0, 8, width, device=b.device, dtype=torch.int32)
    v = (b.to(torch.int32)[..., None] >> shifts) & ((1 << width) - 1)
    return v.reshape(*b.shape[:-1], -1)


def round_away(x: torch.Tensor) -> torch.Tensor:
    """C roundf: halves away from zero (ggml's quantizers), computed as gguf-py's np_roundf."""
    a = x.abs()
    fl = torch.floor(a)
    return torch.sign(x) * (fl + torch.floor(2 * (a - fl)))
