"""Scratch sources of one participant (strata.engine.scratch): the exact-size ordinary pool and
its check line, the knob, the empty tail, guard 1 (the slab keyed on the tail's address) over a
real loan and carve, and the real Triton stream-k moe_ffn taking its scratch from the tail."""
import contextlib
import logging

import pytest
from hypothesis import example, given, settings, strategies as st
import torch

from strata import config
from strata.engine.scratch import OrdinaryScratch, ParticipantScratch
from strata.planning import scratch_bytes_for, slab_reserve
from strata.errors import StrataError
from strata.experts import ExpertSet
from strata.kernels.moe import ffn as kmoe
from strata.kernels.moe.ffn import moe_ffn
from strata.kernels.moe.tiles import pin_tile
from strata.memory import Loan
from strata.memory import pool as mpool
from strata.memory.carve import Carve, Tail
from strata.memory.carve import ALIGN
from strata.memory.pool import size_class
from strata.shapes import ModelShape
from tests.engine.slab_helpers import CHUNK, SHAPE, STREAM_K, make_pack, tiny_engine

MiB = 1 << 20
CHECK = "the scratch pool takes a new"


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return tiny_engine(make_pack(tmp_path_factory.mktemp("slab") / "t.pack"), kernel=False)


@pytest.mark.parametrize("raw,want", [(None, False), ("", False), ("0", False), ("1", True),
                                      ("2", True)], ids=["unset", "empty", "zero", "one", "two"])
def test_knob(monkeypatch, raw, want):
    if raw is None:
        monkeypatch.delenv("STRATA_MMQ_SLAB", raising=False)
    else:
        monkeypatch.setenv("STRATA_MMQ_SLAB", raw)
    assert config.mmq_slab() is want


@pytest.mark.parametrize("raw", ["yes", "on", "1.0"])
def test_knob_not_an_integer_is_a_clear_error(monkeypatch, raw):
    monkeypatch.setenv("STRATA_MMQ_SLAB", raw)
    with pytest.raises(StrataError, match="STRATA_MMQ_SLAB.*not an integer"):
        config.mmq_slab()


def test_ordinary_pool_is_exact_size_caching_and_logs_new_buffers(caplog):
    pool = OrdinaryScratch("cpu")
    caplog.set_level(logging.INFO, logger="strata")
    a = pool(4 * MiB)                 # new, >= 4 MiB: the check line
    pool.release(a)
    b = pool(4 * MiB)                 # the cached one: no line, no new buffer
    assert b.data_ptr() == a.data_ptr()
    pool.release(b)
    c = pool(4 * MiB - 1)             # a different exact size: new, but under 4 MiB: no line
    assert c.data_ptr() != a.data_ptr()
    lines = [r.getMessage() for r in caplog.records if CHECK in r.getMessage()]
    assert lines == ["strata prefill mmq: CUDA0 the scratch pool takes a new 4 MiB buffer"]
    assert (pool.new_buffers, pool.held, pool.high_water) == (2, 8 * MiB - 1, 8 * MiB - 1)


def test_empty_tail_publishes_nothing_and_scratch_is_ordinary(engine):
    part = engine.parts[0]
    ps = ParticipantScratch(part.name, part.device, part.cache.buffer)
    empty = Tail(part.cache.buffer[:0], part.cache.buffer.data_ptr())
    ps.publish(empty)
    assert not ps.published
    buf = ps(1000)
    assert ps.ordinary.new_buffers == 1 and ps.slab.high_water == 0
    lo = part.cache.buffer.data_ptr()
    assert not lo <= buf.data_ptr() < lo + part.cache.buffer.numel()


def _carve(engine, loan, chunk):
    slots = 2
    carve = loan.carve()
    engine.layout.carve(carve, chunk, slots)
    return carve


