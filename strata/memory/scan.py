"""Planning a prompt: the chunk T and the ring, one byte budget borrowed from the expert cache.

Rules (SPEC "Auto scan"):

- full-ring (auto): chunks live on the grid 256, 512, ..., MAX. The scan takes the LARGEST chunk
  that still leaves the full ring (the resolved slot count), found by bisection: bytes_needed is
  monotone in T, so "fits" is a prefix of the grid. 7 probes for 256..32768 (8 when nothing fits),
  one `bytes_needed` call each.
- fallback: when not even the smallest chunk leaves a full ring, each participant takes as many
  ring slots as fit beside the smallest chunk (never below RING_MIN = 16; by bisection, since
  bytes_needed is monotone in the ring), then the scan takes the largest chunk that fits beside
  that ring. If even that does not fit: PlanError naming the bytes needed and the room. (Probes:
  the failed full-ring bisection, a bisection over the ring per participant, then a second
  bisection over the chunk, one call per participant per step.)
- legacy (A/B only): the old rule. Ring fixed at 384 slots (96 unpinned; the fused rule's 1024,
  bounded by ring_cap) taken first, then the first chunk of LEGACY_CHUNKS that fits.
- forced (`--chunk N`): that chunk with the resolved ring; the plan says whether it fits.
- growth (full-ring, a prompt of at least GROW_MIN_TOKENS): the ring then grows into the room the
  prompt's chunk leaves, to the most slots (up to ring_cap) that still fit beside it, by
  bisection (bytes_needed is monotone in the ring; `Plan.grow_probes` counts those calls apart
  from the scan's). Why: between two layers' experts the chunk's attention runs for a time that
  grows with T·(P + T), while copies can run ahead only as far as the ring's free slots; at 32K
  on seed-512e (12 GiB) a layer's ~20 ms of attention outlasts a 101-slot ring's 9.6 ms of
  copies. Shorter prompts keep the full ring: their attention is short and every slot lent to
  the ring is a slot the expert cache no longer holds (seed-512e 8K read 4% slower at 160 slots).
  The grown slots are pure run-ahead: passes keep the full ring's size (`ParticipantPlan.batch`,
  what the carve sizes the per-pass buffers for and the streaming provider batches by), so the
  decode buffer does not grow with the ring (seed-512e 32K on the H200: 49,915 tok/s with passes
  of 50 at 204 slots, 45,255 with passes of half a 154-slot ring, 38,375 with passes of 32).
  STRATA_RING_GROW=0 (`RingPolicy.grow`) turns it off (the A/B); an explicit ring (--ring /
  STRATA_PREFILL_RING) never grows.
- run-ahead (full-ring or forced, a shorter prompt, opt-in: STRATA_RING_AHEAD=B,
  `RingPolicy.ahead`; forced too, so the distributed ranks' agreed chunk keeps the knob): the
  ring grows, as far as the room allows, to a pass plus the slots B bytes per FLOP of a layer's
  non-expert work (`Sizes.layer_work(T)`, from the model) fill. Why: between two layers' passes
  the copy lane runs ahead only as far as the ring's free slots, and where a layer's attention
  and dense GEMMs outlast them it waits. DeepSeek-V3 at 8K (a layer's non-expert work 6.6
  TFLOP) read 11,549 tok/s with 64 slots and passes of 9 against 10,213 at the plan's 18 (H100,
  6e3010d; B = 2.3e-4 gives 62 there and leaves Qwen3.5's and qwen3-30b's rings, measured best,
  as they are); GLM-4.5-Air and Qwen3-235B, which it would grow, are not measured, so it is off
  by default. The passes keep the full ring's size, as under growth.

A prompt shorter than the chunk (`n_tokens`) runs as one chunk of n_tokens: each participant's
ring is re-resolved for that chunk by the same rule (`ring.chunk_ring`), capped at the ring the
participant was planned with (legacy keeps its fixed ring). The plan is then the prompt's own:
what the engine borrows (`borrow`, `loan_slots`) and carves (`ring_slots`, `placements`, ending
at `bytes_needed`) is read off it, never derived again.

The slab's scratch reserve (`scratch_reserve(participant, n_tokens, chunk)`, supplied by whoever
knows the kernel) is borrowed on top of bytes_needed when the lend cap has room for it; otherwise
the loan is bytes_needed alone and the slab serves what the tail holds.

Several participants (one per GPU, each with its own cache, loan and ring): a chunk is taken only
if it fits on every one of them. Room is counted in BYTES of whole cache slots (CacheLayout.room).

The experimenter's choices (STRATA_PREFILL_RING, STRATA_STREAM_ALL_MIN, STRATA_RING_GROW) arrive
as `plan_prefill(policy=RingPolicy)`, read from the environment by the caller (strata.config):
the scan reads no environment.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from strata.errors import PlanError, StrataError
from strata.memory.cache import CacheLayout
from strata.memory.carve import Carve, align_up
from strata.memory.layout import PromptLayout, pass_experts
from strata.memory.loan import LEND_CAP
from strata.memory.ring import (NO_POLICY, RING_MIN, STAGE, RingPolicy, chunk_ring, ring_cap,
                                ring_slots, stream_all_min)
from strata.units import fmt_bytes

GRID = 256
SCAN_MAX = 32768
GROW_MIN_TOKENS = 16384    # prompts from here grow the ring into the chunk's leftover room
AHEAD_RULES = ("full-ring", "forced")   # the rules whose ring runs ahead (STRATA_RING_AHEAD)
LEGACY_CHUNKS = (32768, 16384, 8192, 6144, 4096, 3072, 2048, 1024, 512, 256)
LEGACY_RING_PINNED, LEGACY_RING_UNPINNED, LEGACY_RING_FUSED = 384, 96, 1024


@dataclass(frozen=True)
class Participant:
    """One GPU's share of the rig: its cache (slots of its own layers) and lend cap."""
    name: str
    cache: CacheLayout
    lend_cap: float = LEND_CAP

    @property
    def room(self) -> int:
        return self.cache.room(self.lend_cap)


