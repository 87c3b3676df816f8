"""The auto scan against brute force, the fallback, legacy, forced, several participants."""
import math

import pytest
from hypothesis import example, given, strategies as st

from strata.errors import PlanError, StrataError
from strata.memory import CacheLayout, Participant, PromptLayout, RingPolicy, plan_prefill, \
    ring_slots
from strata.memory.ring import RING_MIN
from strata.memory.layout import pass_experts
from strata.memory.ring import ring_cap
from strata.memory.scan import GROW_MIN_TOKENS, LEGACY_CHUNKS, grid, last_fitting
from strata.planning import prompt_layout
from strata.shapes import ModelShape, get_preset

SEED = get_preset("seed-512e")
SMALL = ModelShape(d_model=64, n_expert=16, top_k=4, d_expert=32, n_head=4, n_kv_head=2,
                   head_dim=16)


def part(room_bytes: int, blob: int = 1 << 20, name="CUDA0") -> Participant:
    """A participant whose room (lend cap 1.0) is room_bytes rounded down to whole blobs."""
    return Participant(name, CacheLayout.build(room_bytes, [blob], 1 << 20), 1.0)


def brute_full_ring(lay: PromptLayout, room: int, scan_max: int, full: int):
    fit = [T for T in grid(scan_max) if lay.bytes_needed(T, full) <= room]
    return max(fit) if fit else None


@given(n=st.integers(1, 300), k=st.integers(0, 300))
@example(n=128, k=127)   # 256..32768, everything fits
@example(n=128, k=-1)    # nothing fits: the one extra probe
@example(n=1, k=0)
def test_last_fitting_is_the_largest_prefix_member(n, k):
    chunks = list(range(n))
    calls = []

    def fits(c):
        calls.append(c)
        return c <= k
    got = last_fitting(chunks, fits)
    assert got == (min(k, n - 1) if k >= 0 else None)
    assert len(calls) <= math.ceil(math.log2(n)) + 1


@given(room_mib=st.integers(1, 6000), max_blob=st.integers(100_000, 6_000_000),
       scan_max=st.sampled_from([256, 1024, 8192, 32768, 33024]),
       unpinned=st.booleans())
@example(room_mib=1100, max_blob=1_382_400, scan_max=32768, unpinned=False)  # seed Q2_0 ring 384
@example(room_mib=1100, max_blob=2_663_424, scan_max=32768, unpinned=False)  # seed IQ3_S ring 199
@example(room_mib=1100, max_blob=5_222_400, scan_max=32768, unpinned=False)  # seed Q8_0 ring 101
@example(room_mib=6000, max_blob=1_382_400, scan_max=32768, unpinned=False)  # MAX itself fits
@example(room_mib=92, max_blob=100_000, scan_max=32768, unpinned=False)    # only 256 fits: 8 probes
def test_auto_scan_equals_brute_force(room_mib, max_blob, scan_max, unpinned):
    lay = prompt_layout(SEED, max_blob)
    p = part(room_mib << 20)
    full = ring_slots(max_blob, pinned=not unpinned)
    want = brute_full_ring(lay, p.room, scan_max, full)
    n = len(grid(scan_max))
    try:
        plan = plan_prefill(lay, [p], scan_max=scan_max, pinned=not unpinned)
    except PlanError:
        assert want is None
        return
    if want is not None:
        assert plan.rule == "full-ring" and plan.chunk == want and plan.ring == full
        assert plan.probes <= math.ceil(math.log2(n)) + 1
        if scan_max == 32768:
            # the seed's 7 probes for 256..32768; when only 256 fits no bisection probe
            # succeeded and the first chunk is checked once more
            assert plan.probes == (7 if want > 256 else 8)
    else:
        # fallback: as many slots as fit beside the smallest chunk, never below RING_MIN
        r = max([RING_MIN] + [r for r in range(RING_MIN, full + 1)
                              if lay.bytes_needed(256, r) <= p.room])
        assert plan.rule == "fallback" and plan.ring == r < full
        fit = [T for T in grid(scan_max) if lay.bytes_needed(T, r) <= p.room]
        assert plan.chunk == max(fit)
    assert plan.fits and plan.bytes_needed <= plan.room
    assert plan.bytes_needed == lay.bytes_needed(plan.chunk, plan.ring)


