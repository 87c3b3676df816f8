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
import os
from concurrent.futures import ThreadPoolExecutor

import torch

log = logging.getLogger("strata")

# cudaHostRegister flags (cuda_runtime_api.h): portable = every context sees the lock;
# read-only = lock pages the process may only read (a read-only file mapping).
HOST_REGISTER_PORTABLE = 0x01
HOST_REGISTER_READ_ONLY = 0x08

# PinMethod and the copy piece live beside the read-ahead, which must not import torch
from strata.engine.early import COPY_PIECE, PinMethod, huge_page_map  # noqa: F401
from strata.errors import StrataError


def in_callers_mode(fn):
    """fn wrapped to run, on a pool's thread, under the calling thread's inference mode. The mode
    is per thread, and a destination made under torch.inference_mode (a KV store restored by a
    caller holding it) may be written in place only under that mode."""
    mode = torch.is_inference_mode_enabled()

    def run(arg):
        with torch.inference_mode(mode):
            return fn(arg)
    return run


def parallel_copy(dst: torch.Tensor, src: torch.Tensor, threads: int = 8,
                  piece: int = COPY_PIECE, pool: ThreadPoolExecutor | None = None) -> None:
    """dst[:] = src for two contiguous uint8 CPU tensors of one size, split over `threads`
    (torch's copy_ releases the GIL, so the pieces run in parallel); `pool`: run on it instead
    of a pool of `threads` made for this call."""
    d, s = dst.reshape(-1), src.reshape(-1)
    if d.numel() != s.numel():
        raise ValueError(f"parallel_copy: {d.numel()} destination bytes for {s.numel()} source bytes")
    n = d.numel()
    spans = [(a, min(a + piece, n)) for a in range(0, n, piece)]
    if (threads <= 1 and pool is None) or len(spans) <= 1:
        d.copy_(s)
        return
    copy = in_callers_mode(lambda ab: d[ab[0]:ab[1]].copy_(s[ab[0]:ab[1]]))
    if pool is not None:
        list(pool.map(copy, spans))
        return
    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(copy, spans))


def pread_copy(dst: torch.Tensor, path: str, offset: int, pool: ThreadPoolExecutor | None,
               piece: int = COPY_PIECE) -> None:
    """dst[:] = the file's bytes at offset.. (a contiguous uint8 CPU tensor), os.preadv per
    piece on the pool's threads (the GIL is released in each read). Raises OSError on a short
    read (a file shorter than its header says)."""
    view = memoryview(dst.reshape(-1).numpy())
    n = len(view)
    fd = os.open(path, os.O_RDONLY)
    try:
        def one(a: int) -> None:
            b = min(a + piece, n)
            got = os.preadv(fd, [view[a:b]], offset + a)
            if got != b - a:
                raise OSError(f"{path}: read {got} of {b - a} bytes at {offset + a}")
        starts = range(0, n, piece)
        if pool is None:
            for a in starts:
                one(a)
        else:
            list(pool.map(one, starts))
    finally:
        os.close(fd)


def pinned_copy(src: torch.Tensor, threads: int = 8) -> torch.Tensor:
    """A page-locked copy of `src` (same shape), filled by `threads` threads."""
    dst = torch.empty(src.shape, dtype=torch.uint8, pin_memory=True)
    parallel_copy(dst, src.contiguous(), threads)
    return dst


def huge_page_buffer(nbytes: int) -> tuple[mmap.mmap, torch.Tensor]:
    """strata.engine.early.huge_page_map as a uint8 tensor over the map (keep the map alive as
    long as the tensor)."""
    m = huge_page_map(nbytes)
    return m, torch.frombuffer(m, dtype=torch.uint8, count=nbytes)


