"""Shared pieces of the scratch-slab tests (tests/engine/test_slab*.py).

- `tiny_engine`: a CPU PrefillEngine over a synthetic BF16 pack (tiny shapes; the Triton
  interpreter runs every launch), forced chunk and ring so the plan needs no scan.
- `BudgetAlloc`: ordinary device memory with a budget: a card the expert cache has filled. Past
  the budget it raises torch.cuda.OutOfMemoryError, as torch.empty does on a full GPU.
"""
from __future__ import annotations

import torch

from strata.engine.prefill import EngineConfig, PrefillEngine
from strata.packs.synth import ExpertFormats, synth_pack
from strata.shapes import ModelShape

SHAPE = ModelShape(n_layer=2, d_model=64, n_expert=32, top_k=2, d_expert=32, n_head=4,
                   n_kv_head=2, head_dim=16, vocab=64)
TOKENS = torch.tensor([5, 17, 63, 0, 3, 9, 42, 7, 7, 28, 61, 33])   # 12 tokens: chunks 8 + 4
CHUNK = 8
STREAM_K = dict(schedule="stream_k", programs=3)   # pin_tile(**STREAM_K): every launch asks scratch


def make_pack(path):
    return synth_pack(path, SHAPE, ExpertFormats("BF16", "BF16", "BF16"), progress=False)


def tiny_engine(pack, n_parts: int = 1, kernel: bool = True, device: str = "cpu"
                ) -> PrefillEngine:
    cfg = EngineConfig(vram=[2 << 20] * n_parts, chunk=CHUNK, ring=2, reserve=0, max_prompt=64,
                       ffn="kernel" if kernel else "torch", device=device)
    return PrefillEngine(pack, cfg)


class BudgetAlloc:
    """torch.empty with `free` bytes left; then torch.cuda.OutOfMemoryError."""

    def __init__(self, free: int, device="cpu"):
        self.free, self.device, self.refused = free, torch.device(device), 0

    def __call__(self, nbytes: int) -> torch.Tensor:
        if nbytes > self.free:
            self.refused += 1
            raise torch.cuda.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {nbytes} bytes; {self.free} bytes free")
        self.free -= nbytes
        return torch.empty(nbytes, dtype=torch.uint8, device=self.device)
