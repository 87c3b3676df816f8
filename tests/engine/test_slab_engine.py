"""The scratch slab inside the prefill engine (STRATA_MMQ_SLAB): guard 2 (dropped
before the borrowed slots refill), guard 3 (each participant's own loan on its own device), the
start check line, and the failure the slab exists for (a card too full for ordinary scratch).

Every engine here runs the real Triton moe_ffn pinned to stream-k (so every launch asks for
fixup scratch) over the engine's expert batches."""
import logging
from typing import NamedTuple

import pytest
import torch

from strata.engine.scratch import OrdinaryScratch
from strata.errors import AllocationError, StrataError
from strata.kernels.moe.tiles import pin_tile
from strata.memory import Loan
from strata.memory import pool as mpool
from tests.engine.slab_helpers import (CHUNK, STREAM_K, TOKENS, BudgetAlloc, make_pack,
                                       tiny_engine)

CHECK = "the scratch pool takes a new"
# The tiny shapes' scratch is a few KiB; the check line's 4 MiB threshold is lowered to 1 byte
# so that "every ordinary-memory scratch buffer" is visible at test sizes.
CHECK_LINE_MIN_FOR_TINY_SHAPES = 1
BF16_REL = 2e-2   # slab on lends more slots: other expert batches, other bf16 roundings


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    return make_pack(tmp_path_factory.mktemp("slab") / "t.pack")


class Read(NamedTuple):
    """An unconstrained read on a fresh engine and what it left behind."""
    result: object          # PrefillResult
    lines: list             # its check lines
    new_buffers: int        # the ordinary pool's new buffers
    high_water: int         # the slab's high water


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        if CHECK in record.getMessage():
            self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
def _reads():
    return {}


@pytest.fixture
def unconstrained(pack, _reads):
    """{"0": slab off, "1": slab on}: the unconstrained read on a fresh engine (each ~10 s of
    interpreter launches), read once for the module: the check-line test reads its lines and
    pools, the full-card tests compare their logits with it. Read in the first test that asks
    (function scope: under that test's NaN-poisoned torch.empty, as every read here)."""
    if _reads:
        return _reads
    log = logging.getLogger("strata")
    reads = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mpool, "LOG_MIN", CHECK_LINE_MIN_FOR_TINY_SHAPES)
        for slab in ("0", "1"):
            eng = tiny_engine(pack)
            mp.setenv("STRATA_MMQ_SLAB", slab)
            h, level = _Lines(), log.level
            log.addHandler(h)
            log.setLevel(logging.INFO)
            try:
                res = _run(eng)
            finally:
                log.removeHandler(h)
                log.setLevel(level)
            sc = eng.parts[0].scratch
            reads[slab] = Read(res, h.lines, sc.ordinary.new_buffers, sc.slab.high_water)
    _reads.update(reads)
    return _reads


def _run(eng, tokens=TOKENS, **kw):
    with pin_tile(**STREAM_K):
        return eng.run(tokens, **kw)


# the guards' reads are one chunk: what they check (the slab when the loan refills, once after
# the prompt; each participant's own tail, published once a prompt) is the same after two
ONE_CHUNK = TOKENS[:CHUNK]


def _inside(t_ptr, buf):
    return buf.data_ptr() <= t_ptr < buf.data_ptr() + buf.numel()


def test_guard_dropped_before_refill(pack, monkeypatch):
    """Guard 2: when the loan refills its slots the slab holds no view into them, and after the
    prompt the participant's scratch no longer comes from the (refilled) cache."""
    monkeypatch.setenv("STRATA_MMQ_SLAB", "1")
    eng = tiny_engine(pack)
    part = eng.parts[0]
    seen = []
    refill = Loan.refill

    def spy(loan):
        if loan.active:
            sl = part.scratch.slab
            seen.append((part.scratch.published, dict(sl.free), dict(sl._lent),
                         part.scratch._last))
        refill(loan)
    monkeypatch.setattr(Loan, "refill", spy)
    before = part.cache.buffer.clone()
    _run(eng, ONE_CHUNK)
    assert part.scratch.slab.high_water > 0            # the slab did serve this prompt
    assert seen == [(False, {}, {}, None)]
    buf = part.scratch(1000)                           # a request after the prompt ...
    assert not _inside(buf.data_ptr(), part.cache.buffer)   # ... is ordinary memory
    assert torch.equal(part.cache.buffer, before)


def test_guard_dropped_before_refill_on_failure(pack, monkeypatch):
    monkeypatch.setenv("STRATA_MMQ_SLAB", "1")
    eng = tiny_engine(pack)
    part = eng.parts[0]
    published_at_refill = []
    refill = Loan.refill
    monkeypatch.setattr(Loan, "refill", lambda loan: (published_at_refill.append(
        part.scratch.published), refill(loan)))
    with pytest.raises(AllocationError, match="injected"):
        _run(eng, fail_after_layers=1)
    assert published_at_refill == [False]


