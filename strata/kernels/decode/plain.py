"""Triton decoders of the plain formats BF16 and F16 (mirrors strata.formats.plain).

    decode_<fmt>(w_ptr, row_bytes, offs_n, offs_k, mask) -> fp32 [BN, BK]  (see the package doc)
"""
import triton
import triton.language as tl

from strata.kernels.decode._common import fmt_consts

GGML_BF16, _, _ = fmt_consts("BF16")
GGML_F16, _, _ = fmt_consts("F16")


@triton.jit
def decode_bf16(w_ptr, row_bytes, offs_n, offs_k, mask):
    """bf16 -> fp32 is the 16 bits moved up: exact, NaN payloads included (as gguf-py)."""
    p = w_ptr.to(tl.pointer_type(tl.uint16))
    idx = offs_n.to(tl.int64)[:, None] * (row_bytes >> 1) + offs_k[None, :]
    u = tl.load(p + idx, mask=mask, other=0).to(tl.uint32)
    return (u << 16).to(tl.float32, bitcast=True)


@triton.jit
def decode_f16(w_ptr, row_bytes, offs_n, offs_k, mask):
    p = w_ptr.to(tl.pointer_type(tl.float16))
    idx = offs_n.to(tl.int64)[:, None] * (row_bytes >> 1) + offs_k[None, :]
    return tl.load(p + idx, mask=mask, other=0.0).to(tl.float32)
