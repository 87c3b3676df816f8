"""The delta rule's scratch buffers as tensors: a sizes.Buffer viewed in the bytes a caller
hands in (the prompt layout's dn_* carve views), or allocated when none is given. Both
launchers (strata.kernels.deltanet.chunk and .fla_rule) take their buffers here, so what they
compute in is what sizes.chunk_buffers counts.
"""
from __future__ import annotations

import torch

from strata.errors import StrataError


def take_buffer(scratch, b, device, what: str = "chunk_gated_delta_rule"):
    """Buffer `b` (sizes.Buffer) from `scratch`: the first b.nbytes bytes of the tensor given
    under its name (any contiguous tensor on `device` that holds them, as the carve's uint8
    views do) in b's dtype and shape, else a fresh tensor."""
    t = None if scratch is None else scratch.get(b.name)
    if t is None:
        return torch.empty(b.shape, dtype=b.torch_dtype, device=device)
    if (not isinstance(t, torch.Tensor) or t.device != device or not t.is_contiguous()
            or t.numel() * t.element_size() < b.nbytes):
        raise StrataError(f"{what}: scratch {b.name!r} must be a contiguous tensor of at least "
                          f"{b.nbytes} bytes on {device}, got "
                          f"{getattr(t, 'dtype', type(t).__name__)} "
                          f"{list(getattr(t, 'shape', []))}")
    return t.reshape(-1).view(torch.uint8)[:b.nbytes].view(b.torch_dtype).view(b.shape)
