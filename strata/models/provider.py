"""Expert providers: how a model obtains the experts of (layer, chunk).

The model never owns expert weights. `Model.prefill` calls, in this order:

    provider.begin_prompt(n_tokens, chunk)         # the whole prompt's size and the chunk size
    try:
        for each chunk:
            provider.begin_chunk(start, n_tokens)  # chunk of n_tokens at absolute position `start`
            for layer in range(L):
                provider.begin_layer(layer)        # before attention: time to start prefetching
                es = provider.experts(layer, topk_ids)  # after routing; topk_ids int64 [T, K], device
                ... expert FFN reads es (arena + slot table) ...
                provider.end_layer(layer)          # the FFN is done with es: its slots may be reused
            provider.end_chunk()
    finally:
        provider.end_prompt(ok)                    # ok=False when anything raised: give back the
                                                   # loan, refill the cache, stay usable

`experts()` must return an ExpertSet in which every expert named in `topk_ids` has a slot
(slot_offset >= 0), laid out with the layer's BlobLayout; experts not named may be absent (-1).
A provider whose ring cannot hold a whole layer instead offers
`expert_batches(layer, topk_ids) -> iterator of (ExpertSet, topk_ids_of_batch)`: the model runs
the expert FFN once per batch (ids outside the batch read -1, skipped) and sums the outputs in
fp32; the provider may reuse a batch's slots once the next batch is asked for.
The streaming engine implements this over cache slots + ring slots; `ResidentProvider` keeps every
expert of every layer in one device arena.
"""
from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import torch

from strata.blob import BlobLayout
from strata.errors import StrataError
from strata.experts import ExpertSet


@runtime_checkable
class ExpertProvider(Protocol):
    n_layer: int

    def begin_prompt(self, n_tokens: int, chunk: int) -> None: ...

    def end_prompt(self, ok: bool) -> None: ...

    def begin_chunk(self, start: int, n_tokens: int) -> None: ...

    def begin_layer(self, layer: int) -> None: ...

    def experts(self, layer: int, topk_ids: torch.Tensor) -> ExpertSet: ...

    def end_layer(self, layer: int) -> None: ...

    def end_chunk(self) -> None: ...

    def stats(self) -> dict: ...  # what the prompt reports (bytes streamed, cache hits, waits, ...)


class ResidentProvider:
    """Every expert resident: layer l's blobs are `arena[base_l + e * size_l]` for e < E.

    Built from one uint8 tensor per layer ([E * blob_size] or [E, blob_size] bytes, blob e at
    e * blob_size) - the pack's per-layer expert tensors. All layers are copied into ONE arena on
    `device` (each layer's region 256-aligned); one ExpertSet per layer views it.
    """

    def __init__(self, layer_blobs: Sequence[torch.Tensor], layouts: Sequence[BlobLayout],
                 device: torch.device | str = "cpu"):
        if len(layer_blobs) != len(layouts):
            raise StrataError(f"{len(layer_blobs)} expert tensors for {len(layouts)} layouts")
        device = torch.device(device)
        bases, total = [], 0
        for l, (blobs, lay) in enumerate(zip(layer_blobs, layouts)):
            n = blobs.numel()
            if blobs.dtype != torch.uint8 or n % lay.size:
                raise StrataError(f"layer {l}: expert tensor must be uint8 whole blobs of "
                                  f"{lay.size} B, got {blobs.dtype} of {n} elements")
            bases.append(total)
            total += (n + 255) // 256 * 256
        self.arena = torch.zeros(total, dtype=torch.uint8, device=device)
        self.sets: list[ExpertSet] = []
        for blobs, lay, base in zip(layer_blobs, layouts, bases):
            n = blobs.numel()
            self.arena[base:base + n].copy_(blobs.reshape(-1))
            n_exp = n // lay.size
            offs = base + torch.arange(n_exp, dtype=torch.int64, device=device) * lay.size
            self.sets.append(ExpertSet(self.arena, offs, lay))
        self.n_layer = len(self.sets)

    @property
    def nbytes(self) -> int:
        return self.arena.numel()

    def begin_prompt(self, n_tokens: int, chunk: int) -> None:
        pass

    def end_prompt(self, ok: bool) -> None:
        pass

    def begin_chunk(self, start: int, n_tokens: int) -> None:
        pass

    def begin_layer(self, layer: int) -> None:
        pass

    def experts(self, layer: int, topk_ids: torch.Tensor) -> ExpertSet:
        return self.sets[layer]

    def end_layer(self, layer: int) -> None:
        pass

    def end_chunk(self) -> None:
        pass

    def stats(self) -> dict:
        return {"resident_expert_bytes": self.nbytes}
