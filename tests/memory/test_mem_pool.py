"""SlabPool over the loan's tail: size classes, one free buffer per class, the address guard,
the empty-tail fallback and the check line (SPEC "Scratch pool")."""
import logging

import torch
from hypothesis import example, given, strategies as st

from strata.memory import Carve, SlabPool, size_class
from strata.memory.carve import Tail
from strata.memory.pool import CLASS_FLOOR

KiB, MiB = 1 << 10, 1 << 20


@given(n=st.integers(0, 1 << 34))
@example(n=0)                    # empty request: still the floor class
@example(n=CLASS_FLOOR)          # exactly the floor
@example(n=CLASS_FLOOR + 1)      # one past: the next power of two
@example(n=(4 << 20) - 1)        # just under the log threshold
def test_size_class(n):
    c = size_class(n)
    assert c & (c - 1) == 0 and c >= max(n, CLASS_FLOOR)
    assert c == CLASS_FLOOR or c < 2 * n


def _tail(nbytes, offset=0):
    buf = torch.zeros(nbytes + offset, dtype=torch.uint8)
    return Tail(buf[offset:], buf.data_ptr() + offset), buf


ops = st.lists(st.one_of(st.tuples(st.just("alloc"), st.integers(1, 3 * MiB)),
                         st.tuples(st.just("release"), st.integers(0, 50))), max_size=40)


@given(ops=ops, tail_kib=st.integers(0, 16 * 1024))
@example(ops=[("alloc", 100 * KiB), ("alloc", 120 * KiB), ("release", 0), ("release", 0)],
         tail_kib=1024)   # two buffers of one class freed: the pool keeps one
def test_pool_one_free_per_class_and_buffers_disjoint(ops, tail_kib):
    tail, buf = _tail(tail_kib * KiB)
    ordinary = []
    pool = SlabPool(device="cpu", fallback=lambda n: ordinary.append(n) or
                    torch.zeros(n, dtype=torch.uint8))
    pool.publish(tail)
    live = []
    for op, arg in ops:
        if op == "alloc":
            t = pool.alloc(arg)
            assert t.numel() == arg
            live.append(t)
        elif live:
            pool.release(live.pop(arg % len(live)))
        assert len(pool.free) == len(set(pool.free))       # keys are classes
        assert all(b.numel() == c for c, b in pool.free.items())
        assert pool.high_water <= tail.nbytes
    lo, hi = tail.address, tail.address + tail.nbytes
    spans = [(t.data_ptr(), t.data_ptr() + t.numel()) for t in live if lo <= t.data_ptr() < hi]
    for a, b in spans:
        assert lo <= a and b <= hi
    spans.sort()
    for (a0, b0), (a1, b1) in zip(spans, spans[1:]):
        assert b0 <= a1, "two live scratch buffers share tail bytes"


def test_release_twice_in_one_class_keeps_one():
    tail, _ = _tail(4 * MiB)
    pool = SlabPool(device="cpu")
    pool.publish(tail)
    a, b = pool.alloc(100 * KiB), pool.alloc(120 * KiB)     # both the 128 KiB class
    pool.release(a)
    pool.release(b)
    assert list(pool.free) == [128 * KiB]
    c = pool.alloc(64 * KiB)                                # reuses the free one
    assert c.data_ptr() == a.data_ptr() and not pool.free


def test_moved_tail_drops_everything():
    t1, _ = _tail(4 * MiB)
    t2, _ = _tail(4 * MiB, offset=256)
    pool = SlabPool(device="cpu")
    pool.publish(t1)
    x = pool.alloc(1 * MiB)
    pool.release(x)
    assert pool.free and pool.address == t1.address
    pool.publish(t1)                                        # same tail: keeps its buffers
    assert pool.free
    pool.publish(t2)                                        # moved: drops all
    assert not pool.free and pool.used == 0 and pool.address == t2.address
    y = pool.alloc(1 * MiB)
    assert t2.address <= y.data_ptr() < t2.address + t2.nbytes
    pool.release(x)                                         # an old tail's buffer is not taken back
    assert not pool.free


def test_drop_at_end_of_prompt_and_empty_tail_fallback(caplog):
    tail, _ = _tail(1 * MiB)
    pool = SlabPool(device="cpu")
    pool.publish(tail)
    pool.drop()
    assert pool.tail is None and not pool.free
    pool.publish(Tail(torch.zeros(0, dtype=torch.uint8), 1234))   # empty tail: nothing published
    assert pool.tail is None
    with caplog.at_level(logging.INFO, logger="strata"):
        small = pool.alloc(1 * MiB)                          # ordinary memory, under 4 MiB: quiet
        big = pool.alloc(5 * MiB + 1)
    assert small.numel() == 1 * MiB and big.numel() == 5 * MiB + 1
    lines = [r.getMessage() for r in caplog.records if r.name == "strata"]
    assert lines == ["strata prefill mmq: CUDA0 the scratch pool takes a new 6 MiB buffer"]


