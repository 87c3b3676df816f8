"""The host-held KV's memory, pinned once per engine: one buffer a full layer, sized for the
engine's longest prompt (its --max-prompt), that every prompt's PromptKV views.

A long prompt keeps a full layer's older tokens in pinned host memory (strata.models.kv.PromptKV).
Each prompt pinned its own: pinning is slow, and torch's pinned cache serves a request only from
a block at least as large, so a prompt whose host part outgrew every earlier one pinned anew (the
likely cause of the 2.06 s set-up of the first question after a 64K document on the H100,
kv_resume-questions-…-3f27780, against 0.1 s for the next ones; unmeasured since). Here each
layer's buffer holds `cap` tokens, cap = the host share of a max_prompt-token prompt
(layer_kv_tokens), laid out part by part ([cap, *part] for each of kv_token_parts: k, v, and
int8's scales; the widest elements first); a prompt of n tokens takes views of the first
held(n) <= cap rows of each part. Its bytes are the plan's own count, sizes.kv_host(max_prompt,
layer) (a test holds them equal), and the memory is checked against the host's once, before the
first pin.

One prompt at a time holds the views (`hold` / `let_go`): a second PromptKV over the same arena
while the first still holds it would share its rows, so it is refused in one line.

    arena = HostKVArena({layer: cap, ...}, parts, pin=True)
    views = arena.take(layer, n)        # [n, *shape] for each part, contiguous, in parts' order
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from strata.errors import StrataError


class HostKVArena:
    """Per full layer, `caps[layer]` tokens of the KV parts `parts` ((token shape, dtype) each,
    kv_token_parts), in host memory (pinned when `pin`), allocated at the first take of a layer
    or by `allocate()`."""

    def __init__(self, caps: Mapping[int, int], parts: Sequence, *, pin: bool):
        self.caps = {l: int(c) for l, c in caps.items() if c > 0}
        self.parts = tuple(parts)
        self.pin = pin
        self.row = [math.prod(shp) * dt.itemsize for shp, dt in self.parts]
        self._bufs: dict[int, torch.Tensor] = {}
        self._holder = None

    def nbytes(self, layer: int) -> int:
        """Bytes of `layer`'s buffer: cap tokens of every part."""
        return self.caps.get(layer, 0) * sum(self.row)

    @property
    def total(self) -> int:
        return sum(self.nbytes(l) for l in self.caps)

    @property
    def allocated(self) -> int:
        return sum(b.numel() for b in self._bufs.values())

    def allocate(self) -> None:
        """Every layer's buffer now (the warm-up's time, not a prompt's)."""
        for l in self.caps:
            self._buf(l)

    def _buf(self, layer: int) -> torch.Tensor:
        b = self._bufs.get(layer)
        if b is None:
            b = self._bufs[layer] = torch.empty(self.nbytes(layer), dtype=torch.uint8,
                                                pin_memory=self.pin)
        return b

    def take(self, layer: int, n: int) -> list[torch.Tensor]:
        """Views [n, *shape] of `layer`'s first n rows of each part (n <= its cap)."""
        cap = self.caps.get(layer, 0)
        if n > cap:
            raise StrataError(f"layer {layer}'s host KV holds {cap:,} tokens (the engine's "
                              f"--max-prompt), not {n:,}")
        if not n:
            return [torch.empty(0, *shp, dtype=dt) for shp, dt in self.parts]
        buf, at, out = self._buf(layer), 0, [None] * len(self.parts)
        # the widest elements first, so each part starts on a multiple of its element size
        for i in sorted(range(len(self.parts)), key=lambda i: -self.parts[i][1].itemsize):
            shp, dt = self.parts[i]
            out[i] = buf[at:at + n * self.row[i]].view(dt).view(n, *shp)
            at += cap * self.row[i]
        return out

    def hold(self, owner) -> None:
        """`owner` (a PromptKV) views the arena until it lets go; refused while another does."""
        if self._holder is not None and self._holder is not owner:
            raise StrataError("the engine's host KV is held by another prompt's KV; read one "
                              "prompt at a time through an engine (release the first one's)")
        self._holder = owner

    def let_go(self, owner) -> None:
        if self._holder is owner:
            self._holder = None
