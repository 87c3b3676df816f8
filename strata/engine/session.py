"""One prompt's hold on the engine's participants, the same for the single-process engine, a
pipeline stage and the warm-up: `PromptSession`.

Per participant (open_share): borrow the loan its ParticipantPlan names and carve the prompt
layout in it (every size read off the plan: `borrow_and_carve` refuses a carve that disagrees),
hand the carve's KV stage and attention scratch to the prompt's KV, publish the slab, build the
streaming provider. For the prompt: its KV (the engine's PromptKV from a factory, else the
model's own cache) over those stages and scratch. After the prompt, whatever happened
(close_shares): drain the lanes, drop the slabs, refill every loan, then release the KV, so the
expert cache ends byte for byte as it began and a failed prompt fails alone.

    with PromptSession(parts, plan.participants, layout, chunk, lend_cap, shape=, host=,
                       layouts=, land=, slab=, observers=,
                       stage_below=plan.stream_all_min) as session:
        session.open()                                  # borrow and carve every share
        cache = session.new_kv(T, make_kv, model, kv)   # make_kv(T, stages) -> PromptKV | None
        ... the prompt reads through session.provider and cache ...
        session.settle(stats)
    session.memory, session.kv_streamed, session.kv_bytes    # what it took, for the result
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from strata.engine.device import Lane
from strata.engine.provider import STAGE as MODE_STAGE
from strata.engine.provider import STREAM as MODE_STREAM
from strata.engine.provider import SplitProvider, StreamingProvider
from strata.engine.scratch import ParticipantScratch
from strata.errors import AllocationError, StrataError
from strata.memory import STAGE, ExpertCache, Loan, PromptLayout
from strata.memory.carve import Carve
from strata.memory.layout import PromptBuffers
from strata.memory.scan import ParticipantPlan
from strata.models.layer_state import carved_scratch
from strata.models.mla_scratch import MLAScratch
from strata.units import fmt_bytes

log = logging.getLogger("strata")


@dataclass
class Part:
    """One participant: a device, the layers it holds, its expert cache and lanes."""
    name: str
    device: torch.device
    layers: range
    participant: object        # strata.memory.scan.Participant (its cache layout, lend cap)
    budget: object             # strata.memory.rig.GpuBudget
    cache: ExpertCache
    lane: Lane
    scratch: ParticipantScratch  # its stream-k fixup scratch (strata.engine.scratch)


@dataclass(frozen=True)
class Borrowed:
    """What one participant actually borrowed and carved for a prompt (read off the Loan and
    the Carve, not the plan), for comparing with the plan's ParticipantPlan."""
    name: str
    loan_slots: int
    loan: int                  # bytes of the loan
    ring_slots: int
    placements: tuple[tuple[str, int, int], ...]   # (name, offset, nbytes) of every buffer
    stop: int                  # the carve's stop: bytes of the loan the layout used
    tail: int                  # bytes the carve left (the slab's tail)


def borrow_and_carve(cache: ExpertCache, layout: PromptLayout, chunk: int, pp: ParticipantPlan,
                     lend_cap: float, loans: list[Loan]
                     ) -> tuple[Carve, PromptBuffers, Borrowed]:
    """Borrow the loan the plan names for this participant and carve its layout: `pp.borrow`
    bytes, then `chunk` tokens beside `pp.ring_slots` ring slots. The loan joins `loans` as soon
    as it exists (the caller refills it, even when the carve fails)."""
    loan = Loan(cache, pp.borrow, lend_cap)
    loans.append(loan)
    carve = loan.carve()
    bufs = layout.carve(carve, chunk, pp.ring_slots, pp.batch)
    tail = carve.tail()
    got = Borrowed(pp.name, loan.n_slots, loan.nbytes, int(bufs.ring.shape[0]),
                   tuple((q.name, q.offset, q.nbytes) for q in bufs.placements), bufs.stop,
                   tail.nbytes)
    if (got.loan_slots, got.stop) != (pp.loan_slots, pp.bytes_needed):
        raise StrataError(f"{pp.name}: the engine borrowed {got.loan_slots} slots and carved "
                          f"{got.stop:,} B but the plan says {pp.loan_slots} slots and "
                          f"{pp.bytes_needed:,} B; the plan and the carve must agree (a bug)")
    return carve, bufs, got


def attn_scratch(bufs, shape):
    """The int8 attention's AttnScratch over a carve's kv_expand_k / kv_expand_v (/ attn_state)
    buffers (strata.planning.KV_EXPAND_BUFS)."""
    from strata.kernels.attention import AttnScratch
    kv = (shape.n_kv_head, shape.head_dim)
    return AttnScratch(bufs["kv_expand_k"].view(-1, *kv), bufs["kv_expand_v"].view(-1, *kv),
                       bufs.bufs.get("attn_state"))


