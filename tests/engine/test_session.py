"""PromptSession, driven directly: whatever way a prompt leaves it (a borrow that fails part way
through the participants, a read that fails with the engine's KV held), every loan is refilled,
the KV is released and the cache ends byte for byte as it began (a failed prompt fails alone).
The engine-level paths (fail_after_layers, a device OOM) are in test_streaming."""
import pytest
import torch

from strata.engine import session as engine_session
from strata.engine.session import PromptSession
from strata.errors import AllocationError
from strata.memory import Loan
from tests.engine.test_streaming import SHAPE, assert_restored, engine, pack, snapshot  # noqa: F401

T = 16


def _session(eng, plan) -> PromptSession:
    return PromptSession(eng.parts, plan.participants, eng.layout, plan.chunk, eng.cfg.lend_cap,
                         shape=eng.shape, host=eng.host, layouts=eng.layouts, land=eng.land,
                         slab=False)


def test_a_borrow_failing_part_way_refills_what_was_lent(pack, monkeypatch):
    """Two participants: the first borrows (and its lent bytes are scribbled over), the second's
    borrow fails; leaving the session refills the first's loan."""
    eng = engine(pack, cache_blobs=8, vram=[1 << 30, 1 << 30], ring=2, chunk=8)
    snap = snapshot(eng)
    plan = eng.plan(T)
    made: list[Loan] = []

    class SecondFails(Loan):
        def __init__(self, *a, **kw):
            if made:
                raise AllocationError("injected: the second participant's borrow fails")
            super().__init__(*a, **kw)
            made.append(self)
            self.buffer.fill_(0xA5)      # what a prompt's ring and buffers would write

    monkeypatch.setattr(engine_session, "Loan", SecondFails)
    with pytest.raises(AllocationError, match="second participant"):
        with _session(eng, plan) as s:
            s.open()
    assert len(made) == 1 and not made[0].active and s.loans == []
    assert_restored(eng, snap)


def test_a_failed_read_releases_the_kv_and_refills(pack):
    """The engine's own KV (int8: PromptKV) over the carve's stages, the loans scribbled over,
    then the read fails: on the way out the KV is released (its figures kept for the result),
    the loans refilled, the cache whole; the next prompt reads."""
    eng = engine(pack, ring=3, kv="int8")
    snap = snapshot(eng)
    plan = eng.plan(T)
    with pytest.raises(RuntimeError, match="the read fails"):
        with _session(eng, plan) as s:
            s.open()
            kv = s.new_kv(T, eng.prompt_kv, eng.model, eng.cfg.kv)
            assert kv is s.kv and kv.scratch is s.kv_scratch and kv.vram_bytes > 0
            for loan in s.loans:
                loan.buffer.fill_(0x5A)
            raise RuntimeError("the read fails")
    assert s.kv is None and s.provider is None and kv.resident == [] and kv.scratch == {}
    assert s.kv_bytes[0] > 0 and len(s.memory) == 1
    assert_restored(eng, snap)
    tokens = torch.randint(0, SHAPE.vocab, (T,), generator=torch.Generator().manual_seed(1))
    eng.run(tokens)
    assert_restored(eng, snap)


def test_the_models_own_cache_when_the_factory_gives_none(pack):
    """No engine KV (the default bf16/fp32 all-resident read): the model's own cache in the
    run's KV dtype; it is dropped, not released, and holds nothing in host memory."""
    eng = engine(pack, ring=3)
    plan = eng.plan(T)
    with _session(eng, plan) as s:
        s.open()
        cache = s.new_kv(T, lambda n, stages: None, eng.model, eng.cfg.kv)
        assert cache is s.kv and cache.vram_bytes > 0
    assert s.kv is None and s.kv_streamed == 0 and s.kv_bytes == (cache.vram_bytes, 0)
