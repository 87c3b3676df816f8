"""A layer's experts from cache slots and ring slots: the streaming expert provider.

Legend: L layers, E experts, K top-k, T tokens, R ring slots, G experts per streamed batch.

Every expert a layer needs is either in the expert cache (a slot of its own layer) or streamed
host->device into a ring slot. The copy lane walks one queue of (layer, expert) items; item i
goes to ring slot i % R once the compute that read that slot's previous item (i - R) is done (a
blob smaller than a slot, a mixed pack's, packed behind the one before it within its pass so
that a run of them goes as one copy: _ring_offsets).
The compute lane runs each layer in passes of at most G experts: the experts the cache holds
first (nothing to wait for), then the streamed ones in queue order, sharing passes, each pass
waiting only for its own copies. With G = R/2 the copies of the next pass land while this one
computes (double buffering), and in stream-all mode the queue holds every layer's missing experts
from the start of the chunk, so copies run ahead across layers (through attention too) as far as
the ring allows.

Modes:
- "stream" (T >= stream_all_min): every expert the cache lacks, of every layer, is queued at
  begin_chunk — a large chunk routes to nearly all of them, and the copies need not wait for
  the router.
- "stage" (small chunks, the resolved ring reads STAGE): after a layer's router, only its routed
  experts that the cache lacks are queued (one device sync per layer to learn which).
The mode is the plan's for the prompt's chunks, and "stage" for any chunk of fewer than
`stage_below` tokens (the plan's stream_all_min): a decode step after a long prompt (one token
routes K experts a layer; streaming whole layers moved every expert a token, 30 GB a token for
qwen3-30b-a3b Q8_0) or a short last chunk.

Host syncs (strata.engine.syncs): in stream mode a chunk's layers and passes are enqueued
without the host ever waiting on the device — the slot tables are built and checked on the host
(every offset 256-byte aligned inside the arena), so the expert FFN runs unchecked (the
workspace is `vouched`: no sync, grid bounded by the launch plan, block counts on the device),
and the routing statistics stay on the device until the prompt has synchronized
(ChunkStats.settle). Stage mode reads each layer's routed experts once (`host_read`): which
experts to copy is the host's decision and layer l's routing depends on layer l-1's output, so it
cannot be one read per chunk; the read waits for the router (attention and routing of that layer,
the copies of earlier layers keep running), then the layer's copies and passes are enqueued. It is
one read per layer, never per pass.

How far ahead the copies run: the ring of R slots is two halves of G = R/2 (pass_experts). The
copy of queue item i is enqueued on the copy lane as soon as the pass that read slot i % R before
it (item i - R) has been enqueued on the compute lane (the copy waits on that pass's event on the
device, not on the host). So while pass n computes from one half, the copies of pass n+1 are
already queued on the copy engine into the other half, and the copies of pass n+2 are queued
behind pass n's event: the copy engine always holds one pass of work ahead of compute and has the
next queued behind it — one pass ahead, two in the queue. More passes ahead would need smaller
passes (G < R/2: more launches and less weight reuse per pass) or a bigger ring (less room for
the chunk); a full pass of slack is what double buffering needs for the copy engine never to idle
while compute runs and compute to wait only when PCIe bounds the pass. In stream mode the queue
holds every layer's missing experts from the chunk's start, so this carries across layers and
through attention; `on_pass`'s `ahead` (strata.engine.observe) reports the copies queued beyond
the pass when it was enqueued.

`passes(layer, topk_ids)` yields the layer's passes (strata.models.provider.Pass): ids of experts
outside a pass read -1 (skipped by the expert FFN); `workspace(layer)` lends the FFN the carve's
buffers and fp32 accumulator and the participant's stream-k scratch. Host order matters: a copy
may only be enqueued once the compute that frees its slot has been enqueued (a stream waiting on
an event recorded later would not wait at all), which `_pump` guarantees.
"""
from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import torch

