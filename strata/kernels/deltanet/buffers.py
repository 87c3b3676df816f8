"""What the delta rule's two Triton launchers (strata.kernels.deltanet.chunk and .fla_rule)
share: their inputs' checks and dims, and their scratch buffers as tensors (a sizes.Buffer viewed
in the bytes a caller hands in, the prompt layout's dn_* carve views, or allocated when none is
given), so what they compute in is what sizes.chunk_buffers counts.
"""
from __future__ import annotations

import torch

from strata.errors import StrataError
from strata.kernels.deltanet.naive import check_inputs

MAX_HEAD_DIM = 256   # one program holds a chunk's dk row and a [dk, BV] block of the state


def launch_dims(q, k, v, g, beta, initial_state, out_state, chunk_size: int, what: str):
    """(T, Hk, dk, Hv, dv) of a launcher's inputs, checked (naive.check_inputs, and head dims
    up to MAX_HEAD_DIM), one line naming `what` when they are wrong."""
    check_inputs(q, k, v, g, beta, initial_state, out_state, chunk_size, what)
    T, Hk, dk = q.shape
    Hv, dv = v.shape[1:]
    if max(dk, dv) > MAX_HEAD_DIM:
        raise StrataError(f"{what} holds head dims up to {MAX_HEAD_DIM}, got dk {dk} dv {dv}; "
                          f"use chunk_gated_delta_rule_torch")
    return T, Hk, dk, Hv, dv


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
