"""Plain formats: F32, F16, BF16 (one weight per 'block')."""
from __future__ import annotations

import torch


def dequantize_f32(blocks: torch.Tensor) -> torch.Tensor:
    return blocks.contiguous().view(torch.float32)


def quantize_f32(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float32).contiguous().view(torch.uint8)


def dequantize_f16(blocks: torch.Tensor) -> torch.Tensor:
    return blocks.contiguous().view(torch.float16).to(torch.float32)


def quantize_f16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float16).contiguous().view(torch.uint8)


def dequantize_bf16(blocks: torch.Tensor) -> torch.Tensor:
    """bf16 bits moved into the top half of fp32 bits: exact, NaN payloads kept (as gguf-py)."""
    u = blocks.contiguous().view(torch.int16).to(torch.int32)
    return (u << 16).view(torch.float32)


def quantize_bf16(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> bf16 as ggml_compute_fp32_to_bf16: NaN forced quiet, else round to nearest even."""
    n = x.to(torch.float32).contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    is_nan = (n & 0x7FFFFFFF) > 0x7F800000
    n = torch.where(is_nan, (n & 0xFFFF0000) | (64 << 16), n)
    n = (n + (0x7FFF + ((n >> 16) & 1))) >> 16
    return (n & 0xFFFF).to(torch.int32).to(torch.int16).contiguous().view(torch.uint8)