def shared_read_map(path: str, offset: int, nbytes: int) -> tuple[mmap.mmap, torch.Tensor]:
    """`nbytes` of file `path` from `offset` as a uint8 tensor over a shared, read-only map
    (keep the map alive as long as the tensor). What PinMethod "register" locks: Linux (6.x)
    makes a read-only long-term lock of a private (copy-on-write) file map unshare every page
    into anonymous memory, a silent copy that takes the host memory the lock was meant to
    save; a shared map's pages are the file's own (on a tmpfs: its memory), locked as they are.
    Writing through the tensor faults: nothing may write a pack's experts."""
    import warnings
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    fd = os.open(path, os.O_RDONLY)
    try:
        m = mmap.mmap(fd, offset - start + nbytes, access=mmap.ACCESS_READ, offset=start)
    finally:
        os.close(fd)
    with warnings.catch_warnings():      # read-only by design, said above
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        t = torch.frombuffer(m, dtype=torch.uint8, count=nbytes, offset=offset - start)
    return m, t


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
            self.tensor = None   # so the memory under it can be unmapped

    def __enter__(self) -> "Registration":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# Dense weights go up in pieces of this size through two pinned staging buffers: big enough
# that each DMA runs at the PCIe rate, small enough that the staging costs little to pin.
STAGE_PIECE = 128 << 20
ALIGN = 256


def parallel_copies(pairs: list[tuple[torch.Tensor, torch.Tensor]], pool: ThreadPoolExecutor | None,
                    piece: int = 16 << 20) -> None:
    """dst[:] = src for each (dst, src) pair of contiguous 1-D CPU tensors of one length (uint8
    bytes, or a cast: dst's dtype from src's), split into pieces of at most `piece` destination
    bytes shared by the pool's threads (None: this thread): a cast runs on every thread."""
    jobs = []
    for d, s in pairs:
        n, step = d.numel(), max(1, piece // d.element_size())
        jobs += [(d[a:min(a + step, n)], s[a:min(a + step, n)]) for a in range(0, n, step)]
    if pool is None or len(jobs) <= 1:
        for d, s in jobs:
            d.copy_(s)
        return
    list(pool.map(in_callers_mode(lambda ds: ds[0].copy_(ds[1])), jobs))


def _staging(nbytes: int, cuda: bool) -> tuple[torch.Tensor, object]:
    """A host buffer of nbytes the DMA can read asynchronously: huge pages + cudaHostRegister,
    else torch's pinned allocator, else (no CUDA, or both failed) ordinary memory. Returns the
    buffer and what to close when done (or None)."""
    if not cuda:
        return torch.empty(nbytes, dtype=torch.uint8), None
    m, buf = huge_page_buffer(nbytes)
    try:
        return buf, (Registration(buf, read_only=False), m)
    except RuntimeError:
        del buf
        m.close()
    try:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True), None
    except RuntimeError:
        return torch.empty(nbytes, dtype=torch.uint8), None


