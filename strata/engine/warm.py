"""The warm-up's dry pass over a few layers (PrefillEngine.warmup).

Which kernel variants a prompt launches follows the chunk's token count and each layer's blob
layout (its formats: the expert GEMM's FMT constexprs, tiles from T), and Triton specializes the
integer arguments that vary with routing (a pass's tile count divisible by 16 or not), not the
layer's index: every layer of one layout (and one attention kind and window: a hybrid's linear
and full layers launch different kernels) on one participant launches the same variants. So the
dry prompt needs to go through only the first `WARM_PER_LAYOUT` layers of each distinct layout on
each participant — two, so the routing-dependent specializations show in both of their forms
with high probability (each layer runs several passes) — at the prompt's own chunk sizes, through
the real plan's loan, carve and ring. A 32K prompt's warm-up then costs two layers' read plus the
one-time load, not a whole chunk.

    subset = warm_layers([p.layers for p in parts], layouts)
    reader = LayerSubset(model, subset)       # model.prefill over those layers only

The attention is the exception: its launches follow the prompt's length, not only the chunk's.
A chunk at position P attends a prefix of P tokens (host-staged, then resident), and with int8
KV a prefix longer than the expansion scratch's R rows is cut into pieces, one launch each: a
first launch that stores the softmax state, middle ones that carry it, a last one that attends
the chunk and normalizes (strata.kernels.attention.scratch), each with its expansions; their
lengths are integer arguments Triton specializes (1, a multiple of 16, other). A two-chunk dry
prompt sees a prefix of at most one chunk: a 131,072-token prompt in chunks of 32,768 (int8,
32,768 resident) has prefixes of 64K and 96K host-staged tokens in its last two chunks, three
and two launches each, variants a 64K dry prompt never launches. So the dry prompt's KV is a
`WarmKV`: at each attention it reads, it first probes every chunk of the real prompt that has
this chunk's size — the real prompt's prefix (host part over the same staging buffer, laid out
for the real prompt's host count; resident part), this chunk's own q, k, v, the layer's scratch,
window and sinks — through `chunk_attention` under `probe_launches()`: every launch the real
chunk makes, with its arguments, running one program each (compile and load, not compute).

    kv = WarmKV(..., probe=ProbePlan(n_tokens, chunk, resident), stage_bufs=stages)
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from strata.models.kv import PromptKV, layer_kv_tokens
from strata.models.packed import packed_head

WARM_PER_LAYOUT = 2


def dry_tokens(n_tokens: int, chunk: int) -> int:
    """The dry prompt's length for a prompt of n_tokens read in chunks of `chunk`: the prompt
    itself when it is one chunk, else a full chunk and then the prompt's last chunk's size (a
    second full one when it divides): the chunk sizes the prompt reads, each after cached
    positions where the prompt has them."""
    return n_tokens if n_tokens <= chunk else chunk + (n_tokens % chunk or chunk)


def warm_layers(part_layers: Sequence[Sequence[int]], layouts: Sequence, per: int = WARM_PER_LAYOUT
                ) -> list[int]:
    """The layers a warm-up reads: per participant (its layers), the first `per` of each
    distinct entry of `layouts` (per layer: what its launches follow, PrefillEngine.warm_kinds:
    the blob layout, the attention's kind and window), in layer order."""
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
        return self.model.head(*packed_head(x, logits, cache))


@dataclass(frozen=True)
class ProbePlan:
    """The real prompt a warm-up stands for: n_tokens in all, read from `start` (the positions
    before it restored from a saved state) in chunks of `chunk`, its KV kept as `resident` says
    (the engine's --kv-resident; None: all), per layer by layer_kv_tokens."""
    n_tokens: int
    chunk: int
    resident: int | None
    start: int = 0

    def starts(self, T: int) -> list[int]:
        """Positions of the real prompt's chunks of T tokens."""
        return [P for P in range(self.start, self.n_tokens, self.chunk)
                if min(self.chunk, self.n_tokens - P) == T]

    def kept(self, window: int = 0) -> tuple[int, int]:
        """(VRAM, host) tokens a layer of this window keeps for the real prompt."""
        return layer_kv_tokens(self.n_tokens, window, self.resident)

    def prefixes(self, T: int) -> Iterator[tuple[int, int]]:
        """A full layer's (host-staged, resident) prefix tokens of every chunk of T tokens, in
        prompt order: a chunk at P sees the host part 0..min(P, host) and the resident part
        after it (the split PromptKV.attend makes)."""
        host = self.kept()[1]
        for P in self.starts(T):
            yield min(P, host), P - min(P, host)


class WarmKV(PromptKV):
    """The dry prompt's PromptKV, probing the real prompt's attention launches (module
    docstring). `stage_bufs`: layer -> the raw staging buffer (the carve's kv_stage, sized for
    the plan's longest prompt); `probes`: chunk_attention calls probed.

    Each full layer's resident store holds the real prompt's resident tokens from the start (the
    dry prompt writes its first ones): a probe reads real-length resident prefixes over it and
    never allocates, and the dry prompt's VRAM is the real prompt's own, which the plan counts
    (sizes.kv_vram of the real prompt; a property test holds it)."""

    def __init__(self, *args, probe: ProbePlan, stage_bufs: dict, **kw):
        super().__init__(*args, **kw)
        self.probe = probe
        self.stage_bufs = stage_bufs
        self.probes = 0
        self._seen: set = set()
        real = probe.kept(0)[0]
        try:
            for l, (w, r) in enumerate(zip(self.windows, self.kept)):
                if not w and r < real and l in self.mine:
                    self.resident[l] = self._store(real, self.devices[l])
        except BaseException:
            self.release()          # the engine's host KV arena is let go
            raise

    def attend(self, layer, q, k, v, into=None, **extra):
        from strata.kernels.attention import chunk_attention, chunk_attention_for
        # the torch twin compiles nothing; a prefix by flash blocks launches no chunk_attention
        # (its merge kernel's variants follow the block's shape, which the dry chunk has)
        if (chunk_attention_for(q.device) is chunk_attention
                and not self.flash_prefix(q, extra)):
            self._probe(layer, q, k, v, extra)
        return super().attend(layer, q, k, v, into=into, **extra)

    def _prefixes(self, layer: int, T: int, device) -> list[list]:
        """The real prompt's prefix segments for its chunks of T tokens at this layer: a full
        layer's staged host part (over the same stage, laid out for the real host count) and
        resident part; a sliding layer's ring (PromptKV._ring: the dry prompt's ring, the real
        one's size when the dry prompt fills it; else none are probed)."""
        W = self.windows[layer]
        ring, held = self.probe.kept(W)
        if W:
            return ([self._ring(layer, P) for P in self.probe.starts(T)]
                    if self.kept[layer] == ring else [])
        split = list(self.probe.prefixes(T))
        host = self._view(self.stage_bufs[layer], held) if held else None
        res = self.resident[layer]
        return [([self._segment(host, h)] if h else []) + ([self._segment(res, r)] if r else [])
                for h, r in split]

    def _probe(self, layer, q, k, v, extra) -> None:
        from strata.kernels.attention import chunk_attention, probe_launches
        scratch = self.scratch.get(layer)
        stage = self.stage_bufs.get(layer)
        sinks = extra.get("sinks")
        # what a launch depends on besides the prefix: layers alike in all of it probe once
        key = (q.shape[0], str(q.device), q.stride(), k.stride(), v.stride(),
               self.windows[layer], extra.get("window", 0),
               None if sinks is None else sinks.dtype,
               None if scratch is None else scratch.k.data_ptr(),
               None if stage is None else stage.data_ptr())
        if key in self._seen:
            return
        self._seen.add(key)
        prefixes = self._prefixes(layer, q.shape[0], q.device)
        with probe_launches():
            for prefix in prefixes:
                chunk_attention(q, k, v, prefix, scratch=scratch, **extra)
                self.probes += 1

    def release(self) -> None:
        super().release()
        self.stage_bufs = {}
