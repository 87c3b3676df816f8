"""NaN/Inf in a chunk's hidden state fails the prompt, naming the layer.

A flipped byte in an fp16 block scale, or a model that overflows in its dtype, turns a prompt's
logits into NaN while everything "works". The guard marks, on the device and without a host
sync, whether each layer's input to the experts and the experts' output are finite (one
`aminmax` reduction each per layer: NaN propagates through min/max and ±Inf shows in them, and
no [T, D] temporary is made; into a bool [L, 2] flag tensor per device). `check()` reads the flags
on the host and, if any is set, raises `NonFiniteError` naming the first bad layer and its chunk;
the engine's failure path then restores the cache as for any failed prompt.

When the host reads them is the guard's one choice:
- by default at the end of each chunk (its last layer_done): one sync per chunk, inside the
  chunk's layers (a caller that syncs per chunk anyway, e.g. the pipeline's ranks);
- `FiniteGuard(defer=True)` (the streaming engine): each chunk's flags get a tensor of their own
  and the caller's `check()` after the prompt reads them all in one host read per device, so no
  chunk's layers wait on the device (a NaN in chunk c still fails the prompt, naming chunk c).

    guard = FiniteGuard()
    model = load_model(pack, ffn=guard.wrap(expert_ffn(name)))
    model.prefill(tokens, provider, observer=guard.begin(model.shape.n_layer))
"""
from __future__ import annotations

import torch

from strata.errors import StrataError


class NonFiniteError(StrataError):
    """A chunk's hidden state went NaN/Inf; names the layer."""


class FiniteGuard:
    def __init__(self, *, defer: bool = False):
        self.defer = defer
        self._pending: list[tuple[tuple[int, int], dict]] = []   # deferred: (chunk, flags)
        self.layer: int | None = None
        self.n_layer = 0
        self.flags: dict[torch.device, torch.Tensor] = {}
        self._first = False
        self._y: torch.Tensor | None = None
        self._chunk = (0, 0)

    def wrap(self, ffn):
        """The expert FFN, marking its input (once per layer) and remembering its output."""
        def guarded(x, topk_ids, topk_w, experts, **kw):
            y = ffn(x, topk_ids, topk_w, experts, **kw)
            if self.layer is not None:
                if self._first:
                    self._mark(x, 0)
                    self._first = False
                self._y = y
            return y
        guarded.__name__ = getattr(ffn, "__name__", "ffn")
        return guarded

    def begin(self, n_layer: int) -> "FiniteGuard":
        """Arm the guard for a prompt through a model of n_layer layers; returns itself, the
        observer to hand the model's prefill (strata.models.observe.ForwardObserver)."""
        self.n_layer, self.flags, self._start = n_layer, {}, 0
        self.layer, self._y, self._pending = None, None, []
        return self

    def _mark(self, t: torch.Tensor, which: int) -> None:
        f = self.flags.get(t.device)
        if f is None:
            f = self.flags[t.device] = torch.zeros(self.n_layer, 2, dtype=torch.bool,
                                                   device=t.device)
        # min and max propagate NaN and hold any ±Inf: two scalars, no [T, D] temporary
        mn, mx = torch.aminmax(t)
        f[self.layer, which].logical_or_(~(torch.isfinite(mn) & torch.isfinite(mx)))

    # -- the model's observer hooks: routed (before the layer's experts), layer_done (after)
    def routed(self, layer: int, topk_ids: torch.Tensor, topk_w: torch.Tensor) -> None:
        if layer == 0:                                   # a new chunk
            self._chunk = (self._start, int(topk_ids.shape[0]))
            if self.defer:   # the last chunk's flags wait for check(): a fresh set for this one
                self.flags = {}
            for f in self.flags.values():
                f.zero_()
        self.layer, self._first, self._y = layer, True, None

    def layer_done(self, layer: int, x: torch.Tensor) -> None:
        if self._y is not None:
            self._mark(self._y, 1)
        self.layer, self._y = None, None
        if layer == self.n_layer - 1:                    # the chunk's last layer
            self._start += self._chunk[1]
            if self.defer:
                self._pending.append((self._chunk, self.flags))
            else:
                self.check()

    def check(self) -> None:
        """Read the flags (the chunks still pending, deferred; else the current chunk's): one
        host read per device; raises NonFiniteError naming the first bad chunk and layer."""
        chunks = self._pending if self.defer else [(self._chunk, self.flags)]
        self._pending = []
        devices = {d for _, fl in chunks for d in fl}
        host = {d: torch.stack([fl[d] for _, fl in chunks if d in fl]).cpu() for d in devices}
        seen = dict.fromkeys(devices, 0)
        for chunk, fl in chunks:
            for d in fl:
                f = host[d][seen[d]]
                seen[d] += 1
                if bool(f.any()):   # a host tensor: no device read
                    l, which = (int(v) for v in torch.nonzero(f)[0])
                    self._raise(chunk, l, which)

    def _raise(self, chunk: tuple[int, int], l: int, which: int) -> None:
        start, n = chunk
        what = "the hidden state entering its experts" if which == 0 else "its experts' output"
        raise NonFiniteError(
            f"layer {l}: {what} is NaN/Inf in the chunk of tokens {start}..{start + n - 1}; "
            f"the prompt failed and the cache was restored: check the pack with `strata "
            f"verify PACK`, or try --dtype float32")

