"""`dequantize` / `quantize`: whole tensors of ggml blocks <-> fp32, gguf-py's call shapes.

    dequantize(raw [..., R] uint8, qtype) -> fp32 [..., R / block_bytes * block]
    quantize(x [..., K] float, qtype)     -> uint8 [..., K / block * block_bytes]

Bytes live in the last dimension, as `gguf.quants`. Inputs may be numpy arrays or torch tensors
(any device); results are torch tensors on the input's device. Each format's arithmetic lives in
its family module (plain, legacy, kquants, iquants, iq2, iq1, mxfp4); this module only checks and reshapes.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from strata.errors import StrataError
from strata.formats import iq1, iq2, iquants, kquants, legacy, mxfp4, plain
from strata.formats.table import get_format

Fn = Callable[[torch.Tensor], torch.Tensor]

# blocks per call of a family function: bounds the temporaries (MXFP4's quantizer holds 16
# candidate errors per weight) whatever the tensor size
CHUNK_BLOCKS = 1 << 16

# ggml type name -> blocks function; a format absent from QUANTIZERS is decode-only.
DEQUANTIZERS: dict[str, Fn] = {
    "F32": plain.dequantize_f32,
    "F16": plain.dequantize_f16,
    "BF16": plain.dequantize_bf16,
    "Q8_0": legacy.dequantize_q8_0,
    "Q4_0": legacy.dequantize_q4_0,
    "Q4_1": legacy.dequantize_q4_1,
    "Q5_0": legacy.dequantize_q5_0,
    "Q5_1": legacy.dequantize_q5_1,
    "IQ4_NL": iquants.dequantize_iq4_nl,
    "Q2_0": legacy.dequantize_q2_0,
    "Q2_K": kquants.dequantize_q2_k,
    "Q3_K": kquants.dequantize_q3_k,
    "Q4_K": kquants.dequantize_q4_k,
    "Q5_K": kquants.dequantize_q5_k,
    "Q6_K": kquants.dequantize_q6_k,
    "IQ2_XXS": iq2.dequantize_iq2_xxs,
    "IQ2_XS": iq2.dequantize_iq2_xs,
    "IQ2_S": iq2.dequantize_iq2_s,
    "IQ3_XXS": iquants.dequantize_iq3_xxs,
    "IQ3_S": iquants.dequantize_iq3_s,
    "IQ4_XS": iquants.dequantize_iq4_xs,
    "IQ1_S": iq1.dequantize_iq1_s,
    "IQ1_M": iq1.dequantize_iq1_m,
    "MXFP4": mxfp4.dequantize_mxfp4,
}
QUANTIZERS: dict[str, Fn] = {
    "F32": plain.quantize_f32,
    "F16": plain.quantize_f16,
    "BF16": plain.quantize_bf16,
    "Q8_0": legacy.quantize_q8_0,
    "Q4_0": legacy.quantize_q4_0,
    "Q4_1": legacy.quantize_q4_1,
    "Q5_0": legacy.quantize_q5_0,
    "Q5_1": legacy.quantize_q5_1,
    "Q2_0": legacy.quantize_q2_0,
    "MXFP4": mxfp4.quantize_mxfp4,
}


def _tensor(a) -> torch.Tensor:
    if isinstance(a, torch.Tensor):
        return a
    if isinstance(a, (np.ndarray, np.generic, bytes, bytearray, memoryview)):
        arr = np.frombuffer(a, dtype=np.uint8) if isinstance(a, (bytes, bytearray, memoryview)) \
            else np.ascontiguousarray(a)
        return torch.from_numpy(arr.copy())
    raise StrataError(f"expected a torch tensor or numpy array, got {type(a).__name__}")


def _as_bytes(raw: torch.Tensor) -> torch.Tensor:
    """Reinterpret any dtype as its bytes along the last dim (gguf-py's `rows.view(np.uint8)`)."""
    if raw.dtype == torch.uint8:
        return raw
    if raw.dim() == 0:
        raise StrataError("dequantize needs at least one dimension of bytes, got a scalar")
    return raw.contiguous().view(torch.uint8)


def dequantize(raw, qtype) -> torch.Tensor:
    """fp32 values of ggml blocks `raw` ([..., bytes]) of format `qtype` (name, id or enum)."""
    fmt = get_format(qtype)
    fn = DEQUANTIZERS.get(fmt.name)
    if fn is None:
        raise StrataError(f"no dequantizer for {fmt.name}")
    t = _as_bytes(_tensor(raw))
    if t.dim() == 0:
        raise StrataError("dequantize needs at least one dimension of bytes, got a scalar")
    nbytes = t.shape[-1]
    if nbytes % fmt.block_bytes:
        raise StrataError(f"{fmt.name} rows are whole {fmt.block_bytes}-byte blocks, but the last "
                          f"dimension holds {nbytes} bytes; pass the raw bytes of whole rows")
    lead = t.shape[:-1]
    out = _chunked(fn, t.reshape(-1, fmt.block_bytes), fmt.block, torch.float32)
    return out.reshape(*lead, nbytes // fmt.block_bytes * fmt.block)


def quantize(x, qtype) -> torch.Tensor:
    """ggml blocks (uint8, bytes in the last dim) of float `x` ([..., K]) in format `qtype`."""
    fmt = get_format(qtype)
    fn = QUANTIZERS.get(fmt.name)
    if fn is None:
        raise StrataError(f"strata cannot quantize to {fmt.name} (decode only); quantize to one "
                          f"of {', '.join(QUANTIZERS)}")
    t = _tensor(x)
    if not t.is_floating_point():
        raise StrataError(f"quantize takes floating-point weights, got {t.dtype}")
    if t.dim() == 0:
        raise StrataError("quantize needs at least one dimension of weights, got a scalar")
    k = t.shape[-1]
    fmt.row_bytes(k)  # clear error when k is not whole blocks
    lead = t.shape[:-1]
    out = _chunked(fn, t.to(torch.float32).reshape(-1, fmt.block), fmt.block_bytes, torch.uint8)
    return out.reshape(*lead, k // fmt.block * fmt.block_bytes)


def _chunked(fn: Fn, blocks: torch.Tensor, width: int, dtype: torch.dtype) -> torch.Tensor:
    """fn over blocks [n, ...] in CHUNK_BLOCKS pieces -> [n, width]."""
    n = blocks.shape[0]
    if n <= CHUNK_BLOCKS:
        return fn(blocks)
    out = torch.empty((n, width), dtype=dtype, device=blocks.device)
    for i in range(0, n, CHUNK_BLOCKS):
        out[i:i + CHUNK_BLOCKS] = fn(blocks[i:i + CHUNK_BLOCKS])
    return out

