"""Where a delta-rule part writes its output: the buffer the caller hands in (the engine's carve
view, strata.models.qwen3_next.delta_rows) when it is exactly that output's tensor, else a new
one. One check for the conv, the rule and the gated norm."""
from __future__ import annotations

import torch

from strata.errors import StrataError


def output_buffer(out, shape, dtype: torch.dtype, device, what: str) -> torch.Tensor:
    """`out` where given (contiguous, `shape`, `dtype`, on `device`; one line naming `what`
    otherwise), else a new tensor of that shape and dtype."""
    if out is None:
        return torch.empty(shape, dtype=dtype, device=device)
    if (not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(shape)
            or out.dtype != dtype or out.device != device or not out.is_contiguous()):
        raise StrataError(f"{what}: out must be a contiguous {list(shape)} {dtype} tensor on "
                          f"{device}, got {getattr(out, 'dtype', type(out).__name__)} "
                          f"{list(getattr(out, 'shape', []))}")
    return out
