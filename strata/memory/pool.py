"""SlabPool: the expert GEMM's stream-k fixup scratch, taken from the loan's tail.

Requests round up to a size class (a power of two, 128 KiB floor): the stream-k tile width
changes per launch, so caching exact sizes would keep one buffer per width (32 buffers, 31.5 MiB
measured on a 512-expert rig) where classes bound the pool to a few. At most one free buffer per
class is kept.

Guards (each load-bearing):
- `publish(tail)` keys the slab on the tail's ADDRESS: a chunk that moves the carve's stop moves
  the tail, and every buffer of the old tail is dropped.
- `drop()` at the end of a prompt, before the loan refills its slots (the tail is cache memory).
- An empty tail publishes nothing: scratch comes from ordinary device memory (`fallback`).

Ordinary-memory scratch of 4 MiB or more logs, on logger "strata":
    strata prefill mmq: CUDA<i> the scratch pool takes a new <N> MiB buffer

The pool is an allocator callable, `pool(nbytes) -> uint8 tensor`, the hook the expert GEMM's
stream-k schedule takes its scratch through (RingPolicy.slab, STRATA_MMQ_SLAB, wires it in; off,
the engine passes `ordinary_alloc` instead).

A pool without memory (`SlabPool.dry(nbytes)`) runs the same classes, free list and bump over a
tail on the meta device (views without storage, data_ptr = offset): its `used`, `high_water`
and `ordinary_bytes` are what a real tail of that size reaches for the same requests. That is
how the planner's slab reserve (strata.planning.slab_reserve) counts, as `Carve.dry()`
counts for `bytes_needed`: one count, never two.
"""
from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from strata.memory.carve import ALIGN, Tail, align_up
from strata.memory.ring import NO_POLICY, RingPolicy

log = logging.getLogger("strata")

CLASS_FLOOR = 128 << 10
LOG_MIN = 4 << 20
DRY_UNBOUNDED = 1 << 60        # a dry pool's tail without a size: room for any request


def size_class(nbytes: int) -> int:
    """The power-of-two class a request of `nbytes` is served from (at least 128 KiB)."""
    n = max(int(nbytes), CLASS_FLOOR)
    return 1 << (n - 1).bit_length()


def _device_index(device: torch.device) -> int:
    return device.index if device.index is not None else (
        torch.cuda.current_device() if device.type == "cuda" else 0)


def log_ordinary(nbytes: int, device) -> None:
    """The seed's check line, for scratch of >= 4 MiB from ordinary memory (MiB rounded up)."""
    if nbytes >= LOG_MIN:
        log.info("strata prefill mmq: CUDA%d the scratch pool takes a new %d MiB buffer",
                 _device_index(torch.device(device)), (nbytes + (1 << 20) - 1) >> 20)


def ordinary_alloc(nbytes: int, device) -> torch.Tensor:
    """Scratch from ordinary device memory (the slab-off path), with the check line."""
    log_ordinary(nbytes, device)
    return torch.empty(int(nbytes), dtype=torch.uint8, device=torch.device(device))


def scratch_allocator(device, pool: "SlabPool | None" = None, policy: RingPolicy = NO_POLICY):
    """The allocator the expert GEMM takes its stream-k scratch through.

    The policy's slab on (STRATA_MMQ_SLAB=1) and a pool: the pool (tail first, ordinary memory
    when the tail is empty or full). Otherwise ordinary device memory exactly as before.
    """
    if pool is not None and policy.slab:
        return pool
    return lambda nbytes: ordinary_alloc(nbytes, device)


def _dry_alloc(nbytes: int) -> torch.Tensor:
    """A dry pool's ordinary memory: a meta tensor (no storage), counted, never logged."""
    return torch.empty(int(nbytes), dtype=torch.uint8, device="meta")


_dry_alloc.logs_check_line = True   # a dry run prints no check line