@dataclass
class ParticipantPlan:
    name: str
    ring: int | str
    ring_slots: int     # slots the carve reserves (a STAGE ring's staging slots)
    ring_bytes: int
    bytes_needed: int
    room: int
    fits: bool
    cache: int          # cache bytes (whole slots)
    cache_slots: int
    loan: int           # bytes of the slots lent for this plan (0 when it does not fit)
    loan_slots: int
    tail: int           # loan - align256(bytes_needed): the SlabPool's tail (Carve.tail)
    batch: int = 0      # experts per pass: the carve's per-pass buffers and the provider's batch
    scratch_reserve: int = 0   # slab bytes asked beyond bytes_needed (0: none)
    borrow: int = 0     # bytes the loan is asked for: bytes_needed (+ scratch_reserve if it fits)
    placements: list[dict] = field(default_factory=list)  # the carve: name, offset, nbytes
    grown: dict[str, int] = field(default_factory=dict)   # dims the carve widened for free


@dataclass
class Plan:
    """A prompt's plan. Top-level ring/byte fields are the binding participant's (least slack);
    `participants` has every GPU's own ring, bytes, room, loan and tail."""
    chunk: int
    ring: int | str     # the resolved ring: slots, or "STAGE"
    ring_slots: int     # slots the carve reserves for it (PromptLayout.carve's `ring`)
    ring_bytes: int
    bytes_needed: int
    room: int
    probes: int
    rule: str           # full-ring | fallback | legacy | forced
    fits: bool
    max_blob: int
    full_ring: int
    stream_all_min: int
    participants: list[ParticipantPlan] = field(default_factory=list)
    scan_chunk: int = 0           # the chunk the rule picked, before a shorter prompt capped it
    n_tokens: int | None = None   # the prompt planned for (None: at least one chunk long)
    grow_probes: int = 0          # bytes_needed calls of the ring's growth (module docstring)
    growth: str = ""              # why the ring grew: "room" (growth), "ahead" (run-ahead)

    def to_dict(self) -> dict:
        return asdict(self)

    def short_of(self) -> str:
        """One line: what the plan needs against its room (for a plan that does not fit)."""
        worst = max(self.participants, key=lambda p: p.bytes_needed - p.room)
        return (f"chunk {self.chunk} with ring {self.ring} needs {worst.bytes_needed:,} B "
                f"({fmt_bytes(worst.bytes_needed)}) but {worst.name} has room for "
                f"{worst.room:,} B ({fmt_bytes(worst.room)})")