def test_guard_each_participant_its_own_loan(pack, monkeypatch):
    """Guard 3: two participants (simulated on the CPU) each publish the tail of their own loan
    to their own pool, serve their own layers, and refuse the other's tail."""
    monkeypatch.setenv("STRATA_MMQ_SLAB", "1")
    eng = tiny_engine(pack, n_parts=2)
    a, b = eng.parts
    assert a.scratch is not b.scratch and a.scratch.slab is not b.scratch.slab
    tails = {}
    for part in (a, b):
        pub = part.scratch.publish
        monkeypatch.setattr(part.scratch, "publish",
                            lambda t, part=part, pub=pub: (tails.setdefault(part.name, t), pub(t)))
    _run(eng, ONE_CHUNK)
    for part in (a, b):
        t = tails[part.name]
        assert not t.empty and _inside(t.address, part.cache.buffer)
        assert _inside(t.address + t.nbytes - 1, part.cache.buffer)
        assert part.scratch.requests > 0 and part.scratch.slab.high_water > 0
    with pytest.raises(StrataError, match="not inside this participant's own expert cache"):
        a.scratch.publish(tails[b.name])
    with pytest.raises(StrataError, match="not inside this participant's own expert cache"):
        b.scratch.publish(tails[a.name])


def test_check_line_off_and_on(unconstrained):
    """Slab off: the line for every new ordinary scratch buffer; slab on with a tail (a fresh
    engine: a fresh ordinary pool, nothing cached): none. The plan's chunk and ring are the
    same both ways."""
    off, on = unconstrained["0"], unconstrained["1"]
    assert off.new_buffers >= 1
    assert len(off.lines) == off.new_buffers
    assert all(l.startswith("strata prefill mmq: CUDA0 the scratch pool takes a new ") and
               l.endswith(" MiB buffer") for l in off.lines)
    assert on.high_water > 0
    assert on.lines == []
    off, on = off.result, on.result
    assert (on.chunk, on.ring, on.plan.chunk, on.plan.ring) == \
        (off.chunk, off.ring, off.plan.chunk, off.plan.ring)


def test_full_card_slab_off_fails_the_request_cache_intact(pack, monkeypatch, unconstrained):
    """No ordinary memory left for scratch: slab off, the request fails with an AllocationError
    mid-prompt, the cache is byte for byte as before, and the next prompt (memory freed) reads."""
    monkeypatch.setenv("STRATA_MMQ_SLAB", "0")
    eng = tiny_engine(pack)
    part = eng.parts[0]
    full = BudgetAlloc(free=0)
    part.scratch.use_ordinary(OrdinaryScratch(part.device, alloc=full))
    before, index = part.cache.buffer.clone(), dict(part.cache.index)
    with pytest.raises(AllocationError, match="allocation failed mid-prompt"):
        _run(eng)
    assert full.refused == 1
    assert torch.equal(part.cache.buffer, before) and part.cache.index == index
    part.scratch.use_ordinary(OrdinaryScratch(part.device, alloc=BudgetAlloc(free=1 << 30)))
    again = _run(eng)
    ref = unconstrained["0"].result                   # unconstrained, slab off
    assert torch.equal(again.logits, ref.logits)


def test_full_card_slab_on_completes_with_identical_logits(pack, monkeypatch, unconstrained):
    """The same full card with STRATA_MMQ_SLAB=1: the scratch comes from the tail, the prompt
    reads to completion, logits equal to an unconstrained run bit for bit (and to slab off
    within bf16 rounding: the slab lends more slots, so experts batch differently)."""
    monkeypatch.setenv("STRATA_MMQ_SLAB", "1")
    eng = tiny_engine(pack)
    part = eng.parts[0]
    full = BudgetAlloc(free=0)
    part.scratch.use_ordinary(OrdinaryScratch(part.device, alloc=full))
    before = part.cache.buffer.clone()
    got = _run(eng)
    assert full.refused == 0 and part.scratch.slab.high_water > 0
    assert torch.equal(part.cache.buffer, before)
    free = unconstrained["1"].result                  # unconstrained, slab on
    assert torch.equal(got.logits, free.logits)
    off = unconstrained["0"].result
    err = (got.logits - off.logits).abs().max() / off.logits.abs().max()
    assert err < BF16_REL


@pytest.mark.gpu
def test_full_card_on_the_gpu(pack, monkeypatch):
    """The two full-card runs on a CUDA device (compiled kernels, device addresses): slab off
    fails the request with the cache intact; slab on reads, logits equal to unconstrained."""
    def engine(free):
        eng = tiny_engine(pack, device="cuda")
        if free is not None:
            p = eng.parts[0]
            p.scratch.use_ordinary(OrdinaryScratch(p.device, alloc=BudgetAlloc(free, "cuda")))
        return eng
    monkeypatch.setenv("STRATA_MMQ_SLAB", "0")
    eng = engine(0)
    before = eng.parts[0].cache.buffer.clone()
    with pytest.raises(AllocationError):
        _run(eng)
    torch.cuda.synchronize()
    assert torch.equal(eng.parts[0].cache.buffer, before)
    monkeypatch.setenv("STRATA_MMQ_SLAB", "1")
    got = _run(engine(0))
    want = _run(engine(None))
    assert torch.equal(got.logits, want.logits)
