"""Every environment knob strata reads, in one place.

| variable              | meaning                                                                 | default |
|-----------------------|-------------------------------------------------------------------------|---------|
| STRATA_PREFILL_RING   | force the streamed ring to N slots (N >= 1), overriding the resolved count | unset |
| STRATA_PF_FUSED       | 1: fused path (one launch per layer over all experts, fused ring budget)   | unset (fused only for non-native packs) |
| STRATA_MMQ_SLAB       | 1: stream-k fixup scratch comes from the loan's tail (SlabPool)            | unset = 0 = off |
| STRATA_STREAM_ALL_MIN | chunks under N tokens STAGE their routed experts instead of streaming     | ceil(E / K) |
| STRATA_RING_GROW      | 0: a long prompt's ring keeps the full ring (no growth into leftover room) | unset = 1 = grows |
| STRATA_RING_AHEAD     | B > 0: a prompt under 16K runs its ring ahead B bytes a FLOP of layer work | unset = 0 = off |
| STRATA_GC_PAUSE       | 0: leave Python's cyclic GC running during a prompt (the engine pauses it)  | unset = 1 = paused |
| STRATA_COPY_RUNS      | 0: one copy per streamed blob (runs of adjacent blobs go as one copy)       | unset = 1 = runs |
| STRATA_TUNE_CACHE     | 0: fla-core's autotuners time their configs anew in every process            | unset = 1 = kept on disk |
| STRATA_COMMIT         | the commit an experiment records (wins over git: device copies of the tree) | unset |
| TRITON_INTERPRET      | 1: run Triton kernels in the interpreter (set automatically without CUDA)  | auto |

Knobs are read when a plan or a prompt starts (not at import), so tests can set them with
monkeypatch. A malformed value is a StrataError naming the variable and the accepted form.

The ring and slab knobs reach strata.memory as one `RingPolicy` (`ring_policy()`), built here
when a plan or a prompt starts and passed down by the engine, the planner and the CLI: memory
reads no environment.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

from strata.errors import StrataError

if TYPE_CHECKING:
    from strata.memory.ring import RingPolicy

KNOBS = ("STRATA_PREFILL_RING", "STRATA_PF_FUSED", "STRATA_MMQ_SLAB", "STRATA_STREAM_ALL_MIN",
         "STRATA_RING_GROW", "STRATA_RING_AHEAD", "STRATA_GC_PAUSE", "STRATA_COPY_RUNS",
         "STRATA_TUNE_CACHE",
         "STRATA_COMMIT",
         "TRITON_INTERPRET")


def env_int(name: str, *, minimum: int | None = None) -> int | None:
    """The integer value of env var `name`, None when unset or empty; a clear error otherwise."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw.strip(), 10)
    except ValueError:
        raise StrataError(f"{name}={raw!r} is not an integer; set it to a whole number "
                          f"or unset it") from None
    if minimum is not None and value < minimum:
        raise StrataError(f"{name}={value} is below {minimum}; set it to at least {minimum} "
                          f"or unset it")
    return value


def env_flag(name: str) -> bool | None:
    """An on/off knob: None when unset, False for 0, True for any other integer."""
    value = env_int(name)
    return None if value is None else value != 0


def prefill_ring_override() -> int | None:
    return env_int("STRATA_PREFILL_RING", minimum=1)


def ring_ahead() -> float:
    """Bytes of copies per FLOP of a layer's non-expert work a prompt under the growth rule's
    length holds in its ring beyond a pass (strata.memory.scan: the run-ahead rule); 0: off."""
    raw = os.environ.get("STRATA_RING_AHEAD")
    if raw is None or raw.strip() == "":
        return 0.0
    try:
        value = float(raw.strip())
    except ValueError:
        value = float("nan")
    if not value >= 0 or value == float("inf"):
        raise StrataError(f"STRATA_RING_AHEAD={raw!r} is not a byte count per FLOP; set it to a "
                          f"number >= 0 (e.g. 2.3e-4) or unset it")
    return value


def ring_grow() -> bool:
    """Whether a long prompt's ring grows into its chunk's leftover room (strata.memory.scan)."""
    return env_flag("STRATA_RING_GROW") is not False


def pf_fused() -> bool | None:
    return env_flag("STRATA_PF_FUSED")


def mmq_slab() -> bool:
    return bool(env_flag("STRATA_MMQ_SLAB"))


def stream_all_min_override() -> int | None:
    return env_int("STRATA_STREAM_ALL_MIN", minimum=1)


def gc_pause() -> bool:
    """Whether PrefillEngine.run pauses Python's cyclic GC for a prompt (default yes)."""
    flag = env_flag("STRATA_GC_PAUSE")
    return True if flag is None else flag


def copy_runs() -> bool:
    """Whether the streaming provider copies runs of adjacent blobs as one copy (default yes)."""
    return env_flag("STRATA_COPY_RUNS") is not False


def tune_cache() -> bool:
    """Whether fla-core's autotuners keep their choice on disk (Triton's cache, keyed by the
    kernel, the GPU and the tuning key), so a fresh process reuses it instead of timing every
    config again before its first prompt (default yes)."""
    return env_flag("STRATA_TUNE_CACHE") is not False


def ring_policy(*, slab: bool | None = None) -> "RingPolicy":
    """The ring and slab knobs as the RingPolicy strata.memory reads, read now:
    STRATA_PREFILL_RING, STRATA_PF_FUSED, STRATA_STREAM_ALL_MIN, STRATA_RING_GROW,
    STRATA_RING_AHEAD and, unless an
    explicit `slab` (EngineConfig.slab) decides, STRATA_MMQ_SLAB."""
    from strata.memory.ring import RingPolicy   # here: importing config loads no torch
    return RingPolicy(ring=prefill_ring_override(), fused=pf_fused(),
                      stream_all_min=stream_all_min_override(), grow=ring_grow(),
                      slab=mmq_slab() if slab is None else bool(slab), ahead=ring_ahead())
