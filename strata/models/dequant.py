"""Decode one matrix of a blob to fp32, for the plain-torch reference paths (never a hot path).

Shapes: a matrix slot of a blob holds [rows, cols] weights in its block format (rows = output
features). Plain formats (F32/F16/BF16) decode in torch on the tensor's own device; block formats
go through the block decoders of `strata.formats` when that module provides them, otherwise
through gguf-py's numpy reference (the oracle the decoders are tested against).
"""
from __future__ import annotations

import numpy as np
import torch

from strata.blob import MatrixSlot
from strata.errors import StrataError

_PLAIN = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def dequant_matrix(blob: torch.Tensor, slot: MatrixSlot) -> torch.Tensor:
    """fp32 [rows, cols] from the uint8 bytes of one blob (`blob[slot.offset:...]`)."""
    raw = blob[slot.offset:slot.offset + slot.nbytes]
    name = slot.fmt.name
    if name in _PLAIN:
        # .clone(): a view at an odd byte offset cannot be reinterpreted in place
        return raw.clone().view(_PLAIN[name]).reshape(slot.rows, slot.cols).float()
    import gguf
    try:
        qtype = gguf.GGMLQuantizationType(slot.fmt.ggml_type)
    except ValueError:
        raise StrataError(f"no reference decoder for {name} yet (gguf-py does not know ggml type "
                          f"{slot.fmt.ggml_type}); it comes with strata.formats") from None
    rows = raw.detach().cpu().numpy().reshape(slot.rows, slot.row_bytes)
    w = gguf.quants.dequantize(rows, qtype).astype(np.float32, copy=False)
    return torch.from_numpy(np.ascontiguousarray(w)).reshape(slot.rows, slot.cols).to(blob.device)
