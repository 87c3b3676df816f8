"""Every expert blob of a model in host memory: one uint8 tensor [E, blob_l] per layer.

Pinned (page-locked) memory lets host->device copies run asynchronously at PCIe speed (55 GB/s
measured on the H200 rig against 8.3 GB/s pageable). If pinning fails the engine streams from
pageable memory with the unpinned ring budget, and says so once.

How: each layer goes into anonymous memory on 2 MiB transparent huge pages, copied by several
threads, then cudaHostRegister'd (strata.engine.pinning). On the H200 machine that pins 12.2 GB/s
against 1.6 GB/s for torch's pinned allocation + one copy (cudaHostAlloc locks 4 KiB pages one by
one; benchmarks/pin_bench.py, benchmarks/results/pin-nvidia-h200-d9c8ef3.csv). Where registering
fails, torch's pinned allocator is tried before giving up on pinning.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch
from tqdm import tqdm

from strata.engine.pinning import (PinMethod, Registration, huge_page_buffer, parallel_copy,
                                   pread_copy, shared_read_map)
from strata.errors import StrataError
from strata.hostmem import host_available, on_tmpfs
from strata.units import fmt_bytes

log = logging.getLogger("strata")


class HostExperts:
    """Host copies of each layer's expert blobs; `blob(l, e)` is expert e of layer l (uint8)."""

    def __init__(self, layer_blobs: Sequence[torch.Tensor] | Callable[[int], torch.Tensor],
                 blob_sizes: Sequence[int], *, pin: bool = True, progress: bool = False,
                 layers: Sequence[int] | None = None, background: bool = False,
                 spans: Callable[[int], tuple[str, int, int] | None] | None = None,
                 method: PinMethod | None = None, early=None):
        """`layer_blobs`: one uint8 tensor per layer, or a callable giving layer i's (so a
        32 GB pack is read into pinned memory a layer at a time, never held twice).
        `layers`: load only these (a pipeline rank's range, strata.engine.distributed); the
        others hold no blob ([0, blob] tensors) and are never read.
        `background`: load on a thread and return at once, so the caller's own start (imports,
        the dense weights' upload, the cache's allocation) runs beside the copy threads; every
        accessor (and `join()`) waits for it, and an error raised there is raised by them.
        `spans`: layer i -> (file, offset, bytes) of its blobs in a file (Pack.expert_span), so
        the "pread" method reads the file instead of copying from its map. `method`: how
        (strata.engine.pinning.PinMethod; default PinMethod()). `early`: a read-ahead of the
        pack file begun before torch was imported (strata.engine.early.EarlyRead): a layer
        whose span it holds is adopted (its reads awaited, then page-locked) instead of read
        again; it is closed, whatever it did not hand over freed, when the load ends."""
        if callable(layer_blobs):
            get = layer_blobs
            layer_blobs = range(len(blob_sizes))
        else:
            get = None
            if len(layer_blobs) != len(blob_sizes):
                raise StrataError(f"{len(layer_blobs)} expert tensors for {len(blob_sizes)} "
                                  f"blob sizes")
        self.blob_sizes = [int(b) for b in blob_sizes]
        self._want_pin = pin and torch.cuda.is_available()
        self._pinned = False
        self._layers: list[torch.Tensor] = []
        self.pin_error: str | None = None
        self._maps: list = []               # maps under the registered layers (huge pages,
                                            # or the pack file's shared spans in place)
        self._regs: list[Registration] = []
        self._in_place: set[int] = set()    # of those, the source's own pages (no copy)
        self._finalizer = weakref.finalize(self, _release, self._regs, self._maps)
        self._done = threading.Event()
        self._error: BaseException | None = None
        self.load_s = 0.0
        self.loaded_at: float | None = None       # epoch seconds the loading ended
        self._lock_times: list[float] = []         # each cudaHostRegister's seconds (lock_s)
        self.early_layers = 0                      # layers adopted from the read-ahead
        self.method = method or PinMethod()
        self._spans = spans
        self._early = early
        args = (layer_blobs, get, layers, progress)
        if background:
            held = self.method.switch is not None
            if held:
                _switch_hold(self.method.switch)   # released by the loading thread at its end
            threading.Thread(target=self._load, args=(*args, held), name="strata-pin",
                             daemon=True).start()
        else:
            self._load(*args)
            self.join()

    def _load(self, layer_blobs, get, layers, progress, held: bool = False) -> None:
        t0 = time.perf_counter()
        try:
            self._load_layers(layer_blobs, get, layers, progress)
            self.load_s = time.perf_counter() - t0   # wall seconds of the loading alone
            self.loaded_at = time.time()
        except BaseException as e:   # handed to the waiting thread (join)
            self._error = e
        finally:
            if held:
                _switch_release()
            self._done.set()

    def _load_layers(self, layer_blobs, get, layers, progress) -> None:
        """Layer by layer into huge pages (read from the file, or copied from the source
        tensor), then page-locked: with `method.overlap` a locking thread registers layer i-1
        while the copy threads fill layer i (the two take about equal time: 0.48 s and 0.40 s
        per 8 GB on the H200 machine), so the load runs at about the slower of the two."""
        want_pin = self._want_pin
        meth = self.method
        threads = min(meth.threads, os.cpu_count() or 1)
        it = zip(layer_blobs, self.blob_sizes)
        if progress:
            it = tqdm(list(it), desc="pinning experts" if want_pin else "loading experts",
                      unit="layer", leave=False)
        pool = ThreadPoolExecutor(threads, thread_name_prefix="strata-copy") if threads > 1 \
            else None
        in_place = meth.source == "register"
        locker = ThreadPoolExecutor(meth.lockers if in_place else 1,
                                    thread_name_prefix="strata-lock") \
            if want_pin and meth.overlap else None
        pending = None   # (index, future): the one layer being registered
        inflight: list = []    # in place: the layers being registered, oldest first
        try:
            for i, (t, size) in enumerate(it):
                if (layers is not None and i not in layers) or size == 0:  # not ours, or dense
                    self._layers.append(torch.empty(0, size, dtype=torch.uint8))
                    continue
                if get is not None:
                    t = get(t)
                if t.dtype != torch.uint8 or t.numel() % size:
                    raise StrataError(f"layer {i}: expert blobs must be uint8 whole blobs of "
                                      f"{size:,} B, got {t.dtype} x {t.numel():,}")
                t = t.reshape(-1, size)
                if not (want_pin and self.pin_error is None):
                    self._layers.append(t)
                    continue
                if in_place:                         # the source's own pages, locked in place
                    span = self._spans(i) if self._spans is not None else None
                    if span is not None and span[2] == t.numel():   # the file's pages, shared
                        m, shared = shared_read_map(*span)
                        self._maps.append(m)
                        t = shared.view(t.shape)
                    self._layers.append(t)
                    if locker is not None:           # at most `lockers` layers at once
                        self._settle(inflight, meth.lockers - 1)
                    if self.pin_error is not None:
                        continue
                    job = (self._register_in_place, t)
                    if locker is None:
                        self._resolve((len(self._layers) - 1, _done_future(*job)))
                    else:
                        inflight.append((len(self._layers) - 1, locker.submit(*job)))
                    continue
                span = self._spans(i) if self._spans is not None and meth.source == "pread" \
                    else None
                if span is not None and span[2] != t.numel():
                    span = None
                m = self._early.take(*span) if span is not None and self._early is not None \
                    else None
                if m is not None:     # read ahead beside the imports
                    buf = torch.frombuffer(m, dtype=torch.uint8, count=t.numel()).view(t.shape)
                    self.early_layers += 1
                else:
                    m, buf = huge_page_buffer(t.numel())
                    buf = buf.view(t.shape)
                    if span is not None:
                        pread_copy(buf, span[0], span[1], pool)
                    else:
                        parallel_copy(buf, t.contiguous(), threads, pool=pool)
                self._layers.append(t)              # until its registration resolves
                pending = self._resolve(pending)
                if self.pin_error is not None:      # the last layer's locking just failed:
                    del buf                         # this one stays pageable like the rest
                    m.close()
                    continue
                if locker is None:
                    self._resolve((len(self._layers) - 1,
                                   _done_future(self._lock_pages, buf, m, t, pool)))
                else:
                    pending = (len(self._layers) - 1,
                               locker.submit(self._lock_pages, buf, m, t, pool))
            self._resolve(pending)
            self._settle(inflight, 0)
        finally:
            for ex in (locker, pool):
                if ex is not None:
                    ex.shutdown()
            if self._early is not None:   # what it read that no layer took goes now
                self._early.close()
        self._pinned = want_pin and self.pin_error is None
        if want_pin and not self._pinned:
            log.warning("strata prefill: pinning the expert blobs failed (%s); streaming from "
                        "pageable memory with the unpinned ring budget", self.pin_error)

    def _settle(self, inflight: list, keep: int) -> None:
        """Resolve the oldest of the layers being registered in place until `keep` are left;
        after a failure, every one (none may still be locking when the fallback unlocks)."""
        while len(inflight) > keep:
            if inflight[0][1].exception() is not None:   # waits for it: it failed, so the
                for _, fut in inflight[1:]:                # fallback waits for the others
                    fut.exception()
            self._resolve(inflight.pop(0))
            if self.pin_error is not None:
                keep = 0

    def _resolve(self, pending) -> None:
        """Wait for the layer being registered; on failure fall back to pageable, once."""
        if pending is None:
            return None
        idx, fut = pending
        try:
            self._layers[idx] = fut.result()
        except RuntimeError as e:  # out of page-lockable memory: pageable from here on
            if self.pin_error is not None:   # a layer locking beside the one that failed
                return None
            self.pin_error = str(e).splitlines()[0]
            # copy out what lies in locked memory (registered huge pages, torch's pinned
            # blocks) before the maps under it go; pages locked in place stay the source's
            locked = {r.ptr for r in self._regs} - self._in_place
            self._layers = [x.clone() if x.data_ptr() in locked or x.is_pinned() else x
                            for x in self._layers]
            _release(self._regs, self._maps)
        return None

    def _register_in_place(self, t: torch.Tensor) -> torch.Tensor:
        """Page-lock layer blobs `t` where they lie (PinMethod "register": a shared read-only map
        of the pack file's span, or an in-memory source), read-only: nothing copied
        (RuntimeError when the driver refuses)."""
        t0 = time.perf_counter()
        t = t.contiguous()               # a pack's layer is one run of its map: no copy
        try:
            self._regs.append(Registration(t, read_only=True))
            self._in_place.add(self._regs[-1].ptr)
            return t
        finally:
            self._lock_times.append(time.perf_counter() - t0)   # atomic beside other lockers

    def _lock_pages(self, buf: torch.Tensor, m, t: torch.Tensor, pool) -> torch.Tensor:
        """Page-lock the filled huge-page copy `buf` of layer blobs `t` (cudaHostRegister),
        else a copy in torch's pinned allocator (RuntimeError when both fail)."""
        t0 = time.perf_counter()
        try:
            self._regs.append(Registration(buf, read_only=False))
            self._maps.append(m)
            return buf
        except RuntimeError:
            del buf
            m.close()
        finally:
            self._lock_times.append(time.perf_counter() - t0)   # atomic beside other lockers
        p = torch.empty(t.shape, dtype=torch.uint8, pin_memory=True)
        parallel_copy(p, t.contiguous(), pool=pool)
        return p

    def join(self) -> "HostExperts":
        """Wait until every layer is loaded (at once when not in the background); raise what
        the loading raised."""
        if not self._done.is_set():
            self._done.wait()
        if self._error is not None:
            raise self._error
        return self

    @property
    def lock_s(self) -> float:
        """Seconds in cudaHostRegister, summed over the locking threads (lockers > 1: more
        than the wall time they took)."""
        return sum(self._lock_times)

    @property
    def layers(self) -> list[torch.Tensor]:
        return self.join()._layers

    @property
    def pinned(self) -> bool:
        return self.join()._pinned

    def close(self) -> None:
        """Unlock and free the pinned layers now (the engine is done with them)."""
        self._done.wait()
        self._layers = []
        self._finalizer()

    @property
    def n_layer(self) -> int:
        return len(self.layers)

    def blob(self, layer: int, expert: int) -> torch.Tensor:
        return self.layers[layer][expert]

    def run(self, layer: int, expert: int, count: int) -> torch.Tensor | None:
        """Blobs expert .. expert + count - 1 of `layer` as one flat view (one copy carries
        them), or None where the layer's blobs are not one contiguous [E, size] block."""
        t = self.layers[layer]
        if t.dim() != 2 or not t.is_contiguous():
            return None
        return t[expert:expert + count].view(-1)

    def source(self, layer: int, expert: int) -> torch.Tensor:
        """The ExpertCache's source callable: the blob to (re)fill a slot with."""
        return self.layers[layer][expert]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() for t in self.layers)


