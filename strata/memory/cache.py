"""The expert cache: one device buffer of whole cache slots, each holding one blob of its layer.

Layers may have different blob sizes (mixed quantization), so slots have per-layer sizes; slot
offsets are 256-byte aligned. `CacheLayout` is the arithmetic (what `strata plan` needs, no
memory); `ExpertCache` allocates the buffer (a CPU tensor without a GPU) and fills it.

Filling copies every slot on one side stream, non-blocking, and synchronizes once at the end:
from pinned host blobs the copies run back to back at the PCIe rate (one blocking copy per slot
would pay a host round trip each). A loan's refill goes through the same `fill`.

Fill order is round-robin over layers (expert 0 of every layer, then expert 1, ...), so every
layer keeps a similar share of resident experts and the TOP slots (the ones a loan borrows) mix
all layers. Filling stops at the first slot that does not fit.
"""
from __future__ import annotations

import bisect
from contextlib import nullcontext as _nullcontext
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from strata.errors import StrataError
from strata.experts import ExpertSet
from strata.memory.carve import align_up
from strata.units import fmt_bytes

# A source gives the blob of (layer, expert) as a uint8 tensor of that layer's blob size:
# a callable, or a mapping (e.g. a dict of host tensors).
Source = Callable[[int, int], torch.Tensor] | Mapping


def _get(source: Source, layer: int, expert: int) -> torch.Tensor:
    blob = source(layer, expert) if callable(source) else source[(layer, expert)]
    if not isinstance(blob, torch.Tensor) or blob.dtype != torch.uint8:
        raise StrataError(f"expert source gave {type(blob).__name__} for layer {layer} expert "
                          f"{expert}; it must give a uint8 tensor")
    return blob.reshape(-1)


@dataclass(frozen=True)
class CacheLayout:
    """Slots of a cache: who sits where. Slot i holds (layer, expert) slot_owner[i]."""
    slot_owner: tuple[tuple[int, int], ...]
    slot_offset: tuple[int, ...]
    slot_bytes: tuple[int, ...]
    nbytes: int
    spare: int = 0   # bytes above the last slot when every expert fits (lent before any slot)

    @classmethod
    def build(cls, capacity: int, layer_blob: Mapping[int, int] | Sequence[int],
              n_expert: int) -> "CacheLayout":
        """Fill `capacity` bytes round-robin with the experts of the layers in `layer_blob`.

        `layer_blob` maps layer -> blob bytes (a sequence means layers 0..n-1).
        """
        if not isinstance(layer_blob, Mapping):
            layer_blob = dict(enumerate(layer_blob))
        if capacity < 0:
            raise StrataError(f"cache capacity must be >= 0 bytes, got {capacity:,}")
        layers = sorted(layer_blob)
        owner, offset, size = [], [], []
        used = 0
        for e in range(n_expert):
            for layer in layers:
                b = int(layer_blob[layer])
                if b <= 0:
                    raise StrataError(f"layer {layer} has a blob of {b} bytes")
                if align_up(used + b) > capacity:  # a slot and its padding fit
                    return cls(tuple(owner), tuple(offset), tuple(size), used)
                owner.append((layer, e))
                offset.append(used)
                size.append(b)
                used = align_up(used + b)
        # Every expert fits: the rest of the budget stays in the cache as a spare region above
        # the slots, which a loan takes first — a prompt on a card that holds the whole model
        # evicts nothing and streams nothing.
        spare = max(0, capacity - used) // 256 * 256
        return cls(tuple(owner), tuple(offset), tuple(size), used + spare, spare)

    @property
    def n_slots(self) -> int:
        return len(self.slot_owner)

    def top_bytes(self, n: int) -> int:
        """Bytes of the top n slots and the spare region above them (from slot N-n's start to
        the buffer's end); n = 0: the spare region alone."""
        if n <= 0:
            return self.spare
        return self.nbytes - self.slot_offset[self.n_slots - n]

    def lendable(self, lend_cap: float) -> int:
        """Most top slots a loan may take: their bytes stay within lend_cap of the cache."""
        if not 0.0 <= lend_cap <= 1.0:
            raise StrataError(f"lend cap must be within [0, 1], got {lend_cap}")
        cap = int(lend_cap * self.nbytes)
        # top_bytes(n) grows with n; starts (nbytes - offset) fall as the slot index rises.
        starts = [self.nbytes - o for o in reversed(self.slot_offset)]  # top_bytes(1..N)
        return bisect.bisect_right(starts, cap)

    def room(self, lend_cap: float) -> int:
        """Bytes a prompt may borrow: the spare region and the whole slots of the largest allowed
        loan (a spare region alone is lent up to the cap)."""
        return self.loan_span(self.lendable(lend_cap), lend_cap)[1]

    def loan_span(self, n: int, lend_cap: float) -> tuple[int, int]:
        """(offset, nbytes) of the loan of the top n slots: from slot N-n's start to the buffer's
        end; n = 0: the top of the spare region, at most the cap (256-aligned; empty without a
        spare region). The one count the planner reports and the Loan takes."""
        if n > 0:
            off = self.slot_offset[self.n_slots - n]
            return off, self.nbytes - off
        spare = min(self.spare, int(lend_cap * self.nbytes)) // 256 * 256
        return self.nbytes - spare, spare

    def slots_for(self, need: int, lend_cap: float) -> int:
        """Fewest top slots whose bytes cover `need`; a PlanError if the cap does not allow it."""
        n_max = self.lendable(lend_cap)
        starts = [self.nbytes - o for o in reversed(self.slot_offset)]
        n = bisect.bisect_left(starts, need) + 1 if need > self.spare else 0
        if n > n_max or need > self.room(lend_cap):
            from strata.errors import PlanError
            raise PlanError(f"needs {need:,} B ({fmt_bytes(need)}) but the loan's room is "
                            f"{self.room(lend_cap):,} B ({fmt_bytes(self.room(lend_cap))}, "
                            f"{n_max} slots at lend cap {lend_cap})")
        return n


