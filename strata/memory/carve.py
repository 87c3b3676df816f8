"""Carve: a bump allocator over the loan that hands out typed tensor views.

Every buffer starts on a 256-byte boundary (relative to the loan, whose start is a cache slot
boundary, itself 256-aligned in a CUDA allocation). Buffers of phases that never live at the same
time (attention vs. feed-forward) may share bytes: `with carve.union() as u:` then
`with u.phase():` per phase; the union ends at the longest phase.

A carve without a buffer (`Carve.dry()`) runs the same code and only counts: that is how
`bytes_needed` reads the layout without a second hand-kept count. A carve with a buffer refuses
to run past its capacity with an AllocationError (a StrataError) naming the buffer, the bytes and
the room.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from strata.errors import AllocationError, StrataError
from strata.units import fmt_bytes

ALIGN = 256


def align_up(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


@dataclass(frozen=True)
class Placement:
    """Where one carved buffer sits: [offset, offset + nbytes) of the loan.

    `group` is () for buffers that live the whole chunk, or ((union, phase), ...) for buffers of
    one phase: two placements may overlap only when they sit in different phases of one union.
    """
    name: str
    offset: int
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    group: tuple[tuple[int, int], ...] = ()

    @property
    def end(self) -> int:
        return self.offset + self.nbytes


def may_alias(a: Placement, b: Placement) -> bool:
    """True when a and b are in different phases of the same union (so sharing bytes is fine)."""
    for (ua, pa), (ub, pb) in zip(a.group, b.group):
        if ua != ub:
            return False
        if pa != pb:
            return True
    return False


class Carve:
    """Bump allocator over `buffer` (uint8, 1-D) or, dry, over nothing (counting only)."""

    def __init__(self, buffer: torch.Tensor | None, capacity: int | None = None):
        if buffer is not None:
            if buffer.dtype != torch.uint8 or buffer.dim() != 1:
                raise StrataError(f"a carve needs a 1-D uint8 buffer, got {buffer.dtype} "
                                  f"{tuple(buffer.shape)}")
            capacity = buffer.numel() if capacity is None else min(capacity, buffer.numel())
        self.buffer = buffer
        self.capacity = capacity  # None: dry and unbounded
        self.used = 0
        self.placements: list[Placement] = []
        self._group: tuple[tuple[int, int], ...] = ()
        self._unions = 0

    @classmethod
    def dry(cls) -> "Carve":
        return cls(None, None)

    @property
    def is_dry(self) -> bool:
        return self.buffer is None

    def take(self, name: str, dtype: torch.dtype, shape) -> torch.Tensor | None:
        """A fresh [shape] dtype view at the next 256-byte boundary (None when dry)."""
        shape = tuple(int(s) for s in shape)
        if any(s < 0 for s in shape):
            raise StrataError(f"carve: buffer {name!r} has a negative dimension {shape}")
        numel = 1
        for s in shape:
            numel *= s
        nbytes = numel * dtype.itemsize
        offset = align_up(self.used)
        if self.capacity is not None and offset + nbytes > self.capacity:
            raise AllocationError(
                f"carve: buffer {name!r} {list(shape)} {str(dtype).removeprefix('torch.')} needs "
                f"{fmt_bytes(nbytes)} at offset {offset:,} but the loan holds "
                f"{self.capacity:,} bytes ({offset + nbytes - self.capacity:,} short); "
                f"borrow more slots or plan a smaller chunk")
        self.used = offset + nbytes
        self.placements.append(Placement(name, offset, nbytes, dtype, shape, self._group))
        if self.buffer is None:
            return None
        return self.buffer[offset:offset + nbytes].view(dtype).view(shape)

    @contextlib.contextmanager
    def union(self):
        """Phases inside share one region; the carve continues after the longest."""
        u = _Union(self, self._unions, align_up(self.used))
        self._unions += 1
        yield u
        if u.phases:
            self.used = u.end

    @property
    def stop(self) -> int:
        """Bytes from the loan's start to the end of the last buffer: what this layout uses."""
        return self.used

    def tail(self) -> "Tail":
        """What the carve left: its stop to the loan's end (empty when the layout used it all)."""
        if self.buffer is None:
            raise StrataError("a dry carve has no tail; carve a real loan")
        start = min(align_up(self.used), self.capacity)
        view = self.buffer[start:self.capacity]
        return Tail(view, self.buffer.data_ptr() + start)


class _Union:
    def __init__(self, carve: Carve, uid: int, start: int):
        self.carve, self.uid, self.start = carve, uid, start
        self.end = start
        self.phases = 0

    @contextlib.contextmanager
    def phase(self):
        c = self.carve
        outer = c._group
        c._group = outer + ((self.uid, self.phases),)
        c.used = self.start
        self.phases += 1
        try:
            yield
        finally:
            self.end = max(self.end, c.used)
            c._group = outer
            c.used = self.end


@dataclass(frozen=True)
class Tail:
    """The loan's unused top: a uint8 view and its device address (the pool's key)."""
    view: torch.Tensor
    address: int

    @property
    def nbytes(self) -> int:
        return int(self.view.numel())

    @property
    def empty(self) -> bool:
        return self.nbytes == 0
