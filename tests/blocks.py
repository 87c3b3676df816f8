"""Valid ggml blocks for tests: random, edge-scale and code-sweep sets.

Scale fields come from `Format.fp16_fields` (the table), so tests hold no layout of their own.
"""
from __future__ import annotations

import torch

from strata.formats import get_format

_EXP_ONES = {"BF16": 0x7F80}  # exponent mask of the 16-bit float a field holds; fp16 otherwise

# fp16 bit patterns worth pinning as scales, each for a reason
EDGE_F16 = {
    "+0": 0x0000,            # every weight +-0
    "-0": 0x8000,            # sign of zero must survive d * q
    "min_subnormal": 0x0001,  # 2**-24: fp16 subnormal, normal once in fp32
    "max_subnormal": 0x03FF,
    "min_normal": 0x0400,
    "one": 0x3C00,
    "largest": 0x7BFF,       # 65504: d * q * sc must not overflow fp32 or lose bits
    "-largest": 0xFBFF,
}


def finite16(u: torch.Tensor, fmt_name: str) -> torch.Tensor:
    """int32 16-bit patterns with inf/NaN turned finite (top exponent bit cleared)."""
    ones = _EXP_ONES.get(fmt_name, 0x7C00)
    return torch.where((u & ones) == ones, u ^ 0x4000, u)


def set16(blocks: torch.Tensor, off: int, u) -> None:
    """Write 16-bit patterns u ([n] or an int) little-endian at byte `off` of blocks [n, bytes]."""
    u = torch.as_tensor(u, dtype=torch.int32)
    blocks[:, off] = (u & 0xFF).to(torch.uint8)
    blocks[:, off + 1] = ((u >> 8) & 0xFF).to(torch.uint8)


def get_nibble16(blocks: torch.Tensor, off: int) -> torch.Tensor:
    """int32 [n]: the 16-bit pattern held in the top nibbles of the 4 u16 words at byte `off`
    (IQ1_M's split fp16 scale, `Format.f16_nibbles`; word 0 holds the lowest nibble)."""
    u = torch.zeros(blocks.shape[0], dtype=torch.int32)
    for j in range(4):
        u |= ((blocks[:, off + 2 * j + 1].to(torch.int32) >> 4) & 0xF) << (4 * j)
    return u


def set_nibble16(blocks: torch.Tensor, off: int, u) -> None:
    """Write 16-bit patterns u into the top nibbles of the 4 u16 words at byte `off`."""
    u = torch.as_tensor(u, dtype=torch.int32)
    for j in range(4):
        hi = blocks[:, off + 2 * j + 1].to(torch.int32)
        blocks[:, off + 2 * j + 1] = ((hi & 0x0F) | (((u >> (4 * j)) & 0xF) << 4)).to(torch.uint8)


def set_scales(blocks: torch.Tensor, fmt, u) -> None:
    """Every fp16 scale field of blocks [n, bytes] of `fmt` set to the patterns u."""
    for off in fmt.fp16_fields:
        set16(blocks, off, u)
    if fmt.f16_nibbles is not None:
        set_nibble16(blocks, fmt.f16_nibbles, u)


def random_blocks(qtype, n_blocks: int, gen: torch.Generator) -> torch.Tensor:
    """uint8 [n_blocks, block_bytes]: uniform random bytes, finite scales."""
    fmt = get_format(qtype)
    b = torch.randint(0, 256, (n_blocks, fmt.block_bytes), generator=gen, dtype=torch.int32)
    b = b.to(torch.uint8)
    for off in fmt.fp16_fields:
        u = b[:, off].to(torch.int32) | (b[:, off + 1].to(torch.int32) << 8)
        set16(b, off, finite16(u, fmt.name))
    if fmt.f16_nibbles is not None:
        set_nibble16(b, fmt.f16_nibbles, finite16(get_nibble16(b, fmt.f16_nibbles), fmt.name))
    return b


def random_matrix(qtype, n: int, k: int, seed: int = 0) -> torch.Tensor:
    """uint8 [n, row_bytes(k)] of random valid blocks."""
    fmt = get_format(qtype)
    gen = torch.Generator().manual_seed(seed)
    return random_blocks(fmt, n * k // fmt.block, gen).reshape(n, fmt.row_bytes(k))


def code_sweep_blocks(qtype) -> torch.Tensor:
    """Blocks in which every code field takes every value it can hold, under every edge scale.

    Block set 1: all non-scale bytes equal b, for b = 0..255 (every nibble, 2-bit, 6-bit, 8-bit
    field value at every position). Block set 2: byte i of block b is (b + 37 i) mod 256, so
    neighbouring fields differ (Q5_0's high bits, IQ3_S's grid index high bit vs low byte).
    Each set is repeated under every EDGE_F16 scale (all fp16 fields of a block set alike; IQ1_M's
    split scale too, whose nibbles then override the top nibbles of the swept scale bytes).
    Plain F16/BF16: every 16-bit pattern. For MXFP4 (no fp16 field) the first byte is the e8m0
    scale, which b sweeps through 0..255.
    """
    fmt = get_format(qtype)
    if fmt.block == 1:  # plain 16-bit floats: all 65536 patterns, inf and NaN included
        u = torch.arange(1 << 16, dtype=torch.int32)
        return torch.stack([u & 0xFF, u >> 8], dim=1).to(torch.uint8)
    b = torch.arange(256, dtype=torch.int32)[:, None]
    pos = torch.arange(fmt.block_bytes, dtype=torch.int32)[None, :]
    sets = [(b + 0 * pos) & 0xFF, (b + 37 * pos) & 0xFF]
    base = torch.cat(sets).to(torch.uint8)                                # [512, block_bytes]
    if not fmt.fp16_fields and fmt.f16_nibbles is None:
        return base
    out = []
    for u in EDGE_F16.values():
        blk = base.clone()
        set_scales(blk, fmt, u)
        out.append(blk)
    return torch.cat(out)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """fp32 tensors equal bit for bit (NaN == NaN when the bits agree)."""
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int32),
                                              b.contiguous().view(torch.int32))


def same_bits_nan_any(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit, except that any NaN matches any NaN. For F16 only: fp16 -> fp32 conversion
    quiets signalling NaNs in torch and on the GPU but not in numpy; every NaN stays a NaN."""
    both_nan = torch.isnan(a) & torch.isnan(b)
    return a.shape == b.shape and same_bits(torch.where(both_nan, 0.0, a),
                                            torch.where(both_nan, 0.0, b))


def assert_decoded_equal(got: torch.Tensor, want: torch.Tensor, name: str) -> None:
    """The bit-exact contract: same fp32 bits (F16: NaN payloads excepted, same_bits_nan_any)."""
    ok = same_bits_nan_any(got, want) if name == "F16" else same_bits(got, want)
    if not ok:
        g, w = got.reshape(-1), want.reshape(-1)
        diff = (g.view(torch.int32) != w.view(torch.int32)).nonzero().flatten()
        i = int(diff[0]) if len(diff) else -1
        raise AssertionError(f"{name}: {len(diff)} of {g.numel()} values differ; first at flat "
                             f"index {i}: got {g[i].item()!r} want {w[i].item()!r}")
