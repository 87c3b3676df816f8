"""Random *valid* ggml blocks for tests: random bytes with every scale field finite.

Scale fields come from `Format.fp16_fields` (the table), so tests hold no layout of their own.
"""
from __future__ import annotations

import torch

from strata.formats import get_format

_EXP_ONES = {"BF16": 0x7F80}  # exponent mask of the 16-bit float a field holds; fp16 otherwise


def finite16(u: torch.Tensor, fmt_name: str) -> torch.Tensor:
    """int32 16-bit patterns with inf/NaN turned finite (top exponent bit cleared)."""
    ones = _EXP_ONES.get(fmt_name, 0x7C00)
    return torch.where((u & ones) == ones, u ^ 0x4000, u)


def set16(blocks: torch.Tensor, off: int, u: torch.Tensor) -> None:
    """Write 16-bit patterns u [n] little-endian at byte `off` of blocks [n, block_bytes]."""
    blocks[:, off] = (u & 0xFF).to(torch.uint8)
    blocks[:, off + 1] = ((u >> 8) & 0xFF).to(torch.uint8)


def random_blocks(qtype, n_blocks: int, gen: torch.Generator) -> torch.Tensor:
    """uint8 [n_blocks, block_bytes]: uniform random bytes, finite scales."""
    fmt = get_format(qtype)
    b = torch.randint(0, 256, (n_blocks, fmt.block_bytes), generator=gen, dtype=torch.int32)
    b = b.to(torch.uint8)
    for off in fmt.fp16_fields:
        u = b[:, off].to(torch.int32) | (b[:, off + 1].to(torch.int32) << 8)
        set16(b, off, finite16(u, fmt.name))
    return b


def random_matrix(qtype, n: int, k: int, seed: int = 0) -> torch.Tensor:
    """uint8 [n, row_bytes(k)] of random valid blocks."""
    fmt = get_format(qtype)
    gen = torch.Generator().manual_seed(seed)
    return random_blocks(fmt, n * k // fmt.block, gen).reshape(n, fmt.row_bytes(k))


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """fp32 tensors equal bit for bit (NaN == NaN when the bits agree)."""
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int32),
                                              b.contiguous().view(torch.int32))