def test_seed_rig_numbers():
    # Q2_0, 384-slot ring, 1.1 GiB of room on the seed shape: a full ring and a mid-size chunk.
    plan = plan_prefill(prompt_layout(SEED, 1_382_400), [part(1100 << 20)])
    assert plan.ring == 384 and plan.rule == "full-ring" and plan.probes == 7
    assert plan.chunk % 256 == 0


def test_fallback_floor_and_error():
    lay = prompt_layout(SEED, 1_382_400)
    # room for the smallest chunk and RING_MIN slots only
    need = lay.bytes_needed(256, RING_MIN)
    plan = plan_prefill(lay, [Participant("CUDA0", CacheLayout.build(need, [need], 1), 1.0)])
    assert plan.rule == "fallback" and plan.ring == RING_MIN and plan.chunk == 256
    tiny = Participant("CUDA0", CacheLayout.build(need - 1, [need - 1], 1), 1.0)
    with pytest.raises(PlanError, match=r"needs [\d,]+ B .* room is [\d,]+ B"):
        plan_prefill(lay, [tiny])


def test_several_participants_all_must_fit():
    lay = prompt_layout(SEED, 1_382_400)
    big, small = part(3000 << 20, name="CUDA0"), part(1100 << 20, name="CUDA1")
    a = plan_prefill(lay, [big]).chunk
    b = plan_prefill(lay, [small]).chunk
    both = plan_prefill(lay, [big, small])
    assert both.chunk == min(a, b) < a
    assert [q.name for q in both.participants] == ["CUDA0", "CUDA1"]
    for q in both.participants:
        assert q.fits and q.loan >= q.bytes_needed and q.tail == q.loan - (q.bytes_needed + 255) // 256 * 256


def test_several_participants_fallback_each_own_ring():
    lay = prompt_layout(SEED, 1_382_400)
    r0, r1 = 40, 20
    rooms = [lay.bytes_needed(512, r0), lay.bytes_needed(256, r1)]
    parts = [Participant(f"CUDA{i}", CacheLayout.build(r, [r], 1), 1.0) for i, r in enumerate(rooms)]
    plan = plan_prefill(lay, parts)
    assert plan.rule == "fallback"
    # each its own ring: as many slots as fit beside the smallest chunk on that GPU
    r0_fit = max(r for r in range(RING_MIN, 4096) if lay.bytes_needed(256, r) <= rooms[0])
    assert r0_fit > r0 and [q.ring for q in plan.participants] == [r0_fit, r1]
    assert plan.chunk == 256 and plan.ring == r1


@given(room_mib=st.integers(100, 8000), unpinned=st.booleans())
@example(room_mib=1100, unpinned=False)
def test_legacy_takes_the_first_list_chunk_beside_a_fixed_ring(room_mib, unpinned):
    lay = prompt_layout(SEED, 2_663_424)
    p = part(room_mib << 20)
    ring = 96 if unpinned else 384
    fit = [c for c in LEGACY_CHUNKS if lay.bytes_needed(c, ring) <= p.room]
    try:
        plan = plan_prefill(lay, [p], scan="legacy", pinned=not unpinned)
    except PlanError as e:
        assert not fit and "needs" in str(e) and "room" in str(e)
        return
    assert plan.rule == "legacy" and plan.ring == ring and plan.chunk == fit[0]
    assert plan.probes == LEGACY_CHUNKS.index(fit[0]) + 1


def test_auto_beats_legacy_on_big_blobs():
    """The seed's point: on IQ3_S the byte-budget ring leaves room for a bigger chunk."""
    lay = prompt_layout(SEED, 2_663_424)
    p = part(1600 << 20)
    auto, legacy = plan_prefill(lay, [p]), plan_prefill(lay, [p], scan="legacy")
    assert auto.ring == 199 and legacy.ring == 384
    assert auto.chunk > legacy.chunk


def test_forced_chunk_reports_fit_and_stage():
    lay = prompt_layout(SEED, 1_382_400)
    p = part(1100 << 20)
    ok = plan_prefill(lay, [p], chunk=1000)
    assert ok.rule == "forced" and ok.fits and ok.chunk == 1000 and ok.probes == 1
    bad = plan_prefill(lay, [p], chunk=200_000)
    assert not bad.fits and "needs" in bad.short_of() and "room" in bad.short_of()
    stage = plan_prefill(lay, [p], chunk=40)             # 40 < ceil(512 / 10) = 52
    assert stage.ring == "STAGE" and stage.participants[0].ring == "STAGE"
    assert stage.ring_slots == min(40 * 10, 512, 384)      # routed experts, at most the ring
    forced = RingPolicy(ring=20)                          # STRATA_PREFILL_RING=20
    assert plan_prefill(lay, [p], chunk=40, policy=forced).ring == 20   # wins over STAGE


