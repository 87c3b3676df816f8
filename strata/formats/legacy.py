"""32-weight ggml blocks with one fp16 scale: Q8_0, Q4_0, Q5_0 (and Q2_0's 64-weight block), or a
scale and an offset: Q4_1, Q5_1.

Each function takes blocks as uint8 [n, block_bytes] (dequantize) or fp32 [n, block] (quantize)
and mirrors gguf-py / ggml's reference C operation for operation, so results are bit-exact.
"""
from __future__ import annotations

import torch

from strata.formats._util import bits, f16, f16_bytes, nibbles, round_away


def dequantize_q8_0(blocks: torch.Tensor) -> torch.Tensor:
    """Q8_0 [n, 34]: fp16 d; int8 qs[32]. w = q * d."""
    d = f16(blocks[:, :2])
    q = blocks[:, 2:].contiguous().view(torch.int8).to(torch.float32)
    return q * d


def quantize_q8_0(x: torch.Tensor) -> torch.Tensor:
    """ggml quantize_row_q8_0_ref: d = amax/127 (fp32), q = roundf(x * (1/d))."""
    d = x.abs().amax(dim=1, keepdim=True) / 127
    inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    q = round_away(x * inv).to(torch.int8)
    return torch.cat([f16_bytes(d), q.view(torch.uint8)], dim=1)


def dequantize_q4_0(blocks: torch.Tensor) -> torch.Tensor:
    """Q4_0 [n, 18]: fp16 d; qs[16] (low nibble = weight j, high = j+16). w = d * (q - 8)."""
    d = f16(blocks[:, :2])
    return d * (nibbles(blocks[:, 2:]) - 8).to(torch.float32)


def _signed_amax(x: torch.Tensor) -> torch.Tensor:
    """The value (with its sign) of the first largest |x| in each block, as ggml's loop keeps."""
    return torch.gather(x, 1, x.abs().argmax(dim=1, keepdim=True))


def quantize_q4_0(x: torch.Tensor) -> torch.Tensor:
    """ggml quantize_row_q4_0_ref: d = max / -8, q = min(15, trunc(x/d + 8.5))."""
    d = _signed_amax(x) / -8
    inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    q = torch.trunc(x * inv + 8.5).to(torch.int32).clamp(0, 15)
    qs = q[:, :16] | (q[:, 16:] << 4)
    return torch.cat([f16_bytes(d), qs.to(torch.uint8)], dim=1)


def dequantize_q5_0(blocks: torch.Tensor) -> torch.Tensor:
    """Q5_0 [n, 22]: fp16 d; qh[4] (bit j = 5th bit of weight j); qs[16]. w = d * (q - 16)."""
    d = f16(blocks[:, :2])
    qh = bits(blocks[:, 2:6])
    q = nibbles(blocks[:, 6:]) | (qh << 4)
    return d * (q - 16).to(torch.float32)


def quantize_q5_0(x: torch.Tensor) -> torch.Tensor:
    """ggml quantize_row_q5_0_ref: d = max / -16, q = min(31, trunc(x/d + 16.5))."""
    d = _signed_amax(x) / -16
    inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    q = torch.trunc(x * inv + 16.5).to(torch.int32).clamp(0, 31)
    qs = (q[:, :16] & 0xF) | ((q[:, 16:] & 0xF) << 4)
    bit = torch.arange(8, dtype=torch.int32, device=q.device).repeat(4)   # bit j%8 of byte j/8
    hi = (q >> 4) << bit
    qh = hi.reshape(-1, 4, 8).sum(dim=2)
    return torch.cat([f16_bytes(d), qh.to(torch.uint8), qs.to(torch.uint8)], dim=1)


def dequantize_q4_1(blocks: torch.Tensor) -> torch.Tensor:
    """Q4_1 [n, 20]: fp16 d, m; qs[16] (low nibble = weight j, high = j+16). w = d * q + m."""
    d, m = f16(blocks[:, 0:2]), f16(blocks[:, 2:4])
    return d * nibbles(blocks[:, 4:]).to(torch.float32) + m


