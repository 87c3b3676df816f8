"""Ring sizing: the byte budget, floor, clamp, ring_cap, the override and STAGE (SPEC "Ring");
the launch choices as a RingPolicy, and strata.config reading it from the environment."""
import pytest
from hypothesis import example, given, strategies as st

from strata import config
from strata.errors import StrataError
from strata.memory import RING_MAX, RING_MIN, STAGE, RingPolicy, chunk_ring, ring_budget, \
    ring_cap, ring_slots, stream_all_min, use_fused
from strata.memory.scan import full_ring
from strata.planning import prompt_layout
from strata.shapes import get_preset

SEED = get_preset("seed-512e")

# The SPEC reference table: (max_blob, native, unfused pinned, unpinned, fused).
TABLE = [
    pytest.param(1_382_400, False, 384, 96, 1024, id="Q2_0-not-native"),
    pytest.param(2_663_424, True, 199, 49, 512, id="IQ3_S-native"),   # fused 531 -> cap 512
    pytest.param(5_222_400, True, 101, 25, 271, id="Q8_0-native"),
]


@pytest.mark.parametrize("max_blob,native,pinned,unpinned,fused", TABLE)
def test_spec_reference_table(max_blob, native, pinned, unpinned, fused):
    assert ring_slots(max_blob, native=native) == pinned
    assert ring_slots(max_blob, pinned=False, native=native) == unpinned
    assert ring_slots(max_blob, fused=True, native=native) == fused


def test_iq3s_fused_is_the_cap_doing_its_job():
    assert ring_budget(fused=True) // 2_663_424 == 531
    assert ring_slots(2_663_424, fused=True, native=False) == 531
    assert ring_slots(2_663_424, fused=True, native=True) == 512


@given(max_blob=st.integers(1, 64 << 20), pinned=st.booleans(), fused=st.booleans(),
       native=st.booleans())
@example(max_blob=1_382_400, pinned=True, fused=False, native=False)   # Q2_0: exactly 384
@example(max_blob=1_382_400, pinned=False, fused=False, native=False)  # Q2_0: exactly 96
@example(max_blob=1_382_400, pinned=True, fused=True, native=False)    # Q2_0 fused: exactly 1024
@example(max_blob=2_663_424, pinned=True, fused=False, native=True)    # IQ3_S: 199 (505.5 MiB)
@example(max_blob=2_663_424, pinned=False, fused=False, native=True)   # IQ3_S unpinned: 49
@example(max_blob=2_663_424, pinned=True, fused=True, native=True)     # IQ3_S fused: 531 capped
@example(max_blob=5_222_400, pinned=True, fused=False, native=True)    # Q8_0: 101 (503.0 MiB)
@example(max_blob=5_222_400, pinned=False, fused=False, native=True)   # Q8_0 unpinned: 25
@example(max_blob=5_222_400, pinned=True, fused=True, native=True)     # Q8_0 fused: 271 < a layer
@example(max_blob=1, pinned=True, fused=True, native=False)            # tiny blob: RING_MAX clamp
@example(max_blob=64 << 20, pinned=False, fused=False, native=True)    # huge blob: RING_MIN floor
def test_ring_within_bounds_and_budget(max_blob, pinned, fused, native):
    slots = ring_slots(max_blob, pinned=pinned, fused=fused, native=native)
    budget = ring_budget(pinned=pinned, fused=fused)
    assert RING_MIN <= slots <= ring_cap(native) <= RING_MAX
    # Never more than the budget, except where the RING_MIN floor forces it.
    assert slots * max_blob <= budget or slots == RING_MIN
    # Tight: one more slot would break the budget, unless a clamp/cap bound it first.
    if RING_MIN < slots < ring_cap(native):
        assert (slots + 1) * max_blob > budget


def test_ring_slots_rejects_nonsense():
    with pytest.raises(StrataError, match="positive"):
        ring_slots(0)


def test_stream_all_min_is_a_function_of_shape(monkeypatch):
    monkeypatch.delenv("STRATA_STREAM_ALL_MIN", raising=False)
    assert stream_all_min(SEED) == 52          # ceil(512 / 10)
    assert stream_all_min(get_preset("qwen3-30b-a3b")) == 16
    assert stream_all_min(SEED, config.ring_policy()) == 52
    assert stream_all_min(SEED, RingPolicy(stream_all_min=300)) == 300
    monkeypatch.setenv("STRATA_STREAM_ALL_MIN", "300")
    assert stream_all_min(SEED) == 52          # memory reads no environment
    assert stream_all_min(SEED, config.ring_policy()) == 300


def _ring(policy: RingPolicy, chunk: int, ring: int | None = None):
    """The ring a chunk runs with, down the planner's path (scan._slots): the override rule,
    the full ring, chunk_ring."""
    override = policy.override(ring)
    full = full_ring(prompt_layout(SEED, 1_382_400), ring=override)
    return chunk_ring(SEED, chunk, full, overridden=override is not None, policy=policy)[0]


def test_the_ring_override_rule_stage_and_override(monkeypatch):
    """RingPolicy.override, the one rule: an explicit ring (--ring N), else the policy's
    (STRATA_PREFILL_RING), else the resolved count."""
    monkeypatch.delenv("STRATA_PREFILL_RING", raising=False)
    monkeypatch.delenv("STRATA_STREAM_ALL_MIN", raising=False)
    policy = config.ring_policy()
    assert policy.override() is None and policy.override(5) == 5
    assert _ring(policy, 51) == STAGE
    assert _ring(policy, 52) == 384
    monkeypatch.setenv("STRATA_PREFILL_RING", "7")       # override wins over STAGE and clamps
    policy = config.ring_policy()
    assert policy == RingPolicy(ring=7) and policy.override() == 7
    assert _ring(policy, 51) == 7
    assert _ring(policy, 4096) == 7
    assert _ring(policy, 4096, ring=5) == 5              # an explicit ring wins over the knob


@pytest.mark.parametrize("bad", ["abc", "0", "-3", "1.5"])
def test_ring_override_validated(monkeypatch, bad):
    monkeypatch.setenv("STRATA_PREFILL_RING", bad)
    with pytest.raises(StrataError, match="STRATA_PREFILL_RING"):
        config.ring_policy()


def test_fused_selection(monkeypatch):
    monkeypatch.delenv("STRATA_PF_FUSED", raising=False)
    assert use_fused(native=True) is False
    assert use_fused(native=False) is True      # non-native packs default to fused
    monkeypatch.setenv("STRATA_PF_FUSED", "1")
    assert use_fused(native=True) is False      # memory reads no environment
    assert use_fused(native=True, policy=config.ring_policy()) is True
    monkeypatch.setenv("STRATA_PF_FUSED", "0")
    assert use_fused(native=False, policy=config.ring_policy()) is False
    assert use_fused(native=True, fused=True, policy=RingPolicy(fused=False)) is True   # explicit

