"""Expert providers: how a model obtains the experts of (layer, chunk), pass by pass.

The model never owns expert weights. `Model.prefill` calls, in this order:

    provider.begin_prompt(n_tokens, chunk)         # the whole prompt's size and the chunk size
    try:
        for each chunk:
            provider.begin_chunk(start, n_tokens)  # chunk of n_tokens at absolute position `start`
            for layer in range(L):
                provider.begin_layer(layer)        # before attention: time to start prefetching
                ws = provider.workspace(layer)     # after routing: what the layer's FFN borrows
                for p in provider.passes(layer, topk_ids):   # topk_ids int64 [T, K], device
                    ... expert FFN over p.experts for p.topk_ids, buffers from ws ...
                provider.end_layer(layer)          # the FFN is done: its slots may be reused
            provider.end_chunk()
    finally:
        provider.end_prompt(ok)                    # ok=False when anything raised: give back the
                                                   # loan, refill the cache, stay usable

`passes(layer, topk_ids)` yields `Pass`es: an ExpertSet laid out with the layer's BlobLayout and
the ids it serves (ids of experts outside the pass read -1 and are skipped). Every expert named in
`topk_ids` is served by exactly one pass and has a slot there (slot_offset >= 0); a provider may
reuse a pass's slots once the next pass is asked for. A provider whose arena holds the whole layer
yields one pass; the streaming engine, whose ring cannot, yields several.

`workspace(layer)` declares what the layer's expert FFN borrows instead of allocating
(`LayerWorkspace`): whether the passes add into an fp32 accumulator (and which one), the expert
GEMM's buffers, and the stream-k fixup scratch. `ResidentProvider` keeps every expert of every
layer in one device arena; `strata.engine.provider` streams them through cache and ring slots.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol, Sequence, runtime_checkable

import torch

from strata.blob import BlobLayout
from strata.errors import StrataError
from strata.experts import ExpertSet


@dataclass(frozen=True)
class Pass:
    """One expert FFN launch over some of a layer's experts."""
    experts: ExpertSet          # slot table [E]: this pass's experts >= 0, the others -1
    topk_ids: torch.Tensor      # int64 [T, K]: the routed ids, -1 where outside this pass
    last: bool = True           # the layer's last pass (a vouched workspace sums the rows then)


@dataclass(frozen=True)
class LayerWorkspace:
    """What a layer's expert FFN borrows from the provider (declared per layer).

    accumulate: True — every pass adds into an fp32 y [T, D], rounded once to the activations'
    dtype (several passes must sum before rounding); False — the provider yields exactly one pass
    and the FFN's output is used as it comes (in the FFN's own contract, e.g. bf16 y).
    """
    accumulate: bool = True
    accumulator: torch.Tensor | None = None          # fp32 [>= T, D]; None: allocate per layer
    buffers: Mapping[str, torch.Tensor] = field(default_factory=dict)  # the expert GEMM's
    #   workspace: "h" (bf16 [Mpad, F]), "yk" (fp32 [T*K, D]), "wdec" (the decoded FFN's experts)
    scratch_alloc: Callable[[int], torch.Tensor] | None = None   # stream-k fixup scratch
    # a leading dense layer's FFN: its gate and up products (the carve's dense_gu, flat, bf16
    # >= 2·T·d_ff values; strata.models.ffn.DenseFFN); None: it allocates them
    dense: torch.Tensor | None = None
    # the layer's normed input, attention's and then the FFN's (the carve's xn, flat, >= T·D
    # values; strata.models.layers.norm_out); None: the norms allocate theirs
    xn: torch.Tensor | None = None
    # vouched: the provider built every slot table on the host and checked it there — routed
    # ids in [0, E), each routed expert resident, 256-byte aligned and in exactly one pass,
    # `Pass.last` set on the layer's last pass. The FFN then runs without a host sync (check=False)
    # and, given a "yk" buffer, the passes leave their rows there for one sum per layer.
    vouched: bool = False

    def ffn_kwargs(self) -> dict:
        """The keyword arguments of the expert FFN (strata.models.moe) that this declares."""
        kw = {}
        if self.scratch_alloc is not None:
            kw["scratch_alloc"] = self.scratch_alloc
        if self.buffers:
            kw["workspace"] = dict(self.buffers)
        if self.vouched:
            kw["check"] = False
        return kw

    def spare(self) -> torch.Tensor | None:
        """Bytes of the expert FFN's workspace that are free once the layer's passes have run
        (its "h", flat): what the layer computes after them (a shared expert's gate and up
        products, strata.models.ffn.DenseFFN's buf) takes them rather than new tensors; None
        where there is none. The passes' fp32 output (the accumulator) is not among them."""
        h = self.buffers.get("h")
        return None if h is None or not h.is_contiguous() else h.view(-1)

    def combine(self, p: "Pass") -> str:
        """How pass `p`'s rows become y (the expert FFN's `combine`): a vouched workspace with a
        "yk" buffer defers every pass but the last, which sums the layer's rows once; a vouched
        single pass sums all its rows (there are no -1 ids); otherwise each pass on its own."""
        if not self.vouched:
            return "pass"
        if self.buffers.get("yk") is not None:
            return "layer" if p.last else "defer"
        return "layer" if p.last and not self.accumulate else "pass"

    def output(self, like: torch.Tensor) -> torch.Tensor:
        """The zeroed fp32 y [T, D] the passes add into (`like`: the FFN input [T, D])."""
        if self.accumulator is not None:
            return self.accumulator[:like.shape[0]].zero_()
        return torch.zeros(like.shape, dtype=torch.float32, device=like.device)


