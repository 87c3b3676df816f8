"""Importance-matrix ggml formats with 4-bit levels or the IQ3 grids: IQ4_NL (32 weights), IQ4_XS,
IQ3_S and IQ3_XXS (256 weights).

Decode only (gguf-py does not quantize them either); tables come from `strata.formats.tables`.
"""
from __future__ import annotations

import torch

from strata.formats._util import bits, f16, ksign_bits, le_words, nibbles
from strata.formats.tables import KVALUES_IQ4NL, grid_values, iq3s_grid_values


def dequantize_iq4_nl(blocks: torch.Tensor) -> torch.Tensor:
    """IQ4_NL [n, 18]: fp16 d; qs[16] nibbles (ggml order) index kvalues_iq4nl. w = d * kv[q]."""
    d = f16(blocks[:, :2])
    kv = torch.tensor(KVALUES_IQ4NL, dtype=torch.float32, device=blocks.device)
    return d * kv[nibbles(blocks[:, 2:]).long()]


def dequantize_iq4_xs(blocks: torch.Tensor) -> torch.Tensor:
    """IQ4_XS [n, 136]: fp16 d; u16 scales_h; scales_l[4]; qs[128]. Sub-block s (32 weights):
    6-bit scale = nibble s%2 of scales_l[s//2] | (bits 2s of scales_h) << 4, minus 32; its
    weights are the nibbles of qs[16s : 16s+16], lows first. w = (d * scale) * kv[q]."""
    n = blocks.shape[0]
    d = f16(blocks[:, :2])
    sh = blocks[:, 2].to(torch.int32) | (blocks[:, 3].to(torch.int32) << 8)      # [n]
    lo = bits(blocks[:, 4:8], 4)                                                  # [n, 8]
    hi = (sh[:, None] >> (2 * torch.arange(8, dtype=torch.int32, device=blocks.device))) & 3
    dl = d * ((lo | (hi << 4)) - 32).to(torch.float32)                           # [n, 8]
    kv = torch.tensor(KVALUES_IQ4NL, dtype=torch.float32, device=blocks.device)
    q = nibbles(blocks[:, 8:136].reshape(n, 8, 16))                               # [n, 8, 32]
    return (dl[:, :, None] * kv[q.long()]).reshape(n, 256)


def dequantize_iq3_s(blocks: torch.Tensor) -> torch.Tensor:
    """IQ3_S [n, 110]: fp16 d; qs[64]; qh[8]; signs[32]; scales[4].

    Weight w (0..255) of sub-block b = w/32: grid point g = w/4 has index qs[g] | (bit g of qh) << 8
    and magnitude = byte w%4 of iq3s_grid[index]; sign = bit w of signs; scale nibble b of
    scales (low nibble first). w = (d * (1 + 2*scale)) * magnitude * (+-1), in that order.
    """
    n = blocks.shape[0]
    d = f16(blocks[:, :2])                                              # [n, 1]
    qs = blocks[:, 2:66].to(torch.int64)
    qh = bits(blocks[:, 66:74]).to(torch.int64)                         # [n, 64]
    signs = bits(blocks[:, 74:106])                                     # [n, 256]
    # byte s of scales holds sub-blocks 2s (low nibble) and 2s+1 (high); nibbles() gives lows first
    scales = nibbles(blocks[:, 106:110])
    scales = torch.stack([scales[:, :4], scales[:, 4:]], dim=2).reshape(n, 8)
    db = d * (1 + 2 * scales).to(torch.float32)                         # [n, 8]
    grid = iq3s_grid_values().to(blocks.device)[qs | (qh << 8)]         # [n, 64, 4]
    mag = grid.reshape(n, 8, 32).to(torch.float32)
    sgn = torch.where(signs.reshape(n, 8, 32) == 0, 1.0, -1.0)
    return (db[:, :, None] * mag * sgn).reshape(n, 256)


def dequantize_iq3_xxs(blocks: torch.Tensor) -> torch.Tensor:
    """IQ3_XXS [n, 98]: fp16 d; qs[64] grid indices (4 weights each); 8 u32 words, one per
    sub-block s of 32 weights: bits 7j..7j+6 index ksigns for weights 8j..8j+7, bits 28..31 the
    scale. w = ((d * (0.5 + scale)) * 0.5) * grid[qs[g]][w%4] * (+-1), in that order."""
    n = blocks.shape[0]
    d = f16(blocks[:, :2])
    aux = le_words(blocks[:, 66:98], 4)   # [n, 8]
    db = d * (0.5 + (aux >> 28).to(torch.float32)) * 0.5                         # [n, 8]
    sgn = ksign_bits(aux)                                                         # [n, 8, 32]
    grid = grid_values("IQ3_XXS").to(blocks.device)[blocks[:, 2:66].long()]      # [n, 64, 4]
    mag = grid.reshape(n, 8, 32).to(torch.float32)
    return (db[:, :, None] * mag * sgn).reshape(n, 256)
