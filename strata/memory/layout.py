"""The prompt path's buffers for a chunk of T tokens, described once as data.

The carve EXECUTES this description (`PromptLayout.carve`) and `bytes_needed(T, ring)` READS it by
running the same code on a dry carve: one source, never a second hand-kept count (a count kept
beside the carve drifts from it: an earlier one was T*(D-HC)*4 bytes off).

Order in the loan (each buffer 256-byte aligned):

    ring       uint8 [ring, align256(max_blob)]  streamed expert slots
    persistent buffers (live through every layer of the chunk)
    union of phases (attention, then feed-forward: never alive together, so they share bytes)

The buffers (a LayoutSpec) and the values of their symbolic dims (`Sizes.dims`) come from
outside: the model and its kernels describe them (strata.planning), this module only lays them
out. bytes_needed is ring*stride + sum(T * c_i) + max over phases of sum(T * c_j) + constant
padding (+ alignment rounding): monotone in T whenever every dim is non-decreasing in T.

A launch choice that only sizes one phase's buffers (MLA's attention block) can grow for free
where another phase is the larger: `Sizes.wider` offers the dims of the next larger choice, and
the carve takes the widest whose bytes are no more than the first's, on the dry carve the plan
reads too. The chosen dims travel with the buffers (`PromptBuffers.dims`) to the kernels.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import torch

from strata.errors import StrataError
from strata.memory.carve import Carve, Placement, align_up
from strata.memory.sizes import Sizes


@dataclass(frozen=True)
class Buf:
    """One buffer: a name the engine looks it up by, a dtype, and symbolic dims (their values
    come from Sizes.dims)."""
    name: str
    dtype: torch.dtype
    dims: tuple[str, ...]
    doc: str = ""


@dataclass(frozen=True)
class Phase:
    name: str
    bufs: tuple[Buf, ...]


@dataclass(frozen=True)
class LayoutSpec:
    persistent: tuple[Buf, ...]
    phases: tuple[Phase, ...]

    def names(self) -> list[str]:
        return [b.name for b in self.persistent] + [b.name for p in self.phases for b in p.bufs]

    def with_buffer(self, buf: Buf, phase: str | None = None) -> "LayoutSpec":
        """This spec plus `buf` (persistent, or appended to the named phase)."""
        if buf.name in self.names() or buf.name == "ring":
            raise StrataError(f"layout already has a buffer named {buf.name!r}")
        if phase is None:
            return replace(self, persistent=self.persistent + (buf,))
        if phase not in [p.name for p in self.phases]:
            return replace(self, phases=self.phases + (Phase(phase, (buf,)),))
        return replace(self, phases=tuple(replace(p, bufs=p.bufs + (buf,)) if p.name == phase
                                          else p for p in self.phases))


def pass_experts(ring: int, batch: int | None = None) -> int:
    """G: the most experts one pass of the expert FFN reads (the streaming provider's batch:
    `batch`, default half the ring, so the next batch's copies land while this one computes)."""
    return max(1, min(batch or max(1, ring // 2), max(ring, 1)))


@dataclass
class PromptBuffers:
    """What a carve of the layout hands the engine: ring slots and activation views by name."""
    ring: torch.Tensor | None           # uint8 [ring, stride]; slot i is ring[i]
    bufs: dict[str, torch.Tensor | None]
    placements: list[Placement] = field(default_factory=list)
    stop: int = 0
    dims: dict[str, int] = field(default_factory=dict)   # the symbols' values it was carved at
    grown: dict[str, int] = field(default_factory=dict)  # those Sizes.wider grew (widest)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.bufs[name]


@dataclass(frozen=True)
class PromptLayout:
    """The prompt path's layout: the buffers of `spec`, sized by `sizes`, and ring slots of
    `max_blob` bytes (build one with strata.planning.prompt_layout)."""
    sizes: Sizes
    max_blob: int
    spec: LayoutSpec
    batch: int | None = None      # experts per streamed pass (None: ring // 2; see pass_experts)

    @property
    def slot_stride(self) -> int:
        """Bytes between ring slots: max_blob rounded up to the carve's alignment."""
        return align_up(self.max_blob)

    def carve(self, carve: Carve, T: int, ring: int, batch: int | None = None) -> PromptBuffers:
        """Lay the buffers for T tokens and `ring` slots out on `carve` (the one executor);
        `batch`: experts per pass (None: the layout's own, see pass_experts)."""
        if T < 1 or ring < 0:
            raise StrataError(f"a chunk needs T >= 1 tokens and ring >= 0 slots, got T={T}, "
                              f"ring={ring}")
        first = self.sizes.dims(T, ring, self.batch if batch is None else batch)
        dims = self.widest(first)
        ring_view, bufs = self._lay(carve, dims, ring)
        return PromptBuffers(ring_view, bufs, list(carve.placements), carve.stop, dict(dims),
                             {k: v for k, v in dims.items() if first.get(k) != v})

    def _lay(self, carve: Carve, dims: Mapping[str, int], ring: int):
        ring_view = carve.take("ring", torch.uint8, (ring, self.slot_stride))
        bufs: dict[str, torch.Tensor | None] = {}

        def take(b: Buf):
            bufs[b.name] = carve.take(b.name, b.dtype, tuple(dims[d] for d in b.dims))

        for b in self.spec.persistent:
            take(b)
        with carve.union() as u:
            for ph in self.spec.phases:
                with u.phase():
                    for b in ph.bufs:
                        take(b)
        return ring_view, bufs

    def _stop(self, dims: Mapping[str, int]) -> int:
        """The buffers' bytes at these dims, ring aside (it comes first: it shifts, never
        resizes, what follows)."""
        c = Carve.dry()
        self._lay(c, dims, 0)
        return c.stop

    def widest(self, dims: Mapping[str, int]) -> Mapping[str, int]:
        """The widest of dims, sizes.wider(dims), its wider, ... whose buffers take no more
        bytes than dims' own (a free launch choice: the phase it sizes stays under the
        largest)."""
        base, best = None, dims
        while (w := self.sizes.wider(best)) is not None:
            base = self._stop(dims) if base is None else base
            if self._stop(w) > base:
                break
            best = w
        return best

    def placements(self, T: int, ring: int) -> list[Placement]:
        c = Carve.dry()
        self.carve(c, T, ring)
        return c.placements

    def bytes_needed(self, T: int, ring: int, batch: int | None = None) -> int:
        """Bytes of the loan a chunk of T tokens with `ring` slots (passes of `batch` experts)
        uses: the dry carve's stop."""
        c = Carve.dry()
        self.carve(c, T, ring, batch)
        return c.stop

    def ring_bytes(self, ring: int) -> int:
        """Bytes of the ring region, read from the same layout."""
        return next(p.nbytes for p in self.placements(1, ring) if p.name == "ring")