@dataclass
class Share:
    """What a participant holds for one prompt (open_share)."""
    got: Borrowed                                             # what it borrowed and carved
    provider: StreamingProvider
    stages: dict[int, torch.Tensor] = field(default_factory=dict)   # layer -> KV stage
    kv_scratch: dict[int, object] = field(default_factory=dict)     # layer -> AttnScratch
    flash_state: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> attn_flash
    mla_scratch: dict[int, object] = field(default_factory=dict)    # layer -> MLAScratch
    state_scratch: dict[int, dict] = field(default_factory=dict)    # layer -> delta-rule bufs
    proj: dict[int, dict] = field(default_factory=dict)   # layer -> the carve's q, k, v, attn
    hidden: dict[str, torch.Tensor] = field(default_factory=dict)   # "x": the carve's x


def open_share(part, pp: ParticipantPlan, layout: PromptLayout, chunk: int, lend_cap: float,
               loans: list[Loan], *, shape, host, layouts, land, slab: bool, observers=(),
               stage_below: int = 0) -> Share:
    """Borrow and carve participant `part`'s share of a prompt read in chunks of `chunk` (its
    loan joins `loans` at once: close_shares refills it even when this fails), and the
    streaming provider over it. `slab`: the stream-k scratch comes from the carve's tail;
    `stage_below`: chunks of fewer tokens stage their routed experts (the plan's
    stream_all_min; strata.engine.provider)."""
    if pp.scratch_reserve and pp.borrow == pp.bytes_needed:
        log.info("strata prefill mmq: %s has no room to lend %s more for the scratch slab; it "
                 "serves what the tail holds", part.name, fmt_bytes(pp.scratch_reserve))
    carve, bufs, got = borrow_and_carve(part.cache, layout, chunk, pp, lend_cap, loans)
    for o in observers:
        o.on_loan(part, pp.bytes_needed, loans[-1])
    layers = part.layers
    share = Share(got, None)
    if "kv_stage" in bufs.bufs:
        share.stages = {l: bufs["kv_stage"] for l in layers}
    if "kv_expand_k" in bufs.bufs:
        share.kv_scratch = {l: attn_scratch(bufs, shape) for l in layers}
    elif "attn_flash" in bufs.bufs:     # a bf16 prefix by flash blocks (attention/flash_prefix)
        share.flash_state = {l: bufs["attn_flash"] for l in layers}
    if "mla_k" in bufs.bufs:
        share.mla_scratch = {l: MLAScratch.of_carve(bufs) for l in layers}
    elif all(bufs.bufs.get(n) is not None for n in ("q", "k", "v")):
        # a GQA layer projects into them (strata.models.attention.attention), flat views; a
        # gated one (strata.models.qwen3_next) its query and gate into qg, its output into attn
        share.proj = {l: {n: bufs[n].view(-1) for n in ("q", "k", "v", "attn", "qg")
                          if bufs.bufs.get(n) is not None} for l in layers}
    if 0 in layers and bufs.bufs.get("x") is not None:
        # the participant that embeds the chunk: its hidden states in the carve's x (flat)
        share.hidden = {"x": bufs["x"].view(-1)}
    if any(n.startswith("dn_") for n in bufs.bufs):   # linear-attention layers' scratch
        share.state_scratch = {l: carved_scratch(bufs) for l in layers}
    if slab:   # the slab: scratch from this layout's tail (empty: ordinary memory)
        part.scratch.publish(carve.tail())
    share.provider = StreamingProvider(
        part.cache, host, layouts, bufs.ring, n_expert=shape.n_expert,
        mode=MODE_STAGE if pp.ring == STAGE else MODE_STREAM, layers=layers, batch=pp.batch,
        lane=part.lane, scratch_alloc=part.scratch, buffers=bufs, observers=observers,
        name=part.name, land=land, stage_below=stage_below)
    return share


def close_shares(parts, loans: list[Loan]) -> None:
    """After a prompt, read or failed: drain the participants' lanes before the borrowed slots
    are rewritten, drop the scratch slabs (nothing may write into a tail once its slots
    refill), refill every loan, drain again."""
    for part in parts:
        part.lane.sync()
    for part in parts:
        part.scratch.drop()
    for loan in loans:
        loan.refill()
    for part in parts:
        part.lane.sync()


