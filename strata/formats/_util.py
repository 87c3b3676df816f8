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


def ksign_bits(aux: torch.Tensor) -> torch.Tensor:
    """IQ2_XXS / IQ3_XXS sign words int64 [..., m] (4 x 7-bit ksigns indices in bits 0..27)
    -> fp32 +-1 [..., m, 32]: weight 8j+i of a word takes bit i of ksigns_iq2xs[index j]."""
    idx = (aux[..., None] >> torch.tensor([0, 7, 14, 21], device=aux.device)) & 0x7F
    return sign_bits(idx)


def sign_bits(idx: torch.Tensor) -> torch.Tensor:
    """7-bit ksigns indices [..., j] -> fp32 +-1 [..., 8j] (8 signs per index, bit i = weight i)."""
    from strata.formats.tables import KSIGNS_IQ2XS
    ks = torch.tensor(KSIGNS_IQ2XS, dtype=torch.int32, device=idx.device)[idx.long()]
    b = (ks[..., None] >> torch.arange(8, dtype=torch.int32, device=idx.device)) & 1
    return torch.where(b == 0, 1.0, -1.0).reshape(*idx.shape[:-1], -1)


def le_words(b: torch.Tensor, width: int) -> torch.Tensor:
    """[..., n] bytes -> int64 [..., n / width] unsigned little-endian words of `width` bytes
    (assembled from the bytes, so any storage offset works)."""
    v = b.to(torch.int64).reshape(*b.shape[:-1], -1, width)
    return (v << (8 * torch.arange(width, device=b.device))).sum(dim=-1)