def test_guard_address_moved_tail_drops_old_buffers(engine):
    """Guard 1: a chunk that moves the carve's stop moves the tail; the slab drops the buffers
    of the old tail, so none of them can land on the new layout's buffers."""
    part = engine.parts[0]
    need = engine.layout.bytes_needed(8, 2) + size_class(1)   # a floor-class tail either way
    with Loan(part.cache, need) as loan:
        ps = ParticipantScratch(part.name, part.device, part.cache.buffer)
        small = _carve(engine, loan, 2)
        ps.publish(small.tail())
        old = ps(1000)                           # a class-floor buffer at the small tail's start
        ps(300_000)                              # another class: hands `old` back (free)
        big = _carve(engine, loan, 8)            # a longer chunk: the stop moves up
        assert big.tail().address != small.tail().address
        ps.publish(big.tail())
        new = ps(1000)
        assert new.data_ptr() != old.data_ptr()
        base = loan.buffer.data_ptr()
        for pl in big.placements:                # nothing the new layout carved is handed out
            assert not base + pl.offset <= new.data_ptr() < base + pl.end, pl.name
        assert big.tail().address <= new.data_ptr()


def test_slab_reserve_counts_the_kernels_own_classes():
    with pin_tile(**STREAM_K):
        prob = kmoe.GemmProblem(CHUNK, SHAPE.top_k, SHAPE.n_expert, SHAPE.d_model,
                                SHAPE.d_expert, 4)
        one = size_class(kmoe.scratch_nbytes(kmoe.resolve_tile(prob)))
        # the pack is BF16 (not decoded); chunks 8 and 4: one class
        assert slab_reserve(SHAPE, 12, CHUNK, "cpu", decoded=False) == one
    with pin_tile(schedule="dp"):
        assert slab_reserve(SHAPE, 12, CHUNK, "cpu", decoded=False) == 0


