"""Where a participant's stream-k fixup scratch comes from (STRATA_MMQ_SLAB).

The expert GEMM asks for its fixup scratch through `moe_ffn(..., scratch_alloc=...)`. Each
participant (one GPU, its own expert cache) owns one `ParticipantScratch`:

- slab off (default): an `OrdinaryScratch`, an exact-size caching pool on ordinary device memory
  like ggml's ordinary pool: a new buffer only when no cached buffer of that exact size is free.
  Taking a new buffer of >= 4 MiB logs the start check line
      strata prefill mmq: CUDA<i> the scratch pool takes a new <N> MiB buffer
  so the line means what the seed means: a new allocation in ordinary memory, at the moment a
  prompt runs. Its `high_water` is the bytes it holds (it never gives buffers back).
- slab on (STRATA_MMQ_SLAB=1): a `SlabPool` over the tail of the participant's own loan (size
  classes; strata.memory.pool), published per layout and dropped before the loan refills; when
  the tail is empty or full it falls back to the ordinary pool above.

Lifetime: one launch's scratch at a time. A new request hands the previous buffer back first;
reuse is stream-ordered like torch's caching allocator (the GEMM launches of one participant
run on one compute stream, so the next launch's kernels queue behind the last one's).

Guard 3 lives here: `publish` accepts only a tail inside this participant's own loan (its own
expert cache, on its device); anything else is refused with a StrataError.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from strata.errors import StrataError
from strata.memory.carve import Tail
from strata.memory.pool import LOG_MIN, SlabPool, log_ordinary


def _torch_alloc(device: torch.device) -> Callable[[int], torch.Tensor]:
    return lambda nbytes: torch.empty(int(nbytes), dtype=torch.uint8, device=device)


class OrdinaryScratch:
    """Exact-size caching pool on ordinary device memory (the slab-off path).

    `alloc` is how a new buffer is obtained (default torch.empty on the device); tests and the
    slab experiment pass a budgeted one to play a card the expert cache has filled."""

    logs_check_line = True   # SlabPool.fallback must not log a second time

    def __init__(self, device, alloc: Callable[[int], torch.Tensor] | None = None):
        self.device = torch.device(device)
        self._alloc = alloc or _torch_alloc(self.device)
        self.free: dict[int, list[torch.Tensor]] = {}    # exact size -> free buffers
        self._lent: dict[int, tuple[int, torch.Tensor]] = {}  # data_ptr -> (size, buffer)
        self.held = 0              # bytes of every buffer this pool took (it keeps them)
        self.high_water = 0
        self.new_buffers = 0

    def alloc(self, nbytes: int) -> torch.Tensor:
        n = int(nbytes)
        bufs = self.free.get(n)
        if bufs:
            buf = bufs.pop()
        else:
            log_ordinary(n, self.device)
            buf = self._alloc(n)           # may raise torch.cuda.OutOfMemoryError: the caller's
            self.held += n                 # prompt fails (the engine makes it an AllocationError)
            self.high_water = max(self.high_water, self.held)
            self.new_buffers += 1
        self._lent[buf.data_ptr()] = (n, buf)
        return buf

    __call__ = alloc

    def release(self, t: torch.Tensor) -> None:
        entry = self._lent.pop(t.data_ptr(), None)
        if entry is not None:
            self.free.setdefault(entry[0], []).append(entry[1])

    def stats(self) -> dict:
        return {"held": self.held, "high_water": self.high_water, "new_buffers": self.new_buffers}


class ParticipantScratch:
    """The scratch allocator of one participant: the callable moe_ffn's hook receives."""

    def __init__(self, name: str, device, cache_buffer: torch.Tensor,
                 ordinary: OrdinaryScratch | None = None):
        self.name = name
        self.device = torch.device(device)
        self.cache_buffer = cache_buffer           # the participant's own expert cache
        self.ordinary = ordinary or OrdinaryScratch(self.device)
        self.slab = SlabPool(self.device, fallback=self.ordinary)
        self._last: tuple[object, torch.Tensor] | None = None
        self.requests = 0

    def use_ordinary(self, ordinary: OrdinaryScratch) -> None:
        """Take ordinary memory from `ordinary` from now on (also the slab's fallback)."""
        self._hand_back()
        self.ordinary = ordinary
        self.slab._fallback = ordinary

    # -- guards ------------------------------------------------------------------------------
    def publish(self, tail: Tail | None) -> None:
        """Serve scratch from `tail` (STRATA_MMQ_SLAB=1): it must lie in this participant's own
        loan. An empty tail publishes nothing (scratch stays in ordinary memory)."""
        if tail is not None and not tail.empty:
            self._check_own(tail)
        self._hand_back()
        self.slab.publish(tail)

    def _check_own(self, tail: Tail) -> None:
        buf = self.cache_buffer
        lo, hi = buf.data_ptr(), buf.data_ptr() + buf.numel()
        if tail.view.device != buf.device or tail.view.device != self.device \
                or not (lo <= tail.address and tail.address + tail.nbytes <= hi):
            raise StrataError(
                f"{self.name}: refusing a scratch tail at {tail.address:#x} "
                f"({tail.nbytes:,} B on {tail.view.device}) that is not inside this "
                f"participant's own expert cache ({lo:#x}..{hi:#x} on {buf.device}); each "
                f"participant publishes the tail of its own loan")

    def drop(self) -> None:
        """The prompt is read: forget the tail before the loan's slots are refilled."""
        self._hand_back()
        self.slab.drop()

    @property
    def published(self) -> bool:
        return self.slab.tail is not None

    # -- allocation --------------------------------------------------------------------------
    def _hand_back(self) -> None:
        if self._last is not None:
            owner, buf = self._last
            owner.release(buf)
            self._last = None

    def __call__(self, nbytes: int) -> torch.Tensor:
        self._hand_back()            # one launch's scratch at a time (stream-ordered reuse)
        self.requests += 1
        if self.published:
            buf = self.slab.alloc(nbytes)
            # tail buffers go back to the slab, fallback ones to the ordinary pool (both pools
            # key their loans on data_ptr, so the view handed out is enough to give it back)
            owner = self.slab if _inside(buf, self.slab.tail) else self.ordinary
        else:
            buf = self.ordinary.alloc(nbytes)
            owner = self.ordinary
        self._last = (owner, buf)
        return buf[:int(nbytes)]

    def stats(self) -> dict:
        return {"requests": self.requests, "slab_high_water": self.slab.high_water,
                "slab_ordinary_bytes": self.slab.ordinary_bytes, **{
                    f"ordinary_{k}": v for k, v in self.ordinary.stats().items()}}


def _inside(buf: torch.Tensor, tail: Tail) -> bool:
    return tail.address <= buf.data_ptr() < tail.address + tail.nbytes


__all__ = ["LOG_MIN", "OrdinaryScratch", "ParticipantScratch"]