class ExpertCache:
    """The cache's device buffer (uint8 [nbytes]) and which expert each slot holds."""

    def __init__(self, layout: CacheLayout, source: Source, device=None, *, fill: bool = True,
                 progress: bool = False):
        self.layout = layout
        self.source = source
        self.device = torch.device(device) if device is not None else torch.device(
            "cuda" if torch.cuda.is_available() else "cpu")
        self.buffer = torch.zeros(layout.nbytes, dtype=torch.uint8, device=self.device)
        self.owner: list[tuple[int, int] | None] = [None] * layout.n_slots
        self.index: dict[tuple[int, int], int] = {}
        # land(view, layer) after each slot's copy, on the copy's stream (strata.planes.Landing:
        # the plane expert FFN's relayout); None: blobs stay as the source gives them
        self.land = None
        if fill:
            self.fill(progress=progress)

    def slot_view(self, i: int) -> torch.Tensor:
        o = self.layout.slot_offset[i]
        return self.buffer[o:o + self.layout.slot_bytes[i]]

    def _load(self, i: int, non_blocking: bool) -> None:
        layer, expert = self.layout.slot_owner[i]
        blob = _get(self.source, layer, expert)
        if blob.numel() != self.layout.slot_bytes[i]:
            raise StrataError(f"expert source gave {blob.numel():,} B for layer {layer} expert "
                              f"{expert}; its slot holds {self.layout.slot_bytes[i]:,} B")
        self.slot_view(i).copy_(blob, non_blocking=non_blocking)
        if self.land is not None:
            self.land(self.slot_view(i), layer)
        self.owner[i] = (layer, expert)
        self.index[(layer, expert)] = i

    def fill_slot(self, i: int) -> None:
        """(Re)load slot i's own expert from the source (a blocking copy)."""
        self._load(i, non_blocking=False)

    def evict_slot(self, i: int) -> None:
        if self.owner[i] is not None:
            del self.index[self.owner[i]]
            self.owner[i] = None

    def fill(self, slots=None, *, progress: bool = False) -> None:
        """(Re)load `slots` (default: every slot): on CUDA all copies are queued on one side
        stream (non-blocking; pinned blobs copy asynchronously at the PCIe rate) and the host
        waits once, at the end. `progress`: a tqdm bar in bytes."""
        slots = range(self.layout.n_slots) if slots is None else list(slots)
        bar = None
        if progress and len(slots):
            from tqdm import tqdm
            bar = tqdm(total=sum(self.layout.slot_bytes[i] for i in slots), unit="B",
                       unit_scale=True, desc="filling cache", leave=False)
        cuda = self.device.type == "cuda"
        stream = torch.cuda.Stream(self.device) if cuda else None
        if cuda:   # the buffer's zeroing ran on the current stream: copy after it
            stream.wait_stream(torch.cuda.current_stream(self.device))
        try:
            with torch.cuda.stream(stream) if cuda else _nullcontext():
                for i in slots:
                    self._load(i, non_blocking=cuda)
                    if bar is not None:
                        bar.update(self.layout.slot_bytes[i])
        finally:
            if cuda:
                stream.synchronize()   # the one wait: every queued copy has landed
                torch.cuda.current_stream(self.device).wait_stream(stream)
            if bar is not None:
                bar.close()

    def expert_set(self, layer: int, blob_layout, n_expert: int) -> ExpertSet:
        """How a kernel finds this layer's resident experts (-1 = not in the cache)."""
        offs = torch.full((n_expert,), -1, dtype=torch.int64)
        for (lay, e), i in self.index.items():
            if lay == layer:
                offs[e] = self.layout.slot_offset[i]
        return ExpertSet(self.buffer, offs.to(self.device), blob_layout)


def synthetic_source(layer_blob: Mapping[int, int] | Sequence[int], seed: int = 0,
                     device="cpu") -> Source:
    """Deterministic random blobs per (layer, expert): for tests and demos, no pack needed."""
    if not isinstance(layer_blob, Mapping):
        layer_blob = dict(enumerate(layer_blob))

    def source(layer: int, expert: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed * 1_000_003 + layer * 65_537 + expert)
        return torch.randint(0, 256, (int(layer_blob[layer]),), generator=g,
                             dtype=torch.uint8).to(device)
    return source
