"""256-weight k-quants strata reads: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (decode only, as gguf-py)."""
from __future__ import annotations

import torch

from strata.formats._util import f16


def q4_k_scale_min(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """12 packed bytes [n, 12] -> 6-bit (scale, min) [n, 8] each, ggml's get_scale_min_k4.

    Bytes 0-3: scale s (low 6 bits) + top 2 bits of scale s+4; bytes 4-7 the same for mins;
    bytes 8-11: low nibble of scale s+4, high nibble of min s+4.
    """
    s = scales.to(torch.int32)
    dd, mm, md = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = torch.cat([dd & 63, (md & 0xF) | ((dd >> 6) << 4)], dim=1)
    mn = torch.cat([mm & 63, (md >> 4) | ((mm >> 6) << 4)], dim=1)
    return sc, mn


def dequantize_q4_k(blocks: torch.Tensor) -> torch.Tensor:
    """Q4_K [n, 144]: fp16 d, dmin; scales[12]; qs[128]. Sub-block s (32 weights) uses the low
    (s even) or high (s odd) nibbles of qs[32*(s//2) : 32*(s//2)+32].
    w = (d * sc[s]) * q - (dmin * m[s])."""
    n = blocks.shape[0]
    d, dmin = f16(blocks[:, 0:2]), f16(blocks[:, 2:4])
    sc, mn = q4_k_scale_min(blocks[:, 4:16])
    dsc = (d * sc.to(torch.float32))[:, :, None]                        # [n, 8, 1]
    dm = (dmin * mn.to(torch.float32))[:, :, None]
    qs = blocks[:, 16:144].to(torch.int32).reshape(n, 4, 1, 32)
    q = ((qs >> torch.tensor([0, 4], dtype=torch.int32, device=blocks.device)[:, None]) & 0xF)
    q = q.reshape(n, 8, 32).to(torch.float32)
    return (dsc * q - dm).reshape(n, 256)


def dequantize_q6_k(blocks: torch.Tensor) -> torch.Tensor:
    """Q6_K [n, 210]: ql[128]; qh[64]; int8 scales[16]; fp16 d. For weight w, h = w//128,
    r = w%128: low 4 bits = ql[64h + r%64] >> 4*(r//64), high 2 bits = qh[32h + r%32] >> 2*(r//32).
    w = (d * scale[w//16]) * (q - 32)."""
    n = blocks.shape[0]
    dev = blocks.device
    ql = blocks[:, 0:128].to(torch.int32).reshape(n, 2, 1, 64)
    qh = blocks[:, 128:192].to(torch.int32).reshape(n, 2, 1, 32)
    sc = blocks[:, 192:208].contiguous().view(torch.int8).to(torch.float32)
    d = f16(blocks[:, 208:210])
    lo = (ql >> torch.tensor([0, 4], dtype=torch.int32, device=dev)[:, None]) & 0xF
    hi = (qh >> torch.tensor([0, 2, 4, 6], dtype=torch.int32, device=dev)[:, None]) & 0x3
    q = lo.reshape(n, 256) | (hi.reshape(n, 256) << 4)
    ds = (d * sc)[:, :, None]                                           # [n, 16, 1]
    return (ds * (q - 32).to(torch.float32).reshape(n, 16, 16)).reshape(n, 256)


def _crumbs(qs: torch.Tensor) -> torch.Tensor:
    """Q2_K/Q3_K qs [n, 64] -> 2-bit codes [n, 256] in weight order: weight w is byte
    32*(w//128) + w%32 shifted by 2*((w%128)//32)."""
    n = qs.shape[0]
    q = qs.to(torch.int32).reshape(n, 2, 1, 32)
    sh = torch.tensor([0, 2, 4, 6], dtype=torch.int32, device=qs.device)[:, None]
    return ((q >> sh) & 3).reshape(n, 256)


def dequantize_q2_k(blocks: torch.Tensor) -> torch.Tensor:
    """Q2_K [n, 84]: scales[16] (low nibble scale, high nibble min of sub-block s = w//16);
    qs[64] 2-bit codes (`_crumbs`); fp16 d, dmin. w = (d * sc[s]) * q - (dmin * m[s])."""
    n = blocks.shape[0]
    sc = blocks[:, 0:16].to(torch.int32)
    d, dmin = f16(blocks[:, 80:82]), f16(blocks[:, 82:84])
    dl = (d * (sc & 0xF).to(torch.float32))[:, :, None]                 # [n, 16, 1]
    ml = (dmin * (sc >> 4).to(torch.float32))[:, :, None]
    q = _crumbs(blocks[:, 16:80]).to(torch.float32).reshape(n, 16, 16)
    return (dl * q - ml).reshape(n, 256)


def q3_k_scales(scales: torch.Tensor) -> torch.Tensor:
    """Q3_K's 12 packed bytes [n, 12] -> 16 signed 6-bit scales [n, 16] (int32, -32..31).
    Scale s: low 4 bits = nibble s//8 of byte s%8, high 2 bits = bits 2*(s//4) of byte 8 + s%4."""
    s = scales.to(torch.int32)
    lo = torch.cat([s[:, 0:8] & 0xF, s[:, 0:8] >> 4], dim=1)
    hi = torch.cat([(s[:, 8:12] >> sh) & 3 for sh in (0, 2, 4, 6)], dim=1)
    return (lo | (hi << 4)) - 32


def dequantize_q3_k(blocks: torch.Tensor) -> torch.Tensor:
    """Q3_K [n, 110]: hmask[32]; qs[64] 2-bit codes (`_crumbs`); scales[12]; fp16 d.
    Weight w: q = crumb - 4 * (1 - bit w//32 of hmask[w%32]); w = (d * scale[w//16]) * q."""
    n = blocks.shape[0]
    d = f16(blocks[:, 108:110])
    dl = (d * q3_k_scales(blocks[:, 96:108]).to(torch.float32))[:, :, None]   # [n, 16, 1]
    hm = blocks[:, 0:32].to(torch.int32)[:, None, :]                        # [n, 1, 32]
    hbit = (hm >> torch.arange(8, dtype=torch.int32, device=blocks.device)[:, None]) & 1
    q = _crumbs(blocks[:, 32:96]) - 4 * (1 - hbit.reshape(n, 256))
    return (dl * q.to(torch.float32).reshape(n, 16, 16)).reshape(n, 256)


def dequantize_q5_k(blocks: torch.Tensor) -> torch.Tensor:
    """Q5_K [n, 176]: fp16 d, dmin; scales[12] (as Q4_K); qh[32]; qs[128]. Sub-block s (32
    weights): low 4 bits as Q4_K, 5th bit = bit s of qh[w%32]. w = (d * sc[s]) * q - (dmin * m[s])."""
    n = blocks.shape[0]
    dev = blocks.device
    d, dmin = f16(blocks[:, 0:2]), f16(blocks[:, 2:4])
    sc, mn = q4_k_scale_min(blocks[:, 4:16])
    dsc = (d * sc.to(torch.float32))[:, :, None]                        # [n, 8, 1]
    dm = (dmin * mn.to(torch.float32))[:, :, None]
    qs = blocks[:, 48:176].to(torch.int32).reshape(n, 4, 1, 32)
    lo = ((qs >> torch.tensor([0, 4], dtype=torch.int32, device=dev)[:, None]) & 0xF)
    qh = blocks[:, 16:48].to(torch.int32)[:, None, :]                   # [n, 1, 32]
    hi = (qh >> torch.arange(8, dtype=torch.int32, device=dev)[:, None]) & 1
    q = (lo.reshape(n, 8, 32) | (hi << 4)).to(torch.float32)
    return (dsc * q - dm).reshape(n, 256)