def test_override_is_the_full_ring_and_never_falls_back():
    lay = prompt_layout(SEED, 1_382_400)
    p = part(1100 << 20)
    with pytest.raises(PlanError, match="STRATA_PREFILL_RING"):
        plan_prefill(lay, [p], policy=RingPolicy(ring=1000))
    plan = plan_prefill(lay, [p], policy=RingPolicy(ring=8))
    assert plan.ring == 8 and plan.rule == "full-ring"


def test_scan_max_validated():
    with pytest.raises(StrataError, match="multiple of 256"):
        plan_prefill(prompt_layout(SEED, 1_382_400), [part(1 << 30)], scan_max=1000)


@given(room_mib=st.integers(600, 9000), max_blob=st.sampled_from([1_382_400, 2_663_424, 5_222_400]),
       n_tokens=st.integers(GROW_MIN_TOKENS, 200_000), scan_max=st.sampled_from([16384, 32768]))
@example(room_mib=5877, max_blob=5_222_400, n_tokens=32768, scan_max=32768)  # seed Q8_0, 32K
@example(room_mib=9000, max_blob=1_382_400, n_tokens=32768, scan_max=32768)  # grows to the cap
@example(room_mib=600, max_blob=5_222_400, n_tokens=GROW_MIN_TOKENS, scan_max=32768)  # fallback
def test_a_long_prompts_ring_grows_into_the_room_its_chunk_leaves(room_mib, max_blob, n_tokens,
                                                                   scan_max):
    """The growth keeps the scan's chunk and probes, and takes the MOST slots (up to the cap)
    that still fit beside that chunk: ring + 1 does not fit, or the ring is at the cap."""
    lay = prompt_layout(SEED, max_blob)
    p = part(room_mib << 20)
    try:
        grown = plan_prefill(lay, [p], scan_max=scan_max, n_tokens=n_tokens)
    except PlanError:
        return
    flat = plan_prefill(lay, [p], scan_max=scan_max, n_tokens=n_tokens,
                        policy=RingPolicy(grow=False))          # STRATA_RING_GROW=0
    assert (grown.chunk, grown.scan_chunk, grown.rule, grown.probes) == \
        (flat.chunk, flat.scan_chunk, flat.rule, flat.probes)
    if flat.rule != "full-ring":           # the fallback's ring is already all that fits
        assert grown.ring == flat.ring and grown.grow_probes == 0
        return
    cap = ring_cap(True)
    assert flat.ring == flat.full_ring <= grown.ring <= max(cap, flat.full_ring)
    # the grown slots are run-ahead: passes keep the full ring's size
    b = grown.participants[0].batch
    assert b == flat.participants[0].batch == pass_experts(flat.ring)
    assert grown.fits and grown.bytes_needed == lay.bytes_needed(grown.chunk, grown.ring, b) <= p.room
    assert grown.ring >= cap or lay.bytes_needed(grown.chunk, grown.ring + 1, b) > p.room
    assert grown.grow_probes <= math.ceil(math.log2(cap + 1)) + 1
    # what the engine carves is the grown ring (one source: the plan's own participant row)
    assert grown.participants[0].ring_slots == grown.ring_slots == grown.ring


def test_short_prompts_and_explicit_rings_keep_the_full_ring():
    lay = prompt_layout(SEED, 5_222_400)
    p = part(9000 << 20)
    full = ring_slots(5_222_400)
    assert plan_prefill(lay, [p], n_tokens=8192).ring == full            # under GROW_MIN_TOKENS
    assert plan_prefill(lay, [p]).ring == full                           # the scan's own plan
    assert plan_prefill(lay, [p], n_tokens=GROW_MIN_TOKENS).ring > full
    assert plan_prefill(lay, [p], n_tokens=32768, chunk=16384).ring == full   # forced
    assert plan_prefill(lay, [p], n_tokens=32768, ring=64).ring == 64         # --ring N
    assert plan_prefill(lay, [p], n_tokens=32768, policy=RingPolicy(grow=False)).ring == full
