"""Triton decoders of the plain formats BF16 and F16 (mirrors strata.formats.plain): no scales,
so each bundle's code is the weight.

    decode_<fmt>(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr=None) -> fp32 [BN, BK]
        (arguments: see the package doc; tab_ptr unused)
"""
import triton
import triton.language as tl

from strata.kernels.decode.bundle import traits


@triton.jit
def decode_bf16(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr=None):
    """bf16 -> fp32 is the 16 bits moved up: exact, NaN payloads included (as gguf-py)."""
    p = w_ptr.to(tl.pointer_type(tl.uint16))
    idx = offs_n.to(tl.int64)[:, None] * (row_bytes >> 1) + offs_k[None, :]
    u = tl.load(p + idx, mask=mask, other=0).to(tl.uint32)
    return (u << 16).to(tl.float32, bitcast=True)


@triton.jit
def decode_f16(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr=None):
    p = w_ptr.to(tl.pointer_type(tl.float16))
    idx = offs_n.to(tl.int64)[:, None] * (row_bytes >> 1) + offs_k[None, :]
    return tl.load(p + idx, mask=mask, other=0.0).to(tl.float32)


BF16 = traits("BF16", decode_bf16, NATIVE=True)
F16 = traits("F16", decode_f16)
