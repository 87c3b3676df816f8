"""Float matrices -> ggml block bytes, for packing Hugging Face weights.

Plain formats (BF16/F16/F32) are cast by torch (a BF16 checkpoint packs bit-exactly); block formats
use `strata.formats.codec.quantize` for the formats it quantizes (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
Q2_0, MXFP4), else gguf-py's reference quantizers; the decode-only formats (the k-quants and
i-quants) are refused clearly.
"""
from __future__ import annotations

import numpy as np
import torch

from strata.errors import StrataError
from strata.formats.table import get_format

_PLAIN = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}


def quantize_rows(w: torch.Tensor, fmt) -> np.ndarray:
    """uint8 [..., rows, row_bytes] of `w` [..., rows, cols] in `fmt`, rows as GGUF stores them."""
    fmt = get_format(fmt)
    fmt.row_bytes(w.shape[-1])  # a clear error for a row that is not whole blocks
    if fmt.name in _PLAIN:
        t = w.detach().to(_PLAIN[fmt.name]).contiguous()
        return t.view(torch.uint8).numpy().reshape(*w.shape[:-1], -1)
    from strata.formats.codec import QUANTIZERS, quantize as sq   # torch, bit-exact with ggml
    if fmt.name in QUANTIZERS:
        return sq(w.detach().float().contiguous(), fmt.name).cpu().numpy().reshape(*w.shape[:-1], -1)
    import gguf
    from gguf.quants import quantize
    try:
        q = quantize(w.detach().float().numpy(), gguf.GGMLQuantizationType(fmt.ggml_type))
    except (NotImplementedError, ValueError):
        raise StrataError(f"cannot quantize to {fmt.name} here (gguf-py has no quantizer for it); "
                          f"use BF16 or one of {', '.join(QUANTIZERS)}") from None
    return np.ascontiguousarray(q).view(np.uint8).reshape(*w.shape[:-1], -1)
