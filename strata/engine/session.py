"""One participant's share of a prompt, the same for the single-process engine and a pipeline
stage: borrow the loan its ParticipantPlan names and carve the prompt layout in it (every size
read off the plan: `borrow_and_carve` refuses a carve that disagrees), hand the carve's KV
stage and attention scratch to the prompt's KV, publish the slab, build the streaming provider;
and after the prompt, whatever happened, drain, drop the slab and refill every loan, so the
expert cache ends as it began.

    share = open_share(part, pp, layout, chunk, lend_cap, loans, shape=, host=, layouts=, ...)
    ... the prompt reads through share.provider ...
    close_shares(parts, loans)            # in a finally
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from strata.engine.provider import STAGE as MODE_STAGE
from strata.engine.provider import STREAM as MODE_STREAM
from strata.engine.provider import StreamingProvider
from strata.errors import StrataError
from strata.memory import STAGE, ExpertCache, Loan, PromptLayout
from strata.memory.carve import Carve
from strata.memory.layout import PromptBuffers
from strata.memory.scan import ParticipantPlan
from strata.models.mla_scratch import MLAScratch
from strata.units import fmt_bytes

log = logging.getLogger("strata")


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
    mla_scratch: dict[int, object] = field(default_factory=dict)    # layer -> MLAScratch


def open_share(part, pp: ParticipantPlan, layout: PromptLayout, chunk: int, lend_cap: float,
               loans: list[Loan], *, shape, host, layouts, land, slab: bool, observers=()
               ) -> Share:
    """Borrow and carve participant `part`'s share of a prompt read in chunks of `chunk` (its
    loan joins `loans` at once: close_shares refills it even when this fails), and the
    streaming provider over it. `slab`: the stream-k scratch comes from the carve's tail."""
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
    if "mla_k" in bufs.bufs:
        share.mla_scratch = {l: MLAScratch.of_carve(bufs) for l in layers}
    if slab:   # the slab: scratch from this layout's tail (empty: ordinary memory)
        part.scratch.publish(carve.tail())
    share.provider = StreamingProvider(
        part.cache, host, layouts, bufs.ring, n_expert=shape.n_expert,
        mode=MODE_STAGE if pp.ring == STAGE else MODE_STREAM, layers=layers, batch=pp.batch,
        lane=part.lane, scratch_alloc=part.scratch, buffers=bufs, observers=observers,
        name=part.name, land=land)
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