def grid(scan_max: int = SCAN_MAX) -> list[int]:
    if scan_max < GRID or scan_max % GRID:
        raise StrataError(f"the scan's MAX must be a multiple of {GRID} and at least {GRID}, "
                          f"got {scan_max}; e.g. --prefill auto:16384")
    return list(range(GRID, scan_max + 1, GRID))


def last_fitting(chunks: list[int], fits) -> int | None:
    """Largest chunk with fits(chunk), by bisection; `fits` must be a prefix of `chunks`.

    ceil(log2(n)) probes, plus one when no probe succeeded (then the first is checked).
    """
    if not chunks:
        return None
    lo, hi, seen = 0, len(chunks) - 1, False
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(chunks[mid]):
            lo, seen = mid, True
        else:
            hi = mid - 1
    if seen or fits(chunks[lo]):
        return chunks[lo]
    return None


class _Probe:
    """layout.bytes_needed with a call counter (the scan's cost)."""

    def __init__(self, layout: PromptLayout):
        self.layout, self.count = layout, 0

    def __call__(self, T: int, ring: int, batch: int | None = None) -> int:
        self.count += 1
        return self.layout.bytes_needed(T, ring, batch)


def full_ring(layout: PromptLayout, *, pinned=True, fused=False, native=True,
              ring: int | None = None, policy: RingPolicy = NO_POLICY) -> int:
    """The resolved full ring: the override (--ring, else the policy's STRATA_PREFILL_RING:
    RingPolicy.override), else ring_slots()."""
    override = policy.override(ring)
    if override is not None:
        return override
    return ring_slots(layout.max_blob, pinned=pinned, fused=fused, native=native)


def _slots(layout: PromptLayout, T: int, full: int, override: int | None = None,
           policy: RingPolicy = NO_POLICY) -> tuple[int | str, int]:
    """(resolved ring, slots carved) for chunk T beside a full ring (ring.chunk_ring)."""
    return chunk_ring(layout.sizes, T, full, overridden=override is not None, policy=policy)


def _for_prompt(layout, rule, chunk, rings, full, override, n_tokens, policy):
    """(chunk, per-participant rings) of a prompt of n_tokens under a plan of `chunk`: a
    shorter prompt is one chunk of n_tokens, each ring re-resolved for it, capped at the ring
    that participant was planned with (legacy: its fixed ring, as planned)."""
    if n_tokens is None or n_tokens >= chunk:
        return chunk, rings
    if rule == "legacy":
        return n_tokens, rings
    return n_tokens, [_slots(layout, n_tokens, full if r == STAGE else int(r), override, policy)
                      for r, _ in rings]


def _borrow(cache: CacheLayout, need: int, extra: int, lend_cap: float) -> int:
    """Bytes to ask of the cache: need + extra when the lend cap has room for both, else need."""
    if extra:
        try:
            cache.slots_for(need + extra, lend_cap)
            return need + extra
        except PlanError:
            pass
    return need


def grows(rule: str, ring, override, n_tokens: int | None,
          policy: RingPolicy = NO_POLICY) -> bool:
    """Whether this plan's ring grows into its chunk's leftover room (module docstring)."""
    return (rule == "full-ring" and ring != STAGE and override is None and n_tokens is not None
            and n_tokens >= GROW_MIN_TOKENS and policy.grow)


def ahead_ring(layout: PromptLayout, T: int, batch: int, policy: RingPolicy = NO_POLICY) -> int:
    """The run-ahead rule's ring for a chunk of T tokens (0 when the policy's `ahead` is 0): a
    pass of `batch` experts plus the slots the copies of policy.ahead bytes per FLOP of a
    layer's non-expert work fill (Sizes.layer_work), which the copy lane can run ahead while
    that work runs (module docstring)."""
    if policy.ahead <= 0:
        return 0
    return batch + math.ceil(policy.ahead * layout.sizes.layer_work(T) / layout.max_blob)


