"""The streamed ring: how many `max_blob`-sized VRAM slots experts stream through.

The ring is a BYTE budget; the slot count is derived from the pack's `max_blob`:

    slots = floor(budget / max_blob), clamped to [RING_MIN, RING_MAX], then bounded by ring_cap(native)

| path              | budget             | why                                                  |
|-------------------|--------------------|------------------------------------------------------|
| unfused, pinned   | 384 x 1,382,400 B  | 384 slots measured on the Q2_0 pack (506.25 MiB)     |
| unfused, unpinned | 96 x 1,382,400 B   | the old rule's pageable-host count, kept in bytes     |
| fused             | 1024 x 1,382,400 B | a layer's ~460 of 512 experts in flight             |

Flooring keeps the ring at or under its budget; the one exception is the RING_MIN floor, which a
pack whose blob exceeds budget/16 hits on purpose (a ring under 16 slots cannot overlap copies).

`chunk_ring` is what a chunk actually runs beside a full ring: a chunk under
`stream_all_min(routing)` tokens does not stream whole layers but stages only its routed experts
("STAGE"), and an override (`--ring N`, `STRATA_PREFILL_RING=N`) wins over both: the planner
(strata.memory.scan) goes through it. `ring_slots` is the pure arithmetic, for tables and
experiments.

The launch choices an experimenter makes (a forced ring, the fused path, the STAGE threshold,
growth, the scratch slab) arrive as one `RingPolicy`: data built from the environment at the edge
(strata.config.ring_policy, when a plan or a prompt starts) and passed down; memory reads no
environment. `RingPolicy.override` is the one ring-override rule.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from strata.errors import StrataError
from strata.memory.sizes import Routing

Q2_0_BLOB = 1_382_400          # the seed-512e Q2_0 blob the budgets were tuned on
BUDGET_PINNED = 384 * Q2_0_BLOB
BUDGET_UNPINNED = 96 * Q2_0_BLOB
BUDGET_FUSED = 1024 * Q2_0_BLOB
RING_MIN = 16                  # below this a ring cannot keep copies ahead of compute
RING_MAX = 1024
RING_CAP_NATIVE = 512          # native packs: the kernels' slot table bound (seed: ring_cap())
STAGE = "STAGE"


@dataclass(frozen=True)
class RingPolicy:
    """The launch choices the ring, the planner and the slab read, as data. The default is every
    rule's own choice (nothing forced); strata.config.ring_policy() reads the STRATA_* knobs."""
    ring: int | None = None            # STRATA_PREFILL_RING: the full ring forced to N slots
    fused: bool | None = None          # STRATA_PF_FUSED: None = fused for non-native packs only
    stream_all_min: int | None = None  # STRATA_STREAM_ALL_MIN: STAGE under N tokens
    grow: bool = True                  # STRATA_RING_GROW: a long prompt's ring grows
    slab: bool = False                 # STRATA_MMQ_SLAB: stream-k scratch from the loan's tail
    ahead: float = 0.0                 # STRATA_RING_AHEAD: run-ahead bytes per FLOP (scan.py)

    def override(self, ring: int | None = None) -> int | None:
        """The ring override: an explicit `ring` (--ring N) wins, else the policy's
        (STRATA_PREFILL_RING), else None (the resolved count)."""
        return ring if ring is not None else self.ring


NO_POLICY = RingPolicy()


def ring_budget(*, pinned: bool = True, fused: bool = False) -> int:
    """The ring's byte budget for this path."""
    if fused:
        return BUDGET_FUSED
    return BUDGET_PINNED if pinned else BUDGET_UNPINNED


def ring_cap(native: bool = True) -> int:
    """The most slots a ring may have: 512 for a native pack, RING_MAX otherwise."""
    return RING_CAP_NATIVE if native else RING_MAX


def ring_slots(max_blob: int, *, pinned: bool = True, fused: bool = False,
               native: bool = True) -> int:
    """Full-ring slot count for a pack whose largest blob is `max_blob` bytes (no env override)."""
    if int(max_blob) <= 0:
        raise StrataError(f"max_blob must be a positive byte count, got {max_blob}")
    slots = ring_budget(pinned=pinned, fused=fused) // int(max_blob)
    slots = min(max(slots, RING_MIN), RING_MAX)
    return min(slots, ring_cap(native))


def use_fused(native: bool, fused: bool | None = None, policy: RingPolicy = NO_POLICY) -> bool:
    """Fused path selection: an explicit flag, else the policy's (STRATA_PF_FUSED), else
    non-native packs."""
    if fused is not None:
        return bool(fused)
    return (not native) if policy.fused is None else policy.fused


def stream_all_min(routing: Routing, policy: RingPolicy = NO_POLICY) -> int:
    """Fewest tokens a chunk needs before it streams whole layers through the ring.

    A chunk of T tokens routes T*K expert slots; under ceil(E / K) tokens it cannot touch every
    expert of a layer even with perfectly spread routing, so streaming a whole layer would copy
    experts nobody uses: such a chunk stages only its routed experts instead. The policy's
    `stream_all_min` (STRATA_STREAM_ALL_MIN=N) overrides it (e.g. to force STAGE in a test or an
    A/B).
    """
    if policy.stream_all_min is not None:
        return policy.stream_all_min
    return math.ceil(routing.n_expert / routing.top_k)


def stage_slots(routing: Routing, chunk: int) -> int:
    """Experts a STAGE chunk can route to in one layer: min(T*K, E)."""
    return min(chunk * routing.top_k, routing.n_expert)


def chunk_ring(routing: Routing, chunk: int, full: int, *, overridden: bool = False,
               policy: RingPolicy = NO_POLICY) -> tuple[int | str, int]:
    """(resolved ring, slots the carve reserves) for a chunk of `chunk` tokens whose full ring
    is `full` slots: the one rule the planner sizes and the engine carves by.

    Under stream_all_min (and not `overridden` by an explicit ring) the ring is STAGE: it carves
    room for the chunk's routed experts, never more than the full ring (it stages in ring-sized
    batches), which keeps bytes_needed monotone in T. Otherwise the full ring."""
    if not overridden and chunk < stream_all_min(routing, policy):
        return STAGE, min(stage_slots(routing, chunk), full)
    return full, full
