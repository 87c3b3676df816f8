"""The 1.5-bit i-quants: IQ1_S and IQ1_M (256 weights; grid points of 8 values from {-1, 0, 1},
shifted by +-0.125). Decode only, as gguf-py; the grid from `strata.formats.tables`.

Both compute w = (d * (2 * scale + 1)) * (grid + delta) in that order (gguf-py's and ggml's).
"""
from __future__ import annotations

import torch

from strata.formats._util import bits, f16, le_words
from strata.formats.tables import grid_values

DELTA = 0.125


def _u16(b: torch.Tensor) -> torch.Tensor:
    """[n, 2m] little-endian bytes -> int32 [n, m] unsigned 16-bit words."""
    return le_words(b, 2).to(torch.int32)


def dequantize_iq1_s(blocks: torch.Tensor) -> torch.Tensor:
    """IQ1_S [n, 50]: fp16 d; qs[32] (low 8 bits of the grid index of weights 8g..8g+7); u16
    qh[8], one per 32 weights s: bits 3j..3j+2 the index high bits of point 4s+j, bits 12..14 the
    scale, bit 15 the delta's sign (set: -0.125)."""
    n = blocks.shape[0]
    d = f16(blocks[:, :2])
    qh = _u16(blocks[:, 34:50])                                                   # [n, 8]
    dl = d * (2 * ((qh >> 12) & 7) + 1).to(torch.float32)                         # [n, 8]
    delta = torch.where((qh & 0x8000) == 0, DELTA, -DELTA)                        # [n, 8]
    hi = (qh[:, :, None] >> torch.tensor([0, 3, 6, 9], device=blocks.device)) & 7  # [n, 8, 4]
    idx = blocks[:, 2:34].to(torch.int64) | (hi.reshape(n, 32).to(torch.int64) << 8)
    g = grid_values("IQ1_S").to(blocks.device)[idx].to(torch.float32).reshape(n, 8, 32)
    return (dl[:, :, None] * (g + delta[:, :, None])).reshape(n, 256)


def iq1_m_scale(blocks: torch.Tensor) -> torch.Tensor:
    """IQ1_M's fp16 d [n, 1] (fp32): the top nibbles of its 4 scale words, word 0 lowest."""
    sc = _u16(blocks[:, 48:56])                                                   # [n, 4]
    u = sum(((sc[:, j] >> 12) & 0xF) << (4 * j) for j in range(4))
    return u.to(torch.int16).view(torch.float16).to(torch.float32)[:, None]


def dequantize_iq1_m(blocks: torch.Tensor) -> torch.Tensor:
    """IQ1_M [n, 56]: qs[32] (index low bits of points g); qh[16] (nibble g%2 of byte g//2:
    bits 0..2 index bits 8..10 of point g, bit 3 its delta's sign); 4 u16 scale words: bits
    3j..3j+2 of word i scale weights 16(4i+j)..+15; top nibbles the fp16 d (`iq1_m_scale`)."""
    n = blocks.shape[0]
    d = iq1_m_scale(blocks)
    sc = _u16(blocks[:, 48:56])
    s3 = (sc[:, :, None] >> torch.tensor([0, 3, 6, 9], device=blocks.device)) & 7  # [n, 4, 4]
    dl = d * (2 * s3.reshape(n, 16) + 1).to(torch.float32)                        # [n, 16]
    qh = bits(blocks[:, 32:48], 4)                                                # [n, 32]
    delta = torch.where((qh & 8) == 0, DELTA, -DELTA)                             # [n, 32]
    idx = blocks[:, 0:32].to(torch.int64) | ((qh & 7).to(torch.int64) << 8)
    g = grid_values("IQ1_S").to(blocks.device)[idx].to(torch.float32)             # [n, 32, 8]
    w = (g + delta[:, :, None]).reshape(n, 16, 16)
    return (dl[:, :, None] * w).reshape(n, 256)