class SlabPool:
    """Size-class scratch pool over one tail at a time."""

    def __init__(self, device=None, fallback: Callable[[int], torch.Tensor] | None = None):
        self.device = torch.device(device) if device is not None else None
        self._fallback = fallback
        self.tail: Tail | None = None
        self.used = 0                       # bump offset inside the tail
        self.free: dict[int, torch.Tensor] = {}   # class -> one free buffer
        self._lent: dict[int, tuple[int, torch.Tensor]] = {}  # data_ptr -> (class, buffer)
        self.high_water = 0                 # most tail bytes ever handed out at once
        self.ordinary_bytes = 0             # bytes taken from ordinary memory (fallback)

    @classmethod
    def dry(cls, nbytes: int | None = None) -> "SlabPool":
        """A pool over a tail of `nbytes` (None: unbounded) that holds no memory: requests run
        the same code over a meta-device tail, and what they would take from ordinary memory is
        counted (`ordinary_bytes`), not allocated."""
        n = DRY_UNBOUNDED if nbytes is None else int(nbytes)
        base = torch.empty(ALIGN + n, dtype=torch.uint8, device="meta")
        pool = cls("meta", fallback=_dry_alloc)
        pool.publish(Tail(base[ALIGN:], ALIGN))   # data_ptr = offset: ALIGN.. (0 is ordinary)
        return pool

    @property
    def is_dry(self) -> bool:
        return self.device is not None and self.device.type == "meta"

    # --- publication -------------------------------------------------------------------
    @property
    def address(self) -> int | None:
        return None if self.tail is None else self.tail.address

    def publish(self, tail: Tail | None) -> None:
        """Serve from `tail` from now on; a different address drops every old buffer."""
        if tail is None or tail.empty:
            self.drop()
            return
        if self.tail is not None and self.tail.address == tail.address \
                and self.tail.nbytes == tail.nbytes:
            return
        self.drop()
        self.tail = tail
        if self.device is None:
            self.device = tail.view.device

    def drop(self) -> None:
        """Forget the tail and every buffer carved from it (end of prompt, moved tail)."""
        self.tail = None
        self.used = 0
        self.free.clear()
        self._lent.clear()

    # --- allocation --------------------------------------------------------------------
    def fallback(self, nbytes: int) -> torch.Tensor:
        self.ordinary_bytes += nbytes
        if self._fallback is not None:
            if not getattr(self._fallback, "logs_check_line", False):
                log_ordinary(nbytes, self.device or "cpu")
            return self._fallback(nbytes)
        return ordinary_alloc(nbytes, self.device or "cpu")

    def alloc(self, nbytes: int) -> torch.Tensor:
        """A uint8 scratch buffer of at least `nbytes` (a view of its class-sized buffer)."""
        cls = size_class(nbytes)
        buf = self.free.pop(cls, None)
        if buf is None and self.tail is not None:
            start = align_up(self.used)
            if start + cls <= self.tail.nbytes:
                buf = self.tail.view[start:start + cls]
                self.used = start + cls
                self.high_water = max(self.high_water, self.used)
        if buf is None:
            return self.fallback(nbytes)[:nbytes]
        self._lent[buf.data_ptr()] = (cls, buf)
        return buf[:nbytes]

    __call__ = alloc

    def release(self, t: torch.Tensor) -> None:
        """Hand a tail buffer back; it becomes its class's one free buffer.

        A second free buffer of a class is not kept (its tail bytes stay spent until `drop`):
        that bounds the pool to one buffer per class, the seed's rule.
        """
        entry = self._lent.pop(t.data_ptr(), None)
        if entry is None or self.tail is None:
            return  # ordinary memory: torch frees it; or the tail has moved since
        cls, buf = entry
        if cls not in self.free:
            self.free[cls] = buf

    def stats(self) -> dict:
        return {"tail_bytes": 0 if self.tail is None else self.tail.nbytes, "used": self.used,
                "high_water": self.high_water, "free_classes": sorted(self.free),
                "ordinary_bytes": self.ordinary_bytes}