def expert_bytes(pack, layers=None) -> int:
    """Host bytes of `pack`'s routed experts over `layers` (default every layer): each layer's
    blob size times E. What an engine pins and hands host_pinning, and `strata plan` reports:
    one count for all of them."""
    ls = range(len(pack.layers)) if layers is None else layers
    return sum(pack.layers[l].blob_size for l in ls) * pack.shape.n_expert


def pin_method(pack, host_blobs: int, available: int | None) -> PinMethod:
    """How an engine pins `pack`'s `host_blobs` bytes of experts: the default copy into huge
    pages (PinMethod(): 12.2 GB/s on the H200 machine; the in-place lock it was measured
    against, 2.0, was a private map's copy, see PinMethod), or "register", locked where they
    lie, when they lie in host memory already (a pack file on a tmpfs such as /dev/shm: its
    experts are views of the file's map) and a pinned copy would not fit the `available` host
    memory beside them: the host then holds the blobs once, not twice. An in-memory pack
    (MemoryPack, Requant, a GGUF read as a pack) builds each layer's blobs when asked, so they
    lie nowhere yet: locking them in place would take the same host memory as the copy, and
    the host check must count it (the copy)."""
    if available is None or host_blobs <= available:
        return PinMethod()
    path = getattr(pack, "path", None)
    mapped = getattr(pack, "expert_span", None) is not None    # experts are the file's bytes
    resident = mapped and path is not None and os.path.exists(str(path)) and on_tmpfs(path)
    return PinMethod("register") if resident else PinMethod()


