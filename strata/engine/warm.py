"""The warm-up's dry pass over a few layers (PrefillEngine.warmup).

Which kernel variants a prompt launches follows the chunk's token count and each layer's blob
layout (its formats: the expert GEMM's FMT constexprs, tiles from T), and Triton specializes the
integer arguments that vary with routing (a pass's tile count divisible by 16 or not), not the
layer's index: every layer of one layout on one participant launches the same variants. So the
dry prompt needs to go through only the first `WARM_PER_LAYOUT` layers of each distinct layout on
each participant — two, so the routing-dependent specializations show in both of their forms
with high probability (each layer runs several passes) — at the prompt's own chunk sizes, through
the real plan's loan, carve and ring. A 32K prompt's warm-up then costs two layers' read plus the
one-time load, not a whole chunk.

    subset = warm_layers([p.layers for p in parts], layouts)
    reader = LayerSubset(model, subset)       # model.prefill over those layers only
"""
from __future__ import annotations

from collections.abc import Sequence

WARM_PER_LAYOUT = 2


def warm_layers(part_layers: Sequence[Sequence[int]], layouts: Sequence, per: int = WARM_PER_LAYOUT
                ) -> list[int]:
    """The layers a warm-up reads: per participant (its layers), the first `per` of each
    distinct blob layout, in layer order."""
    out = []
    for layers in part_layers:
        seen: dict = {}
        for l in layers:
            n = seen.get(layouts[l], 0)
            if n < per:
                seen[layouts[l]] = n + 1
                out.append(l)
    return sorted(out)


class LayerSubset:
    """A decoder reading only `layers` (sorted): its chunk goes embed -> those layers -> head,
    each layer exactly as the full model runs it (forward_layers), the KV of the others never
    written. Everything else (check_tokens, new_cache, devices, prefill's chunk loop) is the
    model's own."""

    def __init__(self, model, layers: Sequence[int]):
        self.model = model
        self.layers = sorted(layers)

    def __getattr__(self, name):
        return getattr(self.model, name)

    def prefill(self, *args, **kw):
        # the model's own chunk loop, calling this object's forward_chunk
        return type(self.model).prefill(self, *args, **kw)

    def forward_chunk(self, tokens, cache, provider, *, logits: str = "all", observer=None):
        x = self.model.embed(tokens)
        for l in self.layers:
            x = self.model.forward_layers(x, cache, provider, range(l, l + 1), observer=observer)
        cache.commit(tokens.shape[0])
        return self.model.head(x, logits)
