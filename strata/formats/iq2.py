"""The 2-bit i-quants: IQ2_XXS, IQ2_XS, IQ2_S (256 weights; grid points of 8 magnitudes from
{8, 25, 43}, each with 8 signs). Decode only, as gguf-py; grids from `strata.formats.tables`.

Every format scales sub-blocks by db = (d * (0.5 + scale)) * 0.25 and computes
w = db * grid * sign in that order (gguf-py's and ggml's), so results are bit-exact.
"""
from __future__ import annotations

import torch

from strata.formats._util import bits, f16, ksign_bits, le_words, sign_bits
from strata.formats.tables import grid_values


def _db(d: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return d * (0.5 + scale.to(torch.float32)) * 0.25


def dequantize_iq2_xxs(blocks: torch.Tensor) -> torch.Tensor:
    """IQ2_XXS [n, 66]: fp16 d; 8 pairs of u32 (one per 32 weights): the first holds 4 grid
    indices (bytes), the second 4 x 7-bit ksigns indices (bits 7j..) and the scale (bits 28..31)."""
    n = blocks.shape[0]
    d = f16(blocks[:, :2])
    words = le_words(blocks[:, 2:66], 4)
    words = words.reshape(n, 8, 2)
    db = _db(d, words[..., 1] >> 28)                                               # [n, 8]
    sgn = ksign_bits(words[..., 1])                                                # [n, 8, 32]
    idx = blocks[:, 2:66].reshape(n, 8, 8)[:, :, :4].long()                       # [n, 8, 4]
    mag = grid_values("IQ2_XXS").to(blocks.device)[idx].reshape(n, 8, 32).to(torch.float32)
    return (db[:, :, None] * mag * sgn).reshape(n, 256)


def dequantize_iq2_xs(blocks: torch.Tensor) -> torch.Tensor:
    """IQ2_XS [n, 74]: fp16 d; u16 qs[32] (bits 0..8 grid index, 9..15 ksigns index, 8 weights
    each); scales[8] (nibble s%2 of byte s//2 scales weights 16s..16s+15)."""
    n = blocks.shape[0]
    d = f16(blocks[:, :2])
    qs = le_words(blocks[:, 2:66], 2)      # [n, 32]
    db = _db(d, bits(blocks[:, 66:74], 4))                                         # [n, 16]
    sgn = sign_bits(qs >> 9).reshape(n, 16, 16)
    mag = grid_values("IQ2_XS").to(blocks.device)[(qs & 511).long()]               # [n, 32, 8]
    return (db[:, :, None] * mag.reshape(n, 16, 16).to(torch.float32) * sgn).reshape(n, 256)


def dequantize_iq2_s(blocks: torch.Tensor) -> torch.Tensor:
    """IQ2_S [n, 82]: fp16 d; qs[32] (low 8 bits of the grid index of weights 8g..8g+7);
    signs[32] (bit i of byte g: weight 8g+i); qh[8] (bits 2(g%4) of qh[g//4]: index bits 8-9);
    scales[8] (as IQ2_XS)."""
    n = blocks.shape[0]
    d = f16(blocks[:, :2])
    idx = blocks[:, 2:34].to(torch.int64) | (bits(blocks[:, 66:74], 2).to(torch.int64) << 8)
    sgn = torch.where(bits(blocks[:, 34:66]) == 0, 1.0, -1.0).reshape(n, 16, 16)
    db = _db(d, bits(blocks[:, 74:82], 4))                                         # [n, 16]
    mag = grid_values("IQ2_S").to(blocks.device)[idx].reshape(n, 16, 16).to(torch.float32)
    return (db[:, :, None] * mag * sgn).reshape(n, 256)