def test_slab_on_with_a_tail_logs_nothing(caplog):
    buf = torch.zeros(64 * MiB, dtype=torch.uint8)
    c = Carve(buf)
    c.take("activations", torch.bfloat16, (1000, 1000))
    pool = SlabPool(device="cpu")
    pool.publish(c.tail())
    with caplog.at_level(logging.INFO, logger="strata"):
        t = pool.alloc(8 * MiB)
    assert not caplog.records
    assert c.tail().address <= t.data_ptr() < buf.data_ptr() + buf.numel()
    assert pool.stats()["high_water"] == 8 * MiB


def test_tail_too_small_falls_back():
    tail, _ = _tail(256 * KiB)
    pool = SlabPool(device="cpu")
    pool.publish(tail)
    t = pool.alloc(1 * MiB)
    assert not (tail.address <= t.data_ptr() < tail.address + tail.nbytes)
    assert pool.ordinary_bytes == 1 * MiB


@given(moves=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 4)), min_size=1, max_size=12))
@example(moves=[(0, 4), (0, 4), (1, 4)])   # same tail twice keeps buffers, then a move drops them
@example(moves=[(0, 4), (0, 2)])           # same address, shorter tail (a bigger chunk): dropped
def test_pool_drops_everything_when_the_tail_moves(moves):
    base = torch.zeros(8 * MiB, dtype=torch.uint8)
    pool = SlabPool(device="cpu")
    prev = None
    for start_kib, mib in moves:
        off = start_kib * 256 * KiB
        tail = Tail(base[off:off + mib * MiB], base.data_ptr() + off)
        pool.publish(tail)
        if prev is not None and (prev.address, prev.nbytes) != (tail.address, tail.nbytes):
            assert not pool.free and pool.used == 0
        x = pool.alloc(200 * KiB)
        assert tail.address <= x.data_ptr() < tail.address + tail.nbytes
        pool.release(x)
        assert list(pool.free) == [256 * KiB]
        prev = tail


def _offset(pool: SlabPool, t: torch.Tensor) -> int | None:
    """Where `t` sits in the pool's tail (bytes from its start); None: ordinary memory."""
    tail = pool.tail
    if tail is None or not tail.address <= t.data_ptr() < tail.address + tail.nbytes:
        return None
    return t.data_ptr() - tail.address


@given(ops=ops, tail_kib=st.integers(0, 16 * 1024))
@example(ops=[("alloc", 100 * KiB), ("release", 0), ("alloc", 120 * KiB)],
         tail_kib=1024)   # one class asked twice: the free buffer again, no new bytes
@example(ops=[("alloc", 3 * MiB), ("alloc", 100 * KiB)],
         tail_kib=1024)   # past the tail: ordinary memory in both, the next fits
@example(ops=[("alloc", 1)], tail_kib=0)   # an empty tail publishes nothing: both fall back
@example(ops=[("alloc", 512 * KiB), ("alloc", 512 * KiB)],
         tail_kib=1024)   # exactly full: the bump ends at the tail's last byte
def test_dry_pool_counts_what_a_real_pool_reserves(ops, tail_kib):
    """SlabPool.dry runs the real pool's code without memory: over the same requests every
    buffer lands at the same tail offset (or in ordinary memory alike), and used, high_water,
    ordinary_bytes and the free classes stay equal after each step."""
    tail, _ = _tail(tail_kib * KiB)
    real = SlabPool(device="cpu", fallback=lambda n: torch.zeros(n, dtype=torch.uint8))
    real.publish(tail)
    dry = SlabPool.dry(tail_kib * KiB)
    assert dry.is_dry and not real.is_dry
    live = []
    for op, arg in ops:
        if op == "alloc":
            a, d = real.alloc(arg), dry.alloc(arg)
            assert d.device.type == "meta" and d.numel() == a.numel() == arg
            assert _offset(dry, d) == _offset(real, a)
            live.append((a, d))
        elif live:
            a, d = live.pop(arg % len(live))
            real.release(a)
            dry.release(d)
        assert dry.stats() == real.stats()


def test_unbounded_dry_pool_never_falls_back():
    dry = SlabPool.dry()
    for n in (1, 200 * KiB, 64 * MiB, 1 << 34):
        dry.release(dry.alloc(n))
    assert dry.ordinary_bytes == 0
    assert dry.high_water == sum(size_class(n) for n in (1, 200 * KiB, 64 * MiB, 1 << 34))
