"""Cache slots of per-layer sizes, the loan from the top, and refill (SPEC "Expert cache", "Loan")."""
import pytest
import torch
from hypothesis import example, given, strategies as st

from strata.blob import BlobLayout
from strata.errors import PlanError, StrataError
from strata.memory import CacheLayout, ExpertCache, Loan, synthetic_source
from strata.memory.carve import ALIGN


def _cache(blobs, n_expert, capacity):
    lay = CacheLayout.build(capacity, blobs, n_expert)
    return ExpertCache(lay, synthetic_source(blobs, seed=7), device="cpu")


@given(blobs=st.lists(st.integers(1, 3000), min_size=1, max_size=4), n_expert=st.integers(1, 8),
       capacity=st.integers(0, 40_000), lend_cap=st.floats(0.0, 1.0), frac=st.floats(0.0, 1.0))
@example(blobs=[2560, 3072], n_expert=4, capacity=40_000, lend_cap=0.9, frac=1.0)  # mixed quant
@example(blobs=[100], n_expert=3, capacity=100, lend_cap=1.0, frac=1.0)  # lend the only slot
@example(blobs=[256], n_expert=8, capacity=40_000, lend_cap=0.0, frac=0.0)  # cap 0: empty loan
def test_loan_then_refill_leaves_cache_bytes_identical(blobs, n_expert, capacity, lend_cap, frac):
    cache = _cache(blobs, n_expert, capacity)
    lay = cache.layout
    before = cache.buffer.clone()
    index_before = dict(cache.index)
    need = int(frac * lay.room(lend_cap))
    with Loan(cache, need, lend_cap) as loan:
        assert loan.nbytes >= need and loan.nbytes <= lend_cap * lay.nbytes
        # minimal: one slot fewer would not cover the need
        assert lay.top_bytes(loan.n_slots - 1) < need or loan.n_slots == 0
        # a real view of the cache's top, starting on a slot boundary
        if loan.n_slots:
            assert loan.buffer.data_ptr() == cache.buffer.data_ptr() + loan.offset
            assert loan.offset % ALIGN == 0
        for i in loan.slots:
            assert cache.owner[i] is None and lay.slot_owner[i] not in cache.index
        loan.buffer.fill_(0xA5)   # the prompt path scribbles over the borrowed bytes
    assert torch.equal(cache.buffer, before)
    assert cache.index == index_before


def test_slots_hold_their_own_layers_blob_sizes():
    blobs = {0: 1000, 1: 2600, 2: 512}
    cache = _cache(blobs, 3, 100_000)
    for i, (layer, e) in enumerate(cache.layout.slot_owner):
        assert cache.layout.slot_bytes[i] == blobs[layer]
        assert cache.layout.slot_offset[i] % ALIGN == 0
    assert cache.layout.n_slots == 9   # everything fits: round-robin placed every expert once


def test_room_is_counted_in_bytes_of_the_lent_slots():
    """A cache slot holds its own layer's blob, smaller than max_blob; counting room
    as slots x max_blob undercounts it."""
    blobs = [2_048, 2_560]                           # max_blob 2560, but half the slots are 2048
    lay = CacheLayout.build(10 * 2_560 + 10 * 2_048, blobs, 10)
    n = lay.lendable(0.9)
    assert lay.room(0.9) == lay.top_bytes(n) > n * 2_048
    assert lay.room(0.9) != n * max(blobs)


def test_refill_on_failure_and_expert_set():
    layer_blob = BlobLayout.make(64, 32, "Q8_0")
    blobs = [layer_blob.size] * 2
    cache = _cache(blobs, 8, 12 * layer_blob.size)
    before = cache.buffer.clone()
    es = cache.expert_set(1, layer_blob, 8)
    assert (es.slot_offset >= 0).sum() == 6
    with pytest.raises(RuntimeError):
        with Loan(cache, 3 * layer_blob.size) as loan:
            loan.buffer.zero_()
            assert (cache.expert_set(1, layer_blob, 8).slot_offset >= 0).sum() < 6
            raise RuntimeError("the prompt failed mid-way")
    assert torch.equal(cache.buffer, before)
    assert torch.equal(cache.expert_set(1, layer_blob, 8).slot_offset, es.slot_offset)


def test_loan_over_cap_is_a_plan_error():
    cache = _cache([1000], 10, 10_240)
    with pytest.raises(PlanError, match="room"):
        Loan(cache, cache.layout.nbytes, 0.9)


def test_bad_source_is_clear():
    lay = CacheLayout.build(10_000, [100], 2)
    with pytest.raises(StrataError, match="uint8"):
        ExpertCache(lay, lambda l, e: torch.zeros(100), device="cpu")
    with pytest.raises(StrataError, match="slot holds"):
        ExpertCache(lay, lambda l, e: torch.zeros(99, dtype=torch.uint8), device="cpu")


def test_spare_region_is_lent_before_any_slot():
    """Every expert fits: the rest of the budget is a spare region above the slots. A loan that
    fits in it evicts nothing (a card that holds the whole model streams nothing); a bigger one
    takes the fewest top slots on top of it."""
    cache = _cache([1000, 600], 3, 20_000)
    lay = cache.layout
    top = lay.slot_offset[-1] + lay.slot_bytes[-1]
    assert lay.n_slots == 6 and lay.spare > 0 and lay.nbytes == -(-top // ALIGN) * ALIGN + lay.spare
    before, index_before = cache.buffer.clone(), dict(cache.index)
    with Loan(cache, lay.spare, 0.9) as loan:
        assert loan.n_slots == 0 and loan.nbytes == lay.spare and cache.index == index_before
        loan.buffer.fill_(0xA5)
    assert torch.equal(cache.buffer, before)
    with Loan(cache, lay.spare + 1, 0.9) as loan:
        assert loan.n_slots == 1 and len(cache.index) == 5
    assert torch.equal(cache.buffer, before) and cache.index == index_before