def _affine_codes(x: torch.Tensor, levels: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ggml quantize_row_q{4,5}_1_ref: d = (max - min) / levels, id = 1/d (0 when d == 0),
    q = min(levels, trunc((x - min) * id + 0.5)). A non-finite (x - min) * id (d subnormal, so
    1/d overflows: C undefined) stores code 0, as numpy's cast in gguf-py does on x86.

    max and min are the first largest / smallest weight, as ggml's loop (`if (v < min) min = v`)
    keeps them: that fixes the sign of a zero min or max where a block holds both +0 and -0
    (gguf-py's numpy reduction picks one by its SIMD order, which varies by machine)."""
    mx = torch.gather(x, 1, x.argmax(dim=1, keepdim=True))
    mn = torch.gather(x, 1, x.argmin(dim=1, keepdim=True))
    d = (mx - mn) / levels
    inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    t = torch.trunc((x - mn) * inv + 0.5)
    q = torch.where(torch.isfinite(t), t, torch.zeros_like(t)).to(torch.int32).clamp(0, levels)
    return d, mn, q


def quantize_q4_1(x: torch.Tensor) -> torch.Tensor:
    d, mn, q = _affine_codes(x, 15)
    qs = q[:, :16] | (q[:, 16:] << 4)
    return torch.cat([f16_bytes(d), f16_bytes(mn), qs.to(torch.uint8)], dim=1)


def dequantize_q5_1(blocks: torch.Tensor) -> torch.Tensor:
    """Q5_1 [n, 24]: fp16 d, m; qh[4] (bit j = 5th bit of weight j); qs[16]. w = d * q + m."""
    d, m = f16(blocks[:, 0:2]), f16(blocks[:, 2:4])
    q = nibbles(blocks[:, 8:]) | (bits(blocks[:, 4:8]) << 4)
    return d * q.to(torch.float32) + m


def quantize_q5_1(x: torch.Tensor) -> torch.Tensor:
    d, mn, q = _affine_codes(x, 31)
    qs = (q[:, :16] & 0xF) | ((q[:, 16:] & 0xF) << 4)
    bit = torch.arange(8, dtype=torch.int32, device=q.device).repeat(4)   # bit j%8 of byte j/8
    hi = (q >> 4) << bit
    qh = hi.reshape(-1, 4, 8).sum(dim=2)
    return torch.cat([f16_bytes(d), f16_bytes(mn), qh.to(torch.uint8), qs.to(torch.uint8)], dim=1)


def dequantize_q2_0(blocks: torch.Tensor) -> torch.Tensor:
    """Q2_0 [n, 18] (ggml type 42): fp16 d; qs[16], weight j at bits 2*(j%4) of byte j/4.
    w = (q - 1) * d: the levels -d, 0, d, 2d."""
    d = f16(blocks[:, :2])
    return (bits(blocks[:, 2:], 2) - 1).to(torch.float32) * d


def quantize_q2_0(x: torch.Tensor) -> torch.Tensor:
    """ggml quantize_row_q2_0_ref: d = amax (fp32), id = 1/d (0 when d == 0),
    q = clamp(roundf(x * id) + 1, 0, 3).

    Where x * id is not finite (amax subnormal, so 1/d overflows) ggml's C is undefined; the stored
    fp16 d is 0 there, every weight decodes to 0, and we store q = 1 (zero) for those weights.
    """
    d = x.abs().amax(dim=1, keepdim=True)
    inv = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    t = x * inv
    q = torch.where(torch.isfinite(t), round_away(torch.nan_to_num(t, 0.0, 0.0, 0.0)) + 1,
                    torch.ones_like(t))
    q = q.clamp(0, 3).to(torch.int32).reshape(-1, 16, 4)
    qs = q[..., 0] | (q[..., 1] << 2) | (q[..., 2] << 4) | (q[..., 3] << 6)
    return torch.cat([f16_bytes(d), qs.to(torch.uint8)], dim=1)
