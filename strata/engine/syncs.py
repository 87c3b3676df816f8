"""Host reads of device data inside a chunk: the declared ones, and a guard that finds the rest.

A host read (`.item()`, `.tolist()`, `bool(t)`, `.cpu()`, `torch.nonzero`, ...) makes the host wait
until the device has run everything queued before it; inside a chunk's layers that stalls the
launch queue, so the copies of the next passes and the next kernels are enqueued late and the
lanes drain. The streaming engine enqueues a chunk's layers without one, except where the design
needs the host to know routing: STAGE mode (small chunks, only the routed experts are copied)
reads each layer's routed experts once (`host_read`). STREAM mode (a chunk past the hit
threshold copies every expert the cache lacks) needs no routing on the host at all.

    with host_read("stage: the layer's routed experts"):   # a declared read
        routed = torch.nonzero(used).flatten().tolist()

    with SyncGuard() as g:        # tests: every undeclared host read made by strata code
        ... a chunk's layers ...
    assert not g.caught, g.report()

`SyncGuard` works without CUDA: it wraps the torch calls that read device data on the host (or
size their output from it) and records each call made from strata's own code (a frame in a
`strata.` module) outside a `host_read` block; on the CPU every tensor counts as a device tensor,
so the guard is stricter than the device. On the GPU, `torch.cuda.set_sync_debug_mode("error")`
is the device's own check; `host_read` lifts it for its block.
"""
from __future__ import annotations

import contextlib
import sys
import threading
from dataclasses import dataclass, field

import torch

_state = threading.local()


def _declared() -> list:
    if not hasattr(_state, "reads"):
        _state.reads = []
    return _state.reads


@contextlib.contextmanager
def host_read(reason: str):
    """A host read the design needs (`reason` says which): SyncGuard counts it instead of
    reporting it, and the CUDA sync debug mode is lifted for the block."""
    stack = _declared()
    stack.append(reason)
    mode = torch.cuda.get_sync_debug_mode() if torch.cuda.is_available() else 0
    if mode:
        torch.cuda.set_sync_debug_mode(0)
    try:
        for g in list(getattr(_state, "guards", ())):
            g.declared.append(reason)
        yield
    finally:
        if mode:
            torch.cuda.set_sync_debug_mode(mode)
        stack.pop()


# (owner, attribute, what it does) of every call the guard wraps
_TENSOR_READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu",
                 "numpy", "nonzero", "unique", "bincount", "masked_select")
_TORCH_READS = ("nonzero", "unique", "bincount", "masked_select", "argwhere")


@dataclass
class Caught:
    call: str
    where: str          # file:line of the strata frame that made it


@dataclass
class SyncGuard:
    """Records every host read of tensor data made by strata code while active (see module doc)."""
    caught: list[Caught] = field(default_factory=list)
    declared: list[str] = field(default_factory=list)

    def __enter__(self) -> "SyncGuard":
        self._saved = []
        for name in _TENSOR_READS:
            self._wrap(torch.Tensor, name)
        for name in _TORCH_READS:
            self._wrap(torch, name)
        self._wrap(torch.Tensor, "to", when=_to_host)
        self._wrap(torch.Tensor, "__getitem__", when=_bool_index)
        self._wrap(torch.Tensor, "__setitem__", when=_bool_index)
        self._wrap(torch, "repeat_interleave", when=_no_output_size)
        self._wrap(torch.Tensor, "repeat_interleave", when=_no_output_size)
        self._wrap(torch.cuda, "synchronize")
        self._wrap(torch.cuda.Event, "synchronize")
        self._wrap(torch.cuda.Stream, "synchronize")
        if not hasattr(_state, "guards"):
            _state.guards = []
        _state.guards.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _state.guards.remove(self)
        for owner, name, fn in reversed(self._saved):
            setattr(owner, name, fn)

    def _wrap(self, owner, name: str, when=None) -> None:
        fn = getattr(owner, name)
        self._saved.append((owner, name, fn))
        guard = self
        label = f"{'Tensor.' if owner is torch.Tensor else owner.__name__ + '.'}{name}"

        def wrapped(*args, **kw):
            if not _declared() and (when is None or when(args, kw)):
                frame = sys._getframe(1)
                mod = frame.f_globals.get("__name__", "")
                if mod.startswith("strata.") and mod != __name__:
                    guard.caught.append(Caught(label, f"{frame.f_code.co_filename}:"
                                                      f"{frame.f_lineno}"))
            return fn(*args, **kw)
        setattr(owner, name, wrapped)

    def report(self) -> str:
        return "; ".join(f"{c.call} at {c.where}" for c in self.caught) or "no host reads"


def _to_host(args, kw) -> bool:
    """Tensor.to(...) onto the CPU from another device (a blocking copy back)."""
    t = args[0]
    dev = kw.get("device")
    for a in args[1:]:
        if isinstance(a, (str, torch.device)):
            dev = a
    return dev is not None and torch.device(dev).type == "cpu" and t.device.type != "cpu"


def _bool_index(args, kw) -> bool:
    """x[mask] / x[mask] = v with a bool tensor: the mask's true count sizes the index."""
    idx = args[1] if len(args) > 1 else None
    items = idx if isinstance(idx, tuple) else (idx,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


def _no_output_size(args, kw) -> bool:
    """repeat_interleave with tensor repeats and no output_size: the repeats' sum sizes it."""
    reps = kw.get("repeats", args[1] if len(args) > 1 else None)
    return isinstance(reps, torch.Tensor) and reps.numel() > 1 and kw.get("output_size") is None