def grown_ring(fits: Callable[[int], bool], slots: int, cap: int) -> int:
    """The most slots in [slots, cap] with fits(slots) (a prefix: bytes_needed is monotone in
    the ring); `slots` itself when it is already at the cap or nothing more fits."""
    if cap <= slots:
        return slots
    return last_fitting(list(range(slots, cap + 1)), fits) or slots


def _finish(layout, participants, probe, chunk, rings, rule, full, *, override=None,
            n_tokens=None, scratch_reserve=None, cap: int | None = None,
            policy: RingPolicy = NO_POLICY) -> Plan:
    scan_chunk = chunk
    chunk, rings = _for_prompt(layout, rule, chunk, rings, full, override, n_tokens, policy)
    grow_probes, growth = 0, ""
    parts = []
    for p, (ring, slots) in zip(participants, rings):
        extra = scratch_reserve(p.name, n_tokens or chunk, chunk) if scratch_reserve else 0
        batch = pass_experts(slots, layout.batch)
        upto, why = None, ""
        if cap is not None and grows(rule, ring, override, n_tokens, policy):
            upto, why = cap, "room"
        elif cap is not None and rule in AHEAD_RULES and ring != STAGE and override is None:
            upto, why = min(cap, ahead_ring(layout, chunk, batch, policy)), "ahead"
        if upto is not None and upto > slots:
            # the slab's reserve keeps its room when it had it beside the full ring
            room = p.room - extra if layout.bytes_needed(chunk, slots, batch) + extra <= p.room \
                else p.room
            before, full_slots = probe.count, slots
            ring = slots = grown_ring(lambda r: probe(chunk, r, batch) <= room, slots, upto)
            grow_probes += probe.count - before
            growth = why if slots > full_slots else growth
        dry = layout.carve(Carve.dry(), chunk, slots, batch)
        placements, need = dry.placements, dry.stop
        room = p.room
        fits = need <= room
        borrow = _borrow(p.cache, need, extra, p.lend_cap) if fits else 0
        n = p.cache.slots_for(borrow, p.lend_cap) if fits else 0
        loan = p.cache.loan_span(n, p.lend_cap)[1] if fits else 0
        ring_bytes = next(q.nbytes for q in placements if q.name == "ring")
        parts.append(ParticipantPlan(
            p.name, ring, slots, ring_bytes, need, room, fits, p.cache.nbytes,
            p.cache.n_slots, loan, n, max(0, loan - align_up(need)) if fits else 0,
            batch, extra, borrow, [{"name": q.name, "offset": q.offset, "nbytes": q.nbytes}
                            for q in placements], dict(dry.grown)))
    binding = min(parts, key=lambda q: (q.room - q.bytes_needed))
    return Plan(chunk=chunk, ring=binding.ring, ring_slots=binding.ring_slots,
                ring_bytes=binding.ring_bytes, bytes_needed=binding.bytes_needed,
                room=binding.room, probes=probe.count - grow_probes, rule=rule,
                fits=all(q.fits for q in parts), max_blob=layout.max_blob, full_ring=full,
                stream_all_min=stream_all_min(layout.sizes, policy), participants=parts,
                scan_chunk=scan_chunk, n_tokens=n_tokens, grow_probes=grow_probes,
                growth=growth)