def host_pinning(pack, host_blobs: int, pin: bool, cuda: bool, *,
                 say: bool = True) -> tuple[PinMethod, int]:
    """(the PinMethod an engine loads `pack`'s experts with, the host bytes its pinned blobs
    take beyond the pack itself: `host_blobs` for a copy, 0 locked in place), pin_method's
    choice at the host memory available now; the one call both engines (strata.engine.prefill,
    strata.engine.distributed's ranks) make before their host-memory check, and `strata plan`
    to report it (`say=False`: no log line of an engine's choice)."""
    method = pin_method(pack, host_blobs, host_available()) if pin and cuda else PinMethod()
    if method.source != "register":
        return method, host_blobs
    if not say:
        return method, 0
    log.info("strata prefill: the pack's experts lie in host memory and a pinned copy (%s) "
             "would not fit beside them: locking them in place", fmt_bytes(host_blobs))
    return method, 0


def _done_future(fn, *args):
    """fn(*args) run now, as a finished Future (the no-overlap path shares _resolve)."""
    from concurrent.futures import Future
    f: Future = Future()
    try:
        f.set_result(fn(*args))
    except BaseException as e:
        f.set_exception(e)
    return f


# While a loading thread runs beside the caller's own Python (imports, Triton's compiles), every
# time one of its copy threads needs the GIL back (a piece done, the next one started, a layer's
# map and registration) it waits for the interpreter's switch interval, 5 ms by default
# (PinMethod.switch says what it is set to meanwhile). Held while any loading thread runs; the
# first holder's value stands.
_switch = {"holders": 0, "saved": None}
_switch_lock = threading.Lock()


def _switch_hold(interval: float) -> None:
    with _switch_lock:
        if _switch["holders"] == 0:
            _switch["saved"] = sys.getswitchinterval()
            sys.setswitchinterval(min(interval, _switch["saved"]))
        _switch["holders"] += 1


def _switch_release() -> None:
    with _switch_lock:
        _switch["holders"] -= 1
        if _switch["holders"] == 0:
            sys.setswitchinterval(_switch["saved"])


def _release(regs: list, maps: list) -> None:
    """Unregister, then unmap: a registered range must be unlocked before its pages go."""
    for r in regs:
        r.close()
    regs.clear()
    for m in maps:
        try:
            m.close()
        except BufferError:   # a tensor still views the map: the OS frees it at exit
            pass
    maps.clear()
