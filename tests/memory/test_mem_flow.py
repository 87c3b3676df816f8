"""The whole memory path on real buffers: cache -> plan -> loan -> carve -> tail -> pool -> refill.

Runs on the CPU here and on the GPU (the `device` fixture); the gpu-marked test checks the device
specifics (CUDA buffers, the check line's CUDA index)."""
import logging

import pytest
import torch

from strata import config
from strata.blob import BlobLayout
from strata.memory import (CacheLayout, ExpertCache, Loan, Participant, RingPolicy, SlabPool,
                           plan_prefill, scratch_allocator, synthetic_source)
from strata.planning import prompt_layout
from strata.shapes import ModelShape

SHAPE = ModelShape(n_layer=4, d_model=64, n_expert=64, top_k=4, d_expert=32, n_head=4,
                   n_kv_head=2, head_dim=16)
# Mixed quantization: layers 0 and 2 Q8_0, layers 1 and 3 BF16 (a bigger blob).
BLOBS = {l: BlobLayout.make(64, 32, "Q8_0" if l % 2 == 0 else "BF16").size for l in range(4)}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for k in ("STRATA_PREFILL_RING", "STRATA_STREAM_ALL_MIN", "STRATA_PF_FUSED",
              "STRATA_MMQ_SLAB"):
        monkeypatch.delenv(k, raising=False)


def run_prompt(device, ring=None, scan_max=2048, scratch=0):
    """One prompt's memory life (`ring`: STRATA_PREFILL_RING's RingPolicy.ring); `scratch`
    extra bytes are borrowed for the pool (slab on)."""
    cache = ExpertCache(CacheLayout.build(2 << 20, BLOBS, SHAPE.n_expert),
                        synthetic_source(BLOBS, seed=3, device=device), device=device)
    before = cache.buffer.clone()
    layout = prompt_layout(SHAPE, max(BLOBS.values()))
    plan = plan_prefill(layout, [Participant("CUDA0", cache.layout)], scan_max=scan_max,
                        policy=RingPolicy(ring=ring))
    assert plan.fits
    pool = SlabPool(device=device)
    with Loan(cache, plan.bytes_needed + scratch) as loan:
        part = plan.participants[0]
        if not scratch:
            assert (loan.n_slots, loan.nbytes) == (part.loan_slots, part.loan)
        carve = loan.carve()
        bufs = layout.carve(carve, plan.chunk, plan.ring_slots)
        assert carve.stop == plan.bytes_needed
        tail = carve.tail()
        assert tail.nbytes == loan.nbytes - carve.stop and tail.view.device == cache.buffer.device
        assert tail.nbytes == part.tail or scratch
        assert tail.address % 256 == cache.buffer.data_ptr() % 256   # tail starts aligned
        pool.publish(tail)
        # the engine writes every buffer; nothing escapes the loan
        for name, t in bufs.bufs.items():
            t.fill_(1)
        bufs.ring.fill_(0xEE)
        if scratch:
            s = pool.alloc(100_000)
            assert tail.address <= s.data_ptr() < tail.address + tail.nbytes
            s.fill_(7)
        pool.drop()     # end of prompt: before the loan refills its slots
    assert pool.tail is None
    assert torch.equal(cache.buffer, before)
    return plan


def test_flow_fallback_ring(device):
    plan = run_prompt(device)
    assert plan.rule == "fallback" and plan.ring >= 16


def test_flow_forced_ring(device):
    plan = run_prompt(device, ring=8)
    assert plan.rule == "full-ring" and plan.ring == 8


def test_flow_with_scratch_in_the_tail(device):
    plan = run_prompt(device, ring=8, scan_max=512, scratch=256 << 10)
    assert plan.chunk == 512


def test_scratch_allocator_follows_the_knob(monkeypatch, device):
    pool = SlabPool(device=device)
    assert scratch_allocator(device, pool, config.ring_policy()) is not pool   # unset: off
    monkeypatch.setenv("STRATA_MMQ_SLAB", "0")
    assert scratch_allocator(device, pool, config.ring_policy()) is not pool
    monkeypatch.setenv("STRATA_MMQ_SLAB", "1")
    assert scratch_allocator(device, pool, config.ring_policy()) is pool
    assert scratch_allocator(device, pool) is not pool             # memory reads no environment
    assert scratch_allocator(device, None)(1000).numel() == 1000  # no pool: ordinary memory


@pytest.mark.gpu
def test_flow_on_gpu_and_check_line(caplog):
    dev = torch.device("cuda", torch.cuda.current_device())
    run_prompt(dev, ring=8, scan_max=512, scratch=256 << 10)
    pool = SlabPool(device=dev)
    with caplog.at_level(logging.INFO, logger="strata"):
        t = pool.alloc(4 << 20)
    assert t.is_cuda
    assert [r.getMessage() for r in caplog.records] == [
        f"strata prefill mmq: CUDA{dev.index} the scratch pool takes a new 4 MiB buffer"]
