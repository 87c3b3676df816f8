"""Importance-matrix ggml formats strata reads: IQ4_NL (32 weights) and IQ3_S (256 weights).

Decode only (gguf-py does not quantize them either); tables come from `strata.formats.tables`.
"""
from __future__ import annotations

import torch

from strata.formats._util import bits, f16, nibbles
from strata.formats.tables import KVALUES_IQ4NL, iq3s_grid_values


def dequantize_iq4_nl(blocks: torch.Tensor) -> torch.Tensor:
    """IQ4_NL [n, 18]: fp16 d; qs[16] nibbles (ggml order) index kvalues_iq4nl. w = d * kv[q]."""
    d = f16(blocks[:, :2])
    kv = torch.tensor(KVALUES_IQ4NL, dtype=torch.float32, device=blocks.device)
    return d * kv[nibbles(blocks[:, 2:]).long()]


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