class PromptSession:
    """One prompt's shares of `parts` (each borrows and carves its ParticipantPlan of `pps`,
    in chunks of `chunk`), its provider and its KV; leaving the `with`, whatever happened,
    drains, drops the slabs, refills every loan and releases the KV (module docstring)."""

    def __init__(self, parts, pps, layout: PromptLayout, chunk: int, lend_cap: float, *,
                 shape, host, layouts, land, slab: bool, observers=(), stage_below: int = 0):
        self.parts, self.pps, self.layout, self.chunk = list(parts), list(pps), layout, chunk
        self.stage_below = stage_below            # the plan's stream_all_min (open_share)
        self.lend_cap, self.shape, self.host, self.layouts = lend_cap, shape, host, layouts
        self.land, self.slab, self.observers = land, slab, list(observers)
        self.loans: list[Loan] = []
        self.memory: list[Borrowed] = []          # per participant: what it borrowed and carved
        self.providers: list[StreamingProvider] = []
        self.provider = None                      # what the prompt reads through (open)
        self.stages: dict[int, torch.Tensor] = {}     # layer -> its participant's KV stage
        self.kv_scratch: dict[int, object] = {}       # layer -> AttnScratch of its carve
        self.flash_state: dict[int, torch.Tensor] = {}    # layer -> flash blocks' buffer
        self.mla_scratch: dict[int, object] = {}      # layer -> MLAScratch of its carve
        self.state_scratch: dict[int, dict] = {}      # layer -> delta-rule scratch of its carve
        self.proj: dict[int, dict] = {}               # layer -> its carve's q, k, v (GQA)
        self.hidden: dict[str, torch.Tensor] = {}     # "x": the embedding participant's carve x
        self.kv = None                            # the prompt's KV (new_kv)
        self._engine_kv = False                   # kv is a PromptKV (released on exit)
        self.kv_streamed = 0                      # bytes of host-held KV copied back (on exit)
        self.kv_bytes = (0, 0)                    # (VRAM, host) bytes the KV allocated (on exit)

    def __enter__(self) -> "PromptSession":
        # nothing borrowed yet: open() borrows inside the with, so what it took is refilled
        # on exit even when it fails part way (a pipeline stage catches that failure and keeps
        # its hand-offs going)
        return self

    def open(self, fail_after_layers: int | None = None) -> None:
        """Borrow and carve every participant's share (each carves its own ring: the fallback
        rule may size them apart) and the provider over them. `fail_after_layers`: the
        provider fails with an allocation error after that many layer batches (tests of the
        failure path)."""
        for part, pp in zip(self.parts, self.pps):
            share = open_share(part, pp, self.layout, self.chunk, self.lend_cap, self.loans,
                               shape=self.shape, host=self.host, layouts=self.layouts,
                               land=self.land, slab=self.slab, observers=self.observers,
                               stage_below=self.stage_below)
            self.memory.append(share.got)
            self.stages.update(share.stages)
            self.kv_scratch.update(share.kv_scratch)
            self.flash_state.update(share.flash_state)
            self.mla_scratch.update(share.mla_scratch)
            self.state_scratch.update(share.state_scratch)
            self.proj.update(share.proj)
            self.hidden.update(share.hidden)
            self.providers.append(share.provider)
        ps = self.providers
        self.provider = ps[0] if len(ps) == 1 else SplitProvider(ps)
        if fail_after_layers is not None:
            self.provider = FailingProvider(self.provider, fail_after_layers)

    def new_kv(self, n_tokens: int, make, model, kv: str):
        """The prompt's KV over the shares' stages and attention scratch: `make(n_tokens,
        stages)` (a PromptKV, or None for the model's own cache of n_tokens in the KV dtype
        `kv`, its MLA attention working in the carve)."""
        cache = make(n_tokens, self.stages)
        self._engine_kv = cache is not None
        self.kv = cache         # released at exit whatever fails after this
        if cache is not None:
            cache.scratch = self.mla_scratch if self.shape.mla else self.kv_scratch
            cache.flash_state = self.flash_state
        else:
            cache = model.new_cache(capacity=n_tokens, kv=kv)
            if self.shape.mla:
                cache.scratch = self.mla_scratch
        states = getattr(cache, "states", None)   # linear-attention layers' recurrent state
        if states is not None:                      # computes in the carve's delta-rule scratch
            states.scratch = self.state_scratch
        cache.proj = self.proj      # the GQA projections' carve (strata.models.attention)
        cache.hidden = self.hidden  # the chunk's hidden states (MoeDecoder.forward_chunk)
        self.kv = cache
        return cache

    def settle(self, stats) -> None:
        """The read chunks' timings, settled into `stats.chunks` (after the prompt's sync)."""
        for pr in self.providers:
            for c in pr.chunks:
                c.settle()
            stats.chunks.extend(pr.chunks)

    def __exit__(self, *exc) -> None:
        try:
            close_shares(self.parts, self.loans)
        finally:
            kv = self.kv
            if kv is not None:
                self.kv_bytes = (kv.vram_bytes, kv.host_bytes)
                if self._engine_kv:
                    self.kv_streamed = kv.streamed
                    kv.release()      # the resident and the pinned host KV go with the prompt
            self.kv = self.provider = None
            # emptied, not rebound: a cache that outlives the prompt (the model's own, kept for
            # decoding) holds these maps, and their views lie in the loan just refilled
            for m in (self.stages, self.kv_scratch, self.mla_scratch, self.flash_state,
                      self.state_scratch, self.proj, self.hidden):
                m.clear()
            self.providers, self.loans = [], []


class FailingProvider:
    """Wraps a provider and raises an allocation failure after n layer batches (tests)."""

    def __init__(self, inner, n: int):
        self.inner, self.left = inner, n
        self.n_layer = inner.n_layer

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def passes(self, layer, topk_ids):
        for item in self.inner.passes(layer, topk_ids):
            if self.left <= 0:
                raise AllocationError("injected allocation failure mid-prompt; the request "
                                      "failed and the cache was refilled")
            self.left -= 1
            yield item
