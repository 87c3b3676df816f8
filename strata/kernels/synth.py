"""Random expert sets for tests and benchmarks: real blobs in a real arena.

Legend: E experts, D hidden, F expert width. Weights are drawn N(0, 1/sqrt(fan_in)) so the
feed-forward's activations stay O(1) at any width, then stored in each matrix's format.
"""
from __future__ import annotations

import torch

from strata.blob import BlobLayout
from strata.errors import StrataError
from strata.experts import ExpertSet

_PLAIN = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}


def encode_matrix(w: torch.Tensor, fmt) -> torch.Tensor:
    """fp32 [rows, cols] -> the format's bytes (uint8, row-major by output feature)."""
    if fmt.name in _PLAIN:
        return w.to(_PLAIN[fmt.name]).contiguous().view(torch.uint8).reshape(-1)
    try:
        from strata.formats import quantize
    except ImportError:
        raise StrataError(f"format {fmt.name} needs strata.formats.quantize, which this build "
                          f"lacks") from None
    return quantize(w.float().cpu(), fmt).reshape(-1)


def random_expert_set(n_expert: int, d_model: int, d_expert: int, gate="BF16", up=None,
                      down=None, *, device="cpu", seed: int = 0, absent=(),
                      shuffle: bool = True) -> ExpertSet:
    """E experts with random weights in the given formats. Experts in `absent` get
    slot_offset -1 (and no bytes); with `shuffle` blobs sit in the arena in a permuted order, so
    a kernel that ignores the slot table reads the wrong expert."""
    lay = BlobLayout.make(d_model, d_expert, gate, up, down)
    gen = torch.Generator().manual_seed(seed)
    present = [e for e in range(n_expert) if e not in set(absent)]
    order = (torch.randperm(len(present), generator=gen).tolist() if shuffle
             else list(range(len(present))))
    arena = torch.zeros(max(1, len(present)) * lay.size, dtype=torch.uint8)
    slot = torch.full((n_expert,), -1, dtype=torch.int64)
    for pos, e in zip(order, present):
        slot[e] = pos * lay.size
        for mat in lay.matrices:
            w = torch.randn(mat.rows, mat.cols, generator=gen) / mat.cols ** 0.5
            raw = encode_matrix(w, mat.fmt)
            assert raw.numel() == mat.nbytes, (mat, raw.numel())
            start = pos * lay.size + mat.offset
            arena[start:start + mat.nbytes] = raw.cpu()
    return ExpertSet(arena.to(device), slot.to(device), lay)
