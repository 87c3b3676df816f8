"""The cache's batched fill (queued copies, one wait) loads what slot-by-slot blocking copies do."""
import pytest
import torch

from strata.memory.cache import CacheLayout, ExpertCache, synthetic_source

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("progress", [False, True])
def test_batched_fill_equals_slot_by_slot(device, progress):
    blobs = [1000, 3000, 700]              # mixed sizes: unaligned ends, padding between slots
    layout = CacheLayout.build(20_000, blobs, n_expert=6)
    src = synthetic_source(blobs, seed=3)
    one = ExpertCache(layout, src, device, fill=False)
    for i in range(layout.n_slots):
        one.fill_slot(i)
    many = ExpertCache(layout, src, device, progress=progress)
    assert torch.equal(one.buffer.cpu(), many.buffer.cpu())
    assert many.index == one.index and many.owner == one.owner


def test_refilling_some_slots_restores_them_only():
    blobs = [512, 512]
    layout = CacheLayout.build(8192, blobs, n_expert=8)
    cache = ExpertCache(layout, synthetic_source(blobs), "cpu")
    want = cache.buffer.clone()
    top = list(range(layout.n_slots - 3, layout.n_slots))
    for i in top:
        cache.slot_view(i).fill_(0)
        cache.evict_slot(i)
    cache.fill(top)
    assert torch.equal(cache.buffer, want) and len(cache.index) == layout.n_slots