def upload(tensors: dict[str, torch.Tensor], device, dtype: torch.dtype, *, threads: int = 8,
           piece: int = STAGE_PIECE) -> dict[str, torch.Tensor]:
    """Host tensors onto one device as `dtype`, in bulk: name -> a view of one device buffer that
    holds them all (offsets 256-aligned), filled by stage_to_device. A float tensor of another
    dtype (an fp32 tensor of a GGUF or an old pack) is cast as its
    pieces are staged, on every staging thread: the device holds only `dtype` bytes, and the
    host makes no whole converted copy first (one thread's `.to` of several GB was most of a
    start-up's dense upload)."""
    device = torch.device(device)
    srcs, offs, total = {}, {}, 0
    for name, t in tensors.items():
        castable = t.is_floating_point() and dtype.is_floating_point
        srcs[name] = (t if t.dtype == dtype or castable else t.to(dtype)).contiguous().reshape(-1)
        offs[name] = total
        total += -(-t.numel() * dtype.itemsize // ALIGN) * ALIGN
    buf = torch.empty(max(total, 1), dtype=torch.uint8, device=device)
    views = {n: buf[offs[n]:offs[n] + s.numel() * dtype.itemsize].view(dtype)
             for n, s in srcs.items()}
    stage_to_device([(views[n], s if s.dtype != dtype else s.view(torch.uint8))
                     for n, s in srcs.items()], device, threads=threads, piece=piece)
    return {name: views[name].view(t.shape) for name, t in tensors.items()}


def stage_to_device(pairs: list[tuple[torch.Tensor, torch.Tensor]], device, *, threads: int = 8,
                    piece: int = STAGE_PIECE) -> None:
    """dst.copy_(src) for each (dst, src) pair: dst a contiguous tensor on `device`, src a host
    tensor of the same number of bytes (any dtype, contiguous or not: read as its bytes), or a
    cast: float dst and src of another float dtype with as many elements (cast into the staging
    piece by the filling threads; its segments must start at a multiple of dst's itemsize in
    the stream of pairs, as upload's do).

    One pageable copy per tensor reads a memory-mapped file on one core (a page fault per 4 KiB,
    then the driver's own staging copy) and waits for each copy. Here the bytes stream through
    two pinned staging pieces: `threads` threads copy piece k+1 out of the sources while the
    DMAs of piece k run (one a destination segment), and the host waits once at the end. On the
    CPU the same pieces run as plain copies (what the tests check)."""
    device = torch.device(device)
    cuda = device.type == "cuda"
    flat = []        # (dst bytes, src: bytes, or elements to cast, None or the cast's dtype)
    for d, s in pairs:
        cast = (d.dtype if d.dtype != s.dtype and d.is_floating_point()
                and s.is_floating_point() else None)
        dst = d.view(-1).view(torch.uint8)
        src = s.contiguous().reshape(-1)
        if cast is None:
            src = src.view(torch.uint8)
        if not d.is_contiguous() or (src.numel() * d.element_size() if cast else src.numel()) \
                != dst.numel():
            raise StrataError(f"stage_to_device: a contiguous destination of the source's "
                              f"{src.numel()} {'elements' if cast else 'bytes'}, got "
                              f"{list(d.shape)} {d.dtype}")
        if dst.numel():
            flat.append((dst, src, cast))
    total = sum(d.numel() for d, _, _ in flat)
    if not total:
        return
    piece = max(ALIGN, min(piece, total))
    stages = [_staging(piece, cuda) for _ in range(2 if total > piece else 1)]
    stream = torch.cuda.Stream(device) if cuda else None
    if cuda:
        stream.wait_stream(torch.cuda.current_stream(device))   # the destinations, in order
    done: list = [None] * len(stages)
    stage, fills, lands = None, [], []
    pool = ThreadPoolExecutor(max_workers=threads) if threads > 1 else None
    try:
        j, at = 0, 0              # the pair being staged and how far into it
        for k, p in enumerate(range(0, total, piece)):
            n = min(piece, total - p)
            s = k % len(stages)
            stage = stages[s][0]
            if done[s] is not None:
                done[s].synchronize()          # the DMAs out of this staging piece have run
            fills, lands, o = [], [], 0
            while o < n:
                dst, src, cast = flat[j]
                m = min(n - o, dst.numel() - at)
                if cast is None:
                    fills.append((stage[o:o + m], src[at:at + m]))
                else:       # whole elements: the pieces and pairs before are multiples
                    isz = cast.itemsize
                    if o % isz or at % isz or m % isz:
                        raise StrataError(f"stage_to_device: a cast to {cast} must start at a "
                                          f"multiple of {isz} bytes in the staged stream")
                    fills.append((stage[o:o + m].view(cast), src[at // isz:(at + m) // isz]))
                lands.append((dst[at:at + m], stage[o:o + m]))
                o, at = o + m, at + m
                if at == dst.numel():
                    j, at = j + 1, 0
            parallel_copies(fills, pool)
            if cuda:
                with torch.cuda.stream(stream):
                    for dst, st in lands:
                        dst.copy_(st, non_blocking=True)
                    done[s] = torch.cuda.Event()
                    done[s].record(stream)
            else:
                for dst, st in lands:
                    dst.copy_(st)
        if cuda:
            stream.synchronize()
            torch.cuda.current_stream(device).wait_stream(stream)
    finally:
        if pool is not None:
            pool.shutdown()
        keeps = [keep for _, keep in stages if keep is not None]
        for reg, _ in keeps:
            reg.close()                        # unlock before the pages go
        del stage, stages, fills, lands
        for _, m in keeps:
            try:
                m.close()
            except BufferError:                # a view still holds the map: freed at exit
                pass