from strata.blob import ALIGN, BlobLayout
from strata.config import copy_runs
from strata.engine.device import Lane
from strata.engine.host import HostExperts
from strata.engine.stats import ChunkStats
from strata.engine.syncs import host_read
from strata.errors import StrataError
from strata.experts import ExpertSet
from strata.kernels.moe.grouping import routed_mask
from strata.memory.cache import ExpertCache
from strata.memory.layout import pass_experts
from strata.models.provider import LayerWorkspace, Pass

STREAM, STAGE = "stream", "stage"


class StreamingProvider:
    def __init__(self, cache: ExpertCache, host: HostExperts, layouts: Sequence[BlobLayout],
                 ring: torch.Tensor, *, n_expert: int, mode: str = STREAM,
                 layers: Sequence[int] | None = None, batch: int | None = None,
                 lane: Lane | None = None, scratch_alloc=None, buffers=None,
                 observers: Sequence = (), name: str = "", land=None, stage_below: int = 0):
        if ring.dim() != 2 or ring.shape[0] < 1:
            raise StrataError(f"the ring needs at least one slot, got {tuple(ring.shape)}")
        if mode not in (STREAM, STAGE):
            raise StrataError(f"unknown streaming mode {mode!r}")
        self.cache, self.host, self.layouts = cache, host, list(layouts)
        self.arena = cache.buffer
        self.ring = ring                                       # uint8 [R, stride]
        self.R, self.stride = ring.shape
        biggest = max(l.size for l in self.layouts if l is not None)
        if self.stride < biggest:
            raise StrataError(f"ring slots of {self.stride:,} B cannot hold a "
                              f"{biggest:,} B blob")
        base = ring.data_ptr() - self.arena.data_ptr()
        if not 0 <= base <= self.arena.numel() - self.R * self.stride:
            raise StrataError("the ring must be a view inside the expert cache's buffer")
        self.ring_base = base
        # the slot tables vouch for the expert FFN (no host check per pass): every blob the
        # tables can name starts 256-byte aligned inside the arena, checked here once
        offs = [base, self.stride] + list(cache.layout.slot_offset)
        if any(o % ALIGN for o in offs):
            raise StrataError(f"ring and cache slots must start {ALIGN}-byte aligned in the "
                              f"arena (ring at {base}, stride {self.stride}); a layout bug")
        self.E = n_expert
        self.mode = mode                # the prompt's chunks' mode (the plan's ring)
        self.stage_below = stage_below  # chunks of fewer tokens stage (module docstring)
        self.chunk_mode = mode          # this chunk's
        self.layers = list(layers) if layers is not None else list(range(len(self.layouts)))
        # the layers that route to experts (a leading dense layer streams nothing)
        self.moe_layers = [l for l in self.layers if self.layouts[l] is not None]
        self.n_layer = len(self.layouts)
        self.G = pass_experts(self.R, batch)   # the layout sizes its per-pass buffers for it
        self.lane = lane or Lane(self.arena.device)
        self.slot_free = [None] * self.R       # event: compute done with the slot's last item
        self.chunks: list[ChunkStats] = []
        self.scratch_alloc = scratch_alloc     # this participant's stream-k scratch (or None)
        self.buffers = buffers                 # the carve's PromptBuffers (None: allocate)
        self.observers = list(observers)       # pass-level hooks (strata.engine.observe)
        self.name = name
        # strata.planes.Landing when the experts run through the plane GEMM: each ring blob is
        # re-laid once its copy lands (Lane.then), and the passes hand the FFN PlaneSets
        self.land = land
        self.sets = land.sets if land is not None else ExpertSet
        # runs of adjacent blobs as one copy (fewer host calls a read: the 8K read of a 48-layer
        # model is ~6,000 blobs); not where each blob is re-laid as it lands
        self.runs = copy_runs() and land is None

    def _mark(self):
        """A point on the compute lane for the observers: a CUDA event, or perf_counter."""
        return self.lane.event() if self.lane.cuda else time.perf_counter()

    # -- the copy queue ----------------------------------------------------------------------
    def _pump(self) -> None:
        """Enqueue every copy whose ring slot's previous reader is already enqueued: a run of
        queued blobs adjacent in host memory and in the ring as one copy (_run_end)."""
        st = self.chunk_stats
        limit = min(len(self.queue), self.released + self.R)
        while self.issued < limit:
            i = self.issued
            layer, e = self.queue[i]
            src = self.host.blob(layer, e)
            n = src.numel()
            j = self._run_end(i, limit, n)
            run = self.host.run(layer, e, j - i) if j - i > 1 else None
            off = self.offsets[i]
            if run is not None:   # blobs back to back in the ring: one copy of (j - i) blobs
                src, dst = run, self.arena[off:off + (j - i) * n]
            else:
                j, dst = i + 1, self.arena[off:off + n]
            # the run's slots were last read in queue order, so the last slot's reader is the
            # latest of them (compute-lane events fire in order)
            start, done = self.lane.copy_into(dst, src, after=self.slot_free[(j - 1) % self.R])
            ready = done
            if self.land is not None:   # re-lay the landed blob beside the next copies
                ready = self.lane.then(done, lambda dst=dst, layer=layer: self.land(dst, layer))
            self.ready.extend([ready] * (j - i))
            st.copy_marks.append((start, done))
            for o in self.observers:
                o.on_copy(self.name, layer, e, src.numel(), start, done, count=j - i)
            st.bytes_streamed += src.numel()
            st.copies += j - i
            st.copy_ops += 1
            self.issued = j

    def _run_end(self, i: int, limit: int, nbytes: int) -> int:
        """The end of the run of queue entries from i that one copy can carry: the same layer's
        next experts, adjacent rows of its host blobs that lie back to back in the ring
        (_ring_offsets: whole slots, or a smaller blob's packed group), and no further than the
        pass that copy i belongs to (a pass waits for its last copy: a run into the next pass
        would hold it back). i + 1 without runs (the STRATA_COPY_RUNS knob, or a relayout
        landing each blob); the host may still refuse a run whose blobs are not one block
        (HostExperts.run)."""
        if not self.runs:
            return i + 1
        layer, e = self.queue[i]
        j = i + 1
        while (j < limit and j not in self.cuts and self.queue[j] == (layer, e + j - i)
               and self.offsets[j] == self.offsets[j - 1] + nbytes):
            j += 1
        return j

    def _ring_offsets(self, a: int, b: int, nbytes: int, pass_of) -> list[int]:
        """The arena offsets of queue entries a..b-1 (one layer's streamed blobs of `nbytes`):
        entry i's ring slot i % R, except that, where copies run, a blob smaller than a slot
        is packed behind the one before it in its group: the entries of one pass, consecutive
        experts, slots that do not wrap. A group's blobs then lie back to back from its first
        slot (one copy carries them, as whole slots' blobs do), each inside the group's own
        slots at or before its own slot, whose last readers were read by one pass: so the slot
        events (a copy waits for its last slot's previous reader) still order every byte."""
        if not (self.runs and nbytes < self.stride and nbytes % ALIGN == 0):
            return [self.ring_base + (i % self.R) * self.stride for i in range(a, b)]
        out, g = [], a
        for i in range(a, b):
            if (i == a or i % self.R == 0 or pass_of(i) != pass_of(i - 1)
                    or self.queue[i][1] != self.queue[i - 1][1] + 1):
                g = i                                  # a new group starts at its own slot
            out.append(self.ring_base + (g % self.R) * self.stride + (i - g) * nbytes)
        return out

    def _queue_layer(self, layer: int, experts) -> None:
        """Queue the layer's experts the cache lacks and cut the layer into passes of at most G
        experts: the cached ones first (no copy to wait for), then the streamed ones in queue
        order, sharing passes — a layer with c cached and s streamed experts runs in
        ceil((c + s) / G) passes. All its passes' slot tables go to the device at once."""
        a = len(self.queue)
        self.queue.extend((layer, e) for e in experts if (layer, e) not in self.cache.index)
        b = len(self.queue)
        members = [(e, off, None) for e, off in self.cached_list[layer]]
        c = len(members)    # member m (cached first, then the queue's) runs in pass m // G
        offs = self._ring_offsets(a, b, self.host.blob(layer, 0).numel(),   # what _pump copies
                                  lambda i: (c + i - a) // self.G)
        self.offsets.extend(offs)
        members += [(self.queue[i][1], offs[i - a], i) for i in range(a, b)]
        n_pass = -(-len(members) // self.G)
        # the table is filled as Python lists and becomes a tensor once: an element assignment
        # into a tensor costs microseconds, E of them a layer before the first copy is issued
        rows = [[-1] * self.E for _ in range(max(n_pass, 1))]
        streamed = []   # per pass: (first, last + 1) queue indices it streams, or None
        for k in range(n_pass):
            group = members[k * self.G:(k + 1) * self.G]
            for e, off, _ in group:
                rows[k][e] = off
            idx = [i for _, _, i in group if i is not None]
            streamed.append((idx[0], idx[-1] + 1) if idx else None)
            if idx:   # a copy run stops where a pass's copies end (_run_end)
                self.cuts.add(idx[-1] + 1)
        tab = torch.tensor(rows, dtype=torch.int64, pin_memory=self.lane.cuda)
        self.pass_tables[layer] = (tab.to(self.arena.device, non_blocking=True), streamed)

    # -- provider protocol -------------------------------------------------------------------
    def begin_prompt(self, n_tokens: int, chunk: int) -> None:
        pass  # the engine borrowed the loan and carved the ring before building this provider

    def end_prompt(self, ok: bool) -> None:
        pass  # the engine drains the copy lane and refills the loan, failed or not

    def stats(self) -> dict:
        return {"bytes_streamed": sum(c.bytes_streamed for c in self.chunks),
                "cache_hits": sum(c.cache_hits for c in self.chunks),
                "routed": sum(c.routed for c in self.chunks)}

    def begin_chunk(self, start: int, n_tokens: int) -> None:
        self.chunk_mode = STAGE if n_tokens < self.stage_below else self.mode
        self.chunk_stats = ChunkStats(start=start, tokens=n_tokens, mode=self.chunk_mode,
                                      layers=self.moe_layers)
        self.queue: list[tuple[int, int]] = []
        self.offsets: list[int] = []  # each queue entry's arena offset (_ring_offsets)
        self.cuts: set[int] = set()   # queue indices where a pass's copies end
        self.ready: list = []
        self.pass_tables: dict[int, tuple[torch.Tensor, list]] = {}
        self.issued = self.released = 0
        dev = self.arena.device
        # Cached experts of each layer (the loan has already evicted what it borrowed).
        cached = [[-1] * self.E for _ in range(self.n_layer)]
        self.cached_list: dict[int, list[tuple[int, int]]] = {l: [] for l in self.moe_layers}
        for (layer, e), slot in sorted(self.cache.index.items()):
            off = self.cache.layout.slot_offset[slot]
            cached[layer][e] = off
            if layer in self.cached_list:
                self.cached_list[layer].append((e, off))
        self.cached_offsets = torch.tensor(cached, dtype=torch.int64)     # [L, E]
        self.routed = torch.zeros(self.n_layer, self.E, dtype=torch.bool, device=dev)
        self.chunk_stats.pending = (self.routed, self.cached_offsets >= 0)   # read in settle()
        if self.observers:
            mark = self._mark()
            for o in self.observers:
                o.on_chunk(self.name, start, n_tokens, mark)
        if self.chunk_mode == STREAM:   # the first copies go out before later layers queue
            for layer in self.moe_layers:
                self._queue_layer(layer, range(self.E))
                self._pump()
        self._pump()

    def begin_layer(self, layer: int) -> None:
        if self.observers:
            self.layer_begin = self._mark()

    def workspace(self, layer: int) -> LayerWorkspace:
        """What the expert FFN of `layer` borrows from this participant: the carve's workspace
        ("h", "yk", and "wdec" for the decoded FFN) and fp32 accumulator ("moe_out") instead of
        fresh allocations, and the stream-k scratch allocator (ordinary pool, or the slab over
        the loan's tail). The passes always sum in fp32: a layer may take several."""
        if self.buffers is None:
            return LayerWorkspace(scratch_alloc=self.scratch_alloc, vouched=True)
        b = self.buffers
        bufs = {"h": b["h"], "yk": b["yk"]}
        if b.bufs.get("wdec") is not None:   # the "decoded" FFN's per-pass bf16 experts
            bufs["wdec"] = b["wdec"].view(-1)
        # vouched: the tables are built and checked on the host (see the module docstring)
        dense, xn = b.bufs.get("dense_gu"), b.bufs.get("xn")
        return LayerWorkspace(accumulator=b["moe_out"], buffers=bufs,
                              scratch_alloc=self.scratch_alloc, vouched=True,
                              dense=None if dense is None else dense.view(-1),
                              xn=None if xn is None else xn.view(-1))

    def passes(self, layer: int, topk_ids: torch.Tensor) -> Iterator[Pass]:
        lay = self.layouts[layer]
        E = self.E
        used = routed_mask(topk_ids, E)                                         # [E] bool
        self.routed[layer] |= used
        if self.chunk_mode == STAGE:
            with host_read("stage: the layer's routed experts"):               # one per layer
                routed = torch.nonzero(used).flatten().tolist()
            self._queue_layer(layer, routed)
            self._pump()
        tables, streamed = self.pass_tables[layer]
        for n, span in enumerate(streamed):
            marks = None
            if span is not None:   # wait for this pass's copies only (the copy lane is in order)
                marks = self.lane.wait(self.ready[span[1] - 1])
                if marks is not None:
                    self.chunk_stats.wait_marks.append(marks)
            begin = self._mark() if self.observers else None
            ahead = self.issued - (span[1] if span is not None else self.released)
            offs = tables[n]                             # [E]: cache or ring slot, -1 elsewhere
            ids = torch.where((offs >= 0)[topk_ids], topk_ids, -1)
            yield Pass(self.sets(self.arena, offs, lay), ids, last=n == len(streamed) - 1)
            done = None
            if self.observers:
                done = self._mark()
                for o in self.observers:
                    o.on_pass(self.name, layer, n, begin, done, marks, ahead=ahead)
            if span is not None:   # the pass's compute is enqueued: its slots free once it ran
                done = done if self.lane.cuda and done is not None else self.lane.event()
                for i in range(*span):
                    self.slot_free[i % self.R] = done
                self.released = span[1]
                self._pump()

    def end_layer(self, layer: int) -> None:
        if self.observers:
            end = self._mark()
            for o in self.observers:
                o.on_layer(self.name, layer, getattr(self, "layer_begin", end), end)

    def end_chunk(self) -> None:
        if self.issued != len(self.queue):
            raise StrataError(f"streaming ended a chunk with {len(self.queue) - self.issued} "
                              f"copies never issued; a layer was skipped")
        # the routing statistics stay on the device: ChunkStats.settle reads them once the
        # prompt has synchronized (a read here would drain the lanes between chunks)
        self.chunks.append(self.chunk_stats)


class SplitProvider:
    """Several participants' providers behind one: each layer goes to the GPU that holds it."""

    def __init__(self, providers: list[StreamingProvider]):
        self.providers = providers
        self.n_layer = providers[0].n_layer
        self.owner = {l: p for p in providers for l in p.layers}

    def begin_prompt(self, n_tokens: int, chunk: int) -> None:
        for p in self.providers:
            p.begin_prompt(n_tokens, chunk)

    def end_prompt(self, ok: bool) -> None:
        for p in self.providers:
            p.end_prompt(ok)

    def stats(self) -> dict:
        per = [p.stats() for p in self.providers]
        return {k: sum(d[k] for d in per) for k in per[0]}

    def begin_chunk(self, start: int, n_tokens: int) -> None:
        for p in self.providers:
            p.begin_chunk(start, n_tokens)

    def begin_layer(self, layer: int) -> None:
        self.owner[layer].begin_layer(layer)

    def workspace(self, layer: int) -> LayerWorkspace:
        return self.owner[layer].workspace(layer)

    def passes(self, layer: int, topk_ids: torch.Tensor) -> Iterator[Pass]:
        return self.owner[layer].passes(layer, topk_ids)

    def end_layer(self, layer: int) -> None:
        self.owner[layer].end_layer(layer)

    def end_chunk(self) -> None:
        for p in self.providers:
            p.end_chunk()