def _prompt_asks(shape, n_tokens: int, chunk: int, layers: list[bool]) -> list[int]:
    """The scratch every launch of a prompt asks, in the prompt's order: each chunk (the full
    ones, then the partial one) through each layer (`layers`: its weights decoded or not)."""
    chunks = [chunk] * (n_tokens // chunk) + ([n_tokens % chunk] if n_tokens % chunk else [])
    return [b for t in chunks for d in layers
            if (b := scratch_bytes_for(shape, t, "cpu", decoded=d)) > 0]


def _real_slab(asks: list[int], tail_bytes: int) -> ParticipantScratch:
    """The asks through a real ParticipantScratch whose slab serves a CPU loan's whole tail of
    `tail_bytes` (one launch's scratch at a time, as the engine hands them out)."""
    loan = torch.empty(tail_bytes, dtype=torch.uint8)
    ps = ParticipantScratch("CUDA0", "cpu", loan)
    ps.publish(Carve(loan).tail())
    for n in asks:
        ps(n)
    return ps


@settings(max_examples=40, deadline=None)
@given(d_model=st.sampled_from([64, 128, 192, 2048]), d_expert=st.sampled_from([32, 64, 96, 768]),
       n_expert=st.integers(1, 128), top_k=st.integers(1, 8), chunk=st.integers(1, 1024),
       full=st.integers(1, 4), partial=st.integers(0, 1023),
       layers=st.lists(st.booleans(), min_size=1, max_size=5),
       programs=st.one_of(st.none(), st.integers(1, 32)))
@example(d_model=64, d_expert=32, n_expert=32, top_k=2, chunk=8, full=1, partial=4, layers=[False],
         programs=3)   # the tiny engine's prompt: chunks 8 + 4 in one class
@example(d_model=64, d_expert=64, n_expert=4, top_k=2, chunk=72, full=1, partial=0,
         layers=[True, False, True], programs=3)   # two kinds of layer: a class each
@example(d_model=2048, d_expert=768, n_expert=128, top_k=8, chunk=1024, full=2, partial=1,
         layers=[False], programs=32)   # a large class beside the partial chunk's small one
@example(d_model=64, d_expert=32, n_expert=8, top_k=2, chunk=16, full=2, partial=0,
         layers=[False], programs=None)   # the heuristic: data-parallel asks nothing, reserve 0
def test_slab_reserve_is_what_a_real_slab_pool_reserves(d_model, d_expert, n_expert, top_k, chunk,
                                                         full, partial, layers, programs):
    """slab_reserve (a dry SlabPool) against a real SlabPool over a CPU tail, fed the prompt's
    own launches: a tail of the reserve's bytes serves every one of them (high-water = the
    reserve, nothing from ordinary memory), and a tail one alignment step smaller does not. So
    the planner's reserve is the pool's own count, not a second one."""
    shape = ModelShape(d_model=d_model, n_expert=n_expert, top_k=min(top_k, n_expert),
                       d_expert=d_expert)
    n_tokens = full * chunk + partial % chunk
    pin = pin_tile(schedule="stream_k", programs=programs) if programs else contextlib.nullcontext()
    with pin:
        reserve = slab_reserve(shape, n_tokens, chunk, "cpu", decoded=set(layers))
        asks = _prompt_asks(shape, n_tokens, chunk, layers)
    if reserve == 0:
        assert asks == []            # no launch runs stream-k
        return
    ps = _real_slab(asks, reserve)
    assert ps.slab.high_water == reserve
    assert ps.slab.ordinary_bytes == 0 and ps.ordinary.new_buffers == 0
    short = _real_slab(asks, reserve - ALIGN)
    assert short.slab.ordinary_bytes > 0


def test_real_stream_k_kernel_takes_scratch_from_the_tail(engine, caplog, monkeypatch):
    """The Triton moe_ffn, pinned to stream-k, with its fixup scratch in the loan's tail: the same
    bytes out as with ordinary scratch, the scratch inside the tail, no check line."""
    monkeypatch.setattr(mpool, "LOG_MIN", 1)     # tiny shapes: log every ordinary buffer
    caplog.set_level(logging.INFO, logger="strata")
    part = engine.parts[0]
    g = torch.Generator().manual_seed(0)
    T, K, E = 8, SHAPE.top_k, SHAPE.n_expert
    x = torch.randn(T, SHAPE.d_model, generator=g).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    w = torch.softmax(torch.randn(T, K, generator=g), -1)
    cache = part.cache
    with pin_tile(**STREAM_K):
        need = (engine.layout.bytes_needed(CHUNK, 2)
                + slab_reserve(SHAPE, T, CHUNK, "cpu", decoded=False))
        with Loan(cache, need) as loan:
            offs = torch.full((E,), -1, dtype=torch.int64)   # layer 0's experts the loan left
            for (layer, e), slot in cache.index.items():
                if layer == 0:
                    offs[e] = cache.layout.slot_offset[slot]
            experts = ExpertSet(cache.buffer, offs, engine.layouts[0])
            ids = torch.where(offs[ids] >= 0, ids, int(torch.nonzero(offs >= 0)[0]))
            want = moe_ffn(x, ids, w, experts)                        # default: torch.empty
            assert kmoe.last_launch().scratch_bytes > 0
            carve = _carve(engine, loan, CHUNK)
            ps = ParticipantScratch(part.name, part.device, cache.buffer)
            ps.publish(carve.tail())
            caplog.clear()
            got = moe_ffn(x, ids, w, experts, scratch_alloc=ps)
            tail = carve.tail()
            assert ps.slab.high_water > 0 and ps.ordinary.new_buffers == 0
            assert tail.address <= ps._last[1].data_ptr() < tail.address + tail.nbytes
            ps.drop()
    assert torch.equal(got, want)
    assert not [r for r in caplog.records if CHECK in r.getMessage()]


def test_class_sweep_bounds_the_pool_when_the_size_changes_per_launch():
    """experiments/slab_ab.py's sweep: a grid pinned to a different size per launch grows the
    exact-size pool by one buffer per launch; the classes stay within two of the largest class.
    With the heuristic's few tiles the classes may hold more (power-of-two rounding): reported,
    not asserted either way."""
    import importlib.util
    from pathlib import Path
    from strata.shapes import get_preset
    path = Path(__file__).resolve().parents[2] / "experiments" / "slab_ab.py"
    spec = importlib.util.spec_from_file_location("slab_ab", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    run_classes = mod.run_classes
    rows = run_classes(get_preset("qwen3-30b-a3b"), 132, list(range(256, 4097, 256)), "pinned-P")
    last = rows[-1]
    assert last["exact_buffers"] == len({r["scratch"] for r in rows}) == len(rows)
    assert last["slab_high_water"] <= 2 * max(r["class"] for r in rows) + 256 * len(rows)
    assert last["slab_high_water"] < last["exact_high_water"]


KiB = 1 << 10
_steps = st.lists(st.one_of(
    st.tuples(st.just("layout"), st.integers(0, 900 * KiB)),   # carve this many bytes, publish
    st.tuples(st.just("ask"), st.integers(1, 400 * KiB)),      # one launch's scratch
    st.tuples(st.just("drop"), st.just(0))), max_size=30)


@given(steps=_steps)
@example(steps=[("layout", 0), ("ask", 1000), ("ask", 300 * KiB), ("layout", 600 * KiB),
                ("ask", 1000)])   # the moved tail: the old floor buffer now lies in the layout
@example(steps=[("layout", 1024 * KiB - 1), ("ask", 1)])   # a tail too small: ordinary memory
@example(steps=[("layout", 0), ("ask", 1), ("drop", 0), ("ask", 1)])   # dropped: ordinary
def test_scratch_never_lands_on_the_layout(steps):
    """Whatever the order of layouts, launches and drops, a scratch buffer is either inside the
    current layout's tail (slab) or outside the loan altogether (ordinary), never on a carved
    buffer and never in the loan once dropped."""
    loan = torch.zeros(1024 * KiB, dtype=torch.uint8)
    ps = ParticipantScratch("CUDA0", "cpu", loan)
    lo, hi = loan.data_ptr(), loan.data_ptr() + loan.numel()
    stop, live = None, False
    for op, n in steps:
        if op == "layout":
            carve = Carve(loan)
            carve.take("act", torch.uint8, (n,))
            ps.publish(carve.tail())
            stop, live = lo + carve.stop, not carve.tail().empty
        elif op == "drop":
            ps.drop()
            live = False
        else:
            buf = ps(n)
            a, b = buf.data_ptr(), buf.data_ptr() + n
            if live and lo <= a < hi:
                assert stop <= a and b <= hi
            else:
                assert b <= lo or a >= hi


def test_full_tail_falls_back_to_the_ordinary_pool_with_one_check_line(caplog):
    """A tail too small for the request's class: the scratch comes from the ordinary pool, which
    logs the check line once (the slab does not log it a second time), and is reused there."""
    caplog.set_level(logging.INFO, logger="strata")
    loan = torch.zeros(8 * MiB, dtype=torch.uint8)
    ps = ParticipantScratch("CUDA0", "cpu", loan)
    carve = Carve(loan)
    carve.take("act", torch.uint8, (6 * MiB,))          # a 2 MiB tail
    ps.publish(carve.tail())
    a = ps(4 * MiB)                                     # class 4 MiB: does not fit
    ps(1000)                                            # from the tail; hands `a` back
    b = ps(4 * MiB)
    assert a.data_ptr() == b.data_ptr() and not _inside_loan(b, loan)
    assert [r.getMessage() for r in caplog.records if CHECK in r.getMessage()] == [
        "strata prefill mmq: CUDA0 the scratch pool takes a new 4 MiB buffer"]
    assert ps.ordinary.new_buffers == 1 and ps.slab.high_water == size_class(1000)


def _inside_loan(t, loan):
    return loan.data_ptr() <= t.data_ptr() < loan.data_ptr() + loan.numel()