@runtime_checkable
class ExpertProvider(Protocol):
    n_layer: int

    def begin_prompt(self, n_tokens: int, chunk: int) -> None: ...

    def end_prompt(self, ok: bool) -> None: ...

    def begin_chunk(self, start: int, n_tokens: int) -> None: ...

    def begin_layer(self, layer: int) -> None: ...

    def workspace(self, layer: int) -> LayerWorkspace: ...

    def passes(self, layer: int, topk_ids: torch.Tensor) -> Iterator[Pass]: ...

    def end_layer(self, layer: int) -> None: ...

    def end_chunk(self) -> None: ...

    def stats(self) -> dict: ...  # what the prompt reports (bytes streamed, cache hits, waits, ...)


class ResidentProvider:
    """Every expert resident: layer l's blobs are `arena[base_l + e * size_l]` for e < E.

    Built from one uint8 tensor per layer ([E * blob_size] or [E, blob_size] bytes, blob e at
    e * blob_size) - the pack's per-layer expert tensors. All layers are copied into ONE arena on
    `device` (each layer's region 256-aligned); one ExpertSet per layer views it. Each layer is one
    pass over all its experts.
    """

    def __init__(self, layer_blobs: Sequence[torch.Tensor], layouts: Sequence[BlobLayout],
                 device: torch.device | str = "cpu"):
        if len(layer_blobs) != len(layouts):
            raise StrataError(f"{len(layer_blobs)} expert tensors for {len(layouts)} layouts")
        device = torch.device(device)
        bases, total = [], 0
        for l, (blobs, lay) in enumerate(zip(layer_blobs, layouts)):
            n = blobs.numel()
            if lay is None:   # a layer without routed experts: nothing to hold
                bases.append(total)
                continue
            if blobs.dtype != torch.uint8 or n % lay.size:
                raise StrataError(f"layer {l}: expert tensor must be uint8 whole blobs of "
                                  f"{lay.size} B, got {blobs.dtype} of {n} elements")
            bases.append(total)
            total += (n + 255) // 256 * 256
        self.arena = torch.zeros(total, dtype=torch.uint8, device=device)
        self.sets: list[ExpertSet | None] = []
        for blobs, lay, base in zip(layer_blobs, layouts, bases):
            if lay is None:
                self.sets.append(None)
                continue
            n = blobs.numel()
            self.arena[base:base + n].copy_(blobs.reshape(-1))
            n_exp = n // lay.size
            offs = base + torch.arange(n_exp, dtype=torch.int64, device=device) * lay.size
            self.sets.append(ExpertSet(self.arena, offs, lay))
        self.n_layer = len(self.sets)
        # every expert of every layer is in its table; BlobLayout sizes are 256-byte multiples,
        # so each blob starts aligned (a hand-made layout that is not keeps the FFN's checks)
        self.vouched = all(lay.size % 256 == 0 for lay in layouts if lay is not None)

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

    def workspace(self, layer: int) -> LayerWorkspace:
        # one pass: nothing to sum; its table is ours (every expert; aligned: see __init__)
        return LayerWorkspace(accumulate=False, vouched=self.vouched)

    def passes(self, layer: int, topk_ids: torch.Tensor) -> Iterator[Pass]:
        yield Pass(self.sets[layer], topk_ids)

    def end_layer(self, layer: int) -> None:
        pass

    def end_chunk(self) -> None:
        pass

    def stats(self) -> dict:
        return {"resident_expert_bytes": self.nbytes}


class OnDemandProvider:
    """One layer's experts at a time: layer l's blobs are read from the pack (a view of its map,
    or assembled on demand by a GGUF reader) when the layer begins, moved to `device`, and dropped
    when it ends — a whole model's experts need not fit anywhere at once (a reference trace of a
    full-size model on the CPU). Each layer is one pass over all its experts."""

    def __init__(self, pack, device: torch.device | str = "cpu"):
        self.pack, self.device = pack, torch.device(device)
        self.n_layer = pack.shape.n_layer
        self._layer: tuple[int, ExpertSet] | None = None
        self.bytes_read = 0

    def begin_prompt(self, n_tokens: int, chunk: int) -> None:
        pass

    def end_prompt(self, ok: bool) -> None:
        self._layer = None

    def begin_chunk(self, start: int, n_tokens: int) -> None:
        pass

    def begin_layer(self, layer: int) -> None:
        lay = self.pack.layers[layer].layout
        if lay is None:   # a dense layer: no experts to read
            return
        blobs = self.pack.experts(layer).reshape(-1).to(self.device)
        offs = torch.arange(blobs.numel() // lay.size, dtype=torch.int64,
                            device=self.device) * lay.size
        self._layer = (layer, ExpertSet(blobs, offs, lay))
        self.bytes_read += blobs.numel()

    def workspace(self, layer: int) -> LayerWorkspace:
        return LayerWorkspace(accumulate=False)   # one pass: nothing to sum

    def passes(self, layer: int, topk_ids: torch.Tensor) -> Iterator[Pass]:
        if self._layer is None or self._layer[0] != layer:
            raise StrataError(f"layer {layer}'s experts were asked for outside begin_layer / "
                              f"end_layer")
        yield Pass(self._layer[1], topk_ids)

    def end_layer(self, layer: int) -> None:
        self._layer = None

    def end_chunk(self) -> None:
        pass

    def stats(self) -> dict:
        return {"expert_bytes_read": self.bytes_read}
