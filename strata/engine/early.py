"""A pack's expert bytes off the page cache before torch is imported (torch-free on purpose).

A fresh `strata prefill` spends ~3.5 s importing torch and starting CUDA before HostExperts can
begin, and reading a 32 GB pack's expert spans into huge pages takes about as long again on 16
threads (cold_warm-NVIDIA_H200-fdc6190.csv: 3.22 s, the copy done 6.85 s after the spawn).
`EarlyRead.start` begins those reads first thing (strata.cli's main, before any torch import);
HostExperts adopts a layer's filled buffer when its span is exactly the one the opened pack
reports (same file, offset and length) and page-locks it, so the copy ran beside the import.

Nothing here page-locks memory or touches CUDA (that needs the driver, which comes with torch):
every check that can refuse a plan still runs before any pinning, and a refused plan drops the
read-ahead (`close`). The read starts only when the experts fit in the host memory available
now (strata.hostmem.host_available, the number strata.budget checks against)."""
from __future__ import annotations

import json
import mmap
import os
import struct
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from strata.filekind import MAX_HEADER
from strata.hostmem import host_available

# 64 MiB pieces (each read here, each copy in strata.engine.pinning): large enough that a
# thread's per-piece overhead is nothing against the copy, small enough that 8 threads share a
# 600 MB layer evenly
COPY_PIECE = 64 << 20



@dataclass(frozen=True)
class PinMethod:
    """How HostExperts gets a layer's blobs into page-locked memory (pinnable: pass one).

    source   "pread": read the pack file's bytes with os.preadv into the huge pages (no fault
             per 4 KiB of the pack's map, which every other faulting thread of the process
             queues behind); "map": copy from the mapped tensor (any source: in-memory packs,
             GGUF re-layouts). "pread" falls back to "map" where a layer has no file span.
             "register": copy nothing; page-lock the source's own pages in place
             (cudaHostRegister, read-only, of a shared read-only map of the pack file's
             span), so the host holds the blobs once: what a pack in /dev/shm needs when a
             second, pinned copy would not fit beside it (the engine picks it then:
             strata.engine.host.pin_method). The rates measured before 56e7006 (2.0 GB/s on
             the H200 machine, pin-nvidia-h200-d9c8ef3.csv; 1.7 on the H100) were of the
             private map, whose read-only lock Linux 6.x turns into a page-by-page copy; in
             place on the shared map, a 94.8 GB GLM-4.5-Air pack's process ran start to exit
             in 33 s (H100, 608d05e), its lock rate not yet measured alone. It has no copy
             threads: `threads` does not apply, `overlap` locks on threads of its own beside
             the caller, `lockers` layers at once.
    threads  copy threads (one pool for the whole load; at most the machine's cores): 16 read
             10.3 GB/s beside a busy caller, 8 read 8.5 (cold_warm-NVIDIA_H200-3234f3a.csv)
    overlap  page-lock layer i-1 on its own thread while the copy threads fill layer i
    switch   the interpreter's switch interval (s) while a background load runs: each GIL
             hand-off to a copy thread otherwise waits up to the 5 ms default beside a busy
             caller (2.5 vs 9.7 GB/s in benchmarks/results/pin-nvidia-h200-c0a135f.csv);
             None leaves it alone
    lockers  "register" with `overlap`: how many layers are page-locked at once, each on a
             thread of its own. They did not scale on the H100 machine when the lock was the
             private map's copy (above): a 65 GB pack locked at 1.7 GB/s with one, 1.4 with
             eight, and the process's other CUDA calls waited meanwhile (its dense upload
             took 32 s against 1.2 beside the copy; cold_warm-gpt-oss-120b-MXFP4-24GiB-8k-
             pin-NVIDIA_H100-755962c.csv). Hence 1, until the shared map is measured
    early    a process that knows its pack at start reads it ahead of torch's import
             (EarlyRead: strata.cli, experiments/cold_warm.py's child), "pread" only. Off:
             on the H200 machine the reads slow torch's import by about what they save
             (ready 9.2-9.6 s with them, 8.8-9.6 s without; cold_warm-NVIDIA_H200-fa09f68)
    """
    source: str = "pread"
    threads: int = 16
    overlap: bool = True
    switch: float | None = 1e-4
    early: bool = False
    lockers: int = 1

    def __post_init__(self):
        if self.source not in ("pread", "map", "register"):
            raise ValueError(f"PinMethod.source must be 'pread', 'map' or 'register', got "
                             f"{self.source!r}")
        if self.threads < 1:
            raise ValueError(f"PinMethod.threads must be at least 1, got {self.threads}")
        if self.lockers < 1:
            raise ValueError(f"PinMethod.lockers must be at least 1, got {self.lockers}")
        if self.lockers > 1 and not (self.source == "register" and self.overlap):
            raise ValueError(f"PinMethod.lockers applies to 'register' with overlap (layers "
                             f"locked in place on threads of their own), not {self.source!r}"
                             f"{'' if self.overlap else ' without overlap'}; drop it")

    @classmethod
    def parse(cls, text: str) -> "PinMethod":
        """"pread,threads=16,overlap=0,switch=none,early=0,lockers=1" (any subset, any order)."""
        kw: dict = {}
        for item in filter(None, (t.strip() for t in text.split(","))):
            key, eq, val = item.partition("=")
            if not eq:
                kw["source"] = key
            elif key in ("threads", "lockers"):
                kw[key] = int(val)
            elif key == "overlap":
                kw["overlap"] = val not in ("0", "false", "no")
            elif key == "early":
                kw["early"] = val not in ("0", "false", "no")
            elif key == "switch":
                kw["switch"] = None if val in ("none", "") else float(val)
            else:
                raise ValueError(f"unknown pin method field {key!r}")
        return cls(**kw)


