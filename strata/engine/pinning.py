"""Getting a pack's expert blobs into page-locked host memory fast.

Two ways, both measured by `benchmarks/pin_bench.py`:

- copy: allocate pinned memory (cudaHostAlloc through torch's host allocator) and copy the blobs
  in with several threads. One `copy_` from a memory-mapped pack runs on one core and takes a page
  fault per 4 KiB of the map, so a single thread moves about 1-2 GB/s; the faults and the memcpy
  split over threads scale with cores.
- register: page-lock the pack's own mapping in place (cudaHostRegister, read-only), so nothing
  is copied and the host holds the blobs once. This needs the mapping to outlive the engine (the
  Pack keeps it) and a driver that can lock read-only pages.

`HostExperts` copies each layer into huge-page memory with several threads and registers that
(the fastest measured), falling back to torch's pinned allocator.
"""
from __future__ import annotations

import logging
import mmap
from concurrent.futures import ThreadPoolExecutor

import torch

log = logging.getLogger("strata")

# cudaHostRegister flags (cuda_runtime_api.h): portable = every context sees the lock;
# read-only = lock pages the process may only read (a read-only file mapping).
HOST_REGISTER_PORTABLE = 0x01
HOST_REGISTER_READ_ONLY = 0x08

# 64 MiB pieces: large enough that a thread's per-piece overhead is nothing against the copy,
# small enough that 8 threads share a 600 MB layer evenly.
COPY_PIECE = 64 << 20


def parallel_copy(dst: torch.Tensor, src: torch.Tensor, threads: int = 8,
                  piece: int = COPY_PIECE) -> None:
    """dst[:] = src for two contiguous uint8 CPU tensors of one size, split over `threads`
    (torch's copy_ releases the GIL, so the pieces run in parallel)."""
    d, s = dst.reshape(-1), src.reshape(-1)
    if d.numel() != s.numel():
        raise ValueError(f"parallel_copy: {d.numel()} destination bytes for {s.numel()} source bytes")
    n = d.numel()
    spans = [(a, min(a + piece, n)) for a in range(0, n, piece)]
    if threads <= 1 or len(spans) <= 1:
        d.copy_(s)
        return
    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(lambda ab: d[ab[0]:ab[1]].copy_(s[ab[0]:ab[1]]), spans))


def pinned_copy(src: torch.Tensor, threads: int = 8) -> torch.Tensor:
    """A page-locked copy of `src` (same shape), filled by `threads` threads."""
    dst = torch.empty(src.shape, dtype=torch.uint8, pin_memory=True)
    parallel_copy(dst, src.contiguous(), threads)
    return dst


def huge_page_buffer(nbytes: int) -> tuple[mmap.mmap, torch.Tensor]:
    """Anonymous memory of `nbytes` asked to be backed by 2 MiB transparent huge pages (no-op
    where THP is off), as a uint8 tensor over the map. Keep the map alive as long as the tensor.
    Locking 2 MiB pages costs the driver 512x fewer page-table walks than 4 KiB ones."""
    m = mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            m.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass
    return m, torch.frombuffer(m, dtype=torch.uint8, count=nbytes)


class Registration:
    """cudaHostRegister of one CPU tensor's bytes; `close()` (or the with-block) unregisters."""

    def __init__(self, t: torch.Tensor, read_only: bool = True):
        self.tensor = t
        self.ptr = t.data_ptr()
        self.nbytes = t.numel() * t.element_size()
        flags = HOST_REGISTER_PORTABLE | (HOST_REGISTER_READ_ONLY if read_only else 0)
        try:
            cudart = torch.cuda.cudart()
        except (AssertionError, RuntimeError, AttributeError) as e:  # a torch without CUDA
            raise RuntimeError(f"cudaHostRegister is not available ({e})") from None
        err = cudart.cudaHostRegister(self.ptr, self.nbytes, flags)
        code = int(getattr(err, "value", err))
        if code != 0:
            raise RuntimeError(f"cudaHostRegister of {self.nbytes:,} B failed (cudaError {code})")
        self.open = True

    def close(self) -> None:
        if self.open:
            torch.cuda.cudart().cudaHostUnregister(self.ptr)
            self.open = False

    def __enter__(self) -> "Registration":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