def plan_prefill(layout: PromptLayout, participants: list[Participant], *, scan: str = "auto",
                 scan_max: int = SCAN_MAX, chunk: int | None = None, pinned: bool = True,
                 fused: bool = False, native: bool = True, ring: int | None = None,
                 n_tokens: int | None = None,
                 scratch_reserve: Callable[[str, int, int], int] | None = None,
                 policy: RingPolicy = NO_POLICY) -> Plan:
    """The plan for this layout on these participants (see the module docstring for the rules).

    `ring`: an explicit ring override (`--ring N`); it wins over the policy's ring
    (STRATA_PREFILL_RING), which wins over the resolved count (RingPolicy.override). `n_tokens`:
    the prompt's length (None: a prompt at least one chunk long). `scratch_reserve(participant
    name, n_tokens, chunk)`: slab bytes to borrow beyond bytes_needed. `policy`: the launch
    choices (strata.config.ring_policy(); the default forces nothing)."""
    if not participants:
        raise StrataError("a plan needs at least one participant (GPU)")
    if n_tokens is not None and n_tokens < 1:
        raise StrataError(f"a prompt needs at least 1 token, got {n_tokens}")
    probe = _Probe(layout)
    override = policy.override(ring)
    full = full_ring(layout, pinned=pinned, fused=fused, native=native, ring=override)
    rooms = [p.room for p in participants]
    prompt = dict(override=override, n_tokens=n_tokens, scratch_reserve=scratch_reserve,
                  policy=policy)

    def fits_all(T: int, slots: int) -> bool:
        need = probe(T, slots)
        return all(need <= r for r in rooms)

    if chunk is not None:
        if chunk < 1:
            raise StrataError(f"--chunk must be at least 1 token, got {chunk}")
        ring, slots = _slots(layout, chunk, full, override, policy)
        probe(chunk, slots)
        return _finish(layout, participants, probe, chunk, [(ring, slots)] * len(participants),
                       "forced", full, cap=ring_cap(native), **prompt)

    if scan == "legacy":
        ring = LEGACY_RING_FUSED if fused else (LEGACY_RING_PINNED if pinned else
                                                 LEGACY_RING_UNPINNED)
        ring = min(ring, ring_cap(native)) if fused else ring
        ring = override if override is not None else ring
        chunks = [c for c in LEGACY_CHUNKS if c <= scan_max]
        for c in chunks:
            if fits_all(c, ring):
                return _finish(layout, participants, probe, c, [(ring, ring)] * len(participants),
                               "legacy", full, **prompt)
        smallest = chunks[-1] if chunks else GRID
        raise PlanError(_nothing_fits(layout, participants, smallest, ring, "legacy"))
    if scan != "auto":
        raise StrataError(f"unknown scan rule {scan!r}; use auto or legacy")

    chunks = grid(scan_max)
    best = last_fitting(chunks, lambda T: fits_all(T, _slots(layout, T, full, override,
                                                             policy)[1]))
    if best is not None:
        ring, slots = _slots(layout, best, full, override, policy)
        return _finish(layout, participants, probe, best, [(ring, slots)] * len(participants),
                       "full-ring", full, cap=ring_cap(native), **prompt)
    if override is not None:
        raise PlanError(_nothing_fits(layout, participants, chunks[0], full,
                                      "STRATA_PREFILL_RING"))

    # Fallback: per participant, the most slots beside the smallest chunk (>= RING_MIN), then
    # the largest chunk that fits beside each participant's own ring. The slots by bisection:
    # a slot costs more than its stride where the passes' buffers grow with the ring (a
    # decoded expert is 2 B a weight beside a 0.56 B Q4_0 blob), so no division counts them.
    smallest = chunks[0]
    slots = list(range(RING_MIN, max(full, RING_MIN) + 1))
    rings = []
    for p in participants:
        r = last_fitting(slots, lambda r, p=p: probe(smallest, r) <= p.room) or RING_MIN
        rings.append((r, r))
    best = last_fitting(chunks, lambda T: all(probe(T, r) <= p.room
                                              for p, (r, _) in zip(participants, rings)))
    if best is None:
        worst = min(zip(participants, rings), key=lambda pr: pr[0].room)
        raise PlanError(_nothing_fits(layout, [worst[0]], smallest, worst[1][0], "fallback"))
    return _finish(layout, participants, probe, best, rings, "fallback", full, **prompt)


def _nothing_fits(layout, participants, chunk, ring, rule) -> str:
    need = layout.bytes_needed(chunk, ring)
    p = min(participants, key=lambda q: q.room)
    return (f"nothing fits ({rule}): chunk {chunk} with a {ring}-slot ring needs {need:,} B "
            f"({fmt_bytes(need)}) but {p.name}'s room is {p.room:,} B ({fmt_bytes(p.room)}, "
            f"lend cap {p.lend_cap} of a {fmt_bytes(p.cache.nbytes)} cache); give the cache more "
            f"VRAM, raise --lend-cap, or lower the ring with STRATA_PREFILL_RING")