def huge_page_map(nbytes: int) -> mmap.mmap:
    """Anonymous memory of `nbytes` asked to be backed by 2 MiB transparent huge pages (no-op
    where THP is off): locking 2 MiB pages costs the driver 512x fewer page-table walks."""
    m = mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            m.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass
    return m


def expert_spans(path: str) -> list[tuple[int, int]]:
    """(file offset, bytes) of each layer's expert tensor in a pack file, in file order, from
    its safetensors header alone. No validation (Pack.open does that): a span that disagrees
    with the opened pack is simply never adopted. Raises OSError/ValueError on what is not a
    readable header."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError("shorter than a safetensors header")
        (n,) = struct.unpack("<Q", raw)
        if n > MAX_HEADER:
            raise ValueError("header length out of range")
        header = json.loads(f.read(n))
    if not isinstance(header, dict):
        raise ValueError("the header is not a JSON object")
    start = 8 + n
    # every "<layer>.experts" tensor (strata.archs.names.experts_name; strata.packs itself
    # imports torch), in file order: the writer lays the layers out in order, and a span is
    # adopted only where the opened pack reports the same one
    spans = sorted((start + int(e["data_offsets"][0]),
                    int(e["data_offsets"][1]) - int(e["data_offsets"][0]))
                   for name, e in header.items() if name.endswith(".experts"))
    return spans


class EarlyRead:
    """The expert spans of one pack file being read into huge-page maps on a thread pool, layer
    0 first. `take` hands a filled map over; `close` stops the rest and frees what was not taken."""

    def __init__(self, path: str, spans: list[tuple[int, int]], threads: int):
        self.path = os.path.realpath(path)
        self._fd = os.open(path, os.O_RDONLY)
        self._pool = ThreadPoolExecutor(max(1, threads), thread_name_prefix="strata-early")
        self._spans: dict[tuple[int, int], tuple[mmap.mmap, list[Future]]] = {}
        for off, n in spans:
            m = huge_page_map(n)
            futs = [self._pool.submit(self._read, m, a, min(a + COPY_PIECE, n), off)
                    for a in range(0, n, COPY_PIECE)]
            self._spans[(off, n)] = (m, futs)

    @classmethod
    def start(cls, path, *, threads: int = 16, available: int | None = None) -> "EarlyRead | None":
        """Begin reading `path`'s expert spans, or None: not a readable pack header, no experts,
        or more expert bytes than the host has available (`available`: that figure, for tests;
        default strata.hostmem.host_available())."""
        try:
            spans = expert_spans(str(path))
        except (OSError, ValueError, KeyError, TypeError):
            return None
        avail = host_available() if available is None else available
        if not spans or avail is None or sum(n for _, n in spans) > avail:
            return None
        try:
            return cls(str(path), spans, min(threads, os.cpu_count() or 1))
        except OSError:
            return None

    def _read(self, m: mmap.mmap, a: int, b: int, off: int) -> None:
        with memoryview(m) as whole, whole[a:b] as piece:
            got = os.preadv(self._fd, [piece], off + a)
        if got != b - a:
            raise OSError(f"{self.path}: read {got} of {b - a} bytes at {off + a}")

    def take(self, path: str, offset: int, nbytes: int) -> mmap.mmap | None:
        """The filled map of exactly that span of `path` (waits for its reads), now the caller's
        to keep and close; None when this read holds no such span or a read of it failed."""
        if os.path.realpath(path) != self.path:
            return None
        got = self._spans.pop((offset, nbytes), None)
        if got is None:
            return None
        m, futs = got
        try:
            for f in futs:
                f.result()
        except OSError:
            m.close()
            return None
        return m

    @property
    def spans(self) -> list[tuple[int, int]]:
        """The spans not yet taken."""
        return list(self._spans)

    def close(self) -> None:
        """Stop the reads not begun, wait for the running ones, free every map not taken."""
        if self._pool is None:
            return
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._pool = None
        for m, _ in self._spans.values():
            m.close()
        self._spans.clear()
        os.close(self._fd)


def early_read_for(argv: list[str], method: PinMethod = PinMethod()) -> EarlyRead | None:
    """The read-ahead a command line will use, started now, or None (always None unless
    `method.early`: the engine's default PinMethod does not read ahead). `strata prefill PACK` with
    a streaming budget (--vram, --cache, --kv, --kv-resident) and `strata bench PACK` pin the
    pack's experts unless --unpinned; this looks for exactly that, before argparse (whose
    command modules import torch). A guess that misses only costs the read: nothing is
    adopted that the opened pack does not report."""
    if not method.early or method.source != "pread":
        return None
    if len(argv) < 2 or argv[0] not in ("prefill", "bench") or "--unpinned" in argv:
        return None
    if "-h" in argv or "--help" in argv:
        return None
    flags = ("--vram", "--cache", "--kv", "--kv-resident")
    if argv[0] == "prefill" and not any(a.split("=")[0] in flags for a in argv):
        return None
    pack = argv[1]
    if pack.startswith("-") or not os.path.isfile(pack):
        return None
    return EarlyRead.start(pack, threads=method.threads)
