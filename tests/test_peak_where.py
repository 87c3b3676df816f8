"""strata.bench.peaks.live_at_peak: a replay of an allocator trace finds its peak and what was
live there, grouped by the strata line that allocated it (benchmarks/peak_where.py's count)."""
from strata.bench.peaks import live_at_peak


def ev(action, addr, size=0, where=None):
    frames = [{"filename": "/x/torch/nn/functional.py", "line": 1, "name": "f"}]
    if where:
        frames.append({"filename": f"/r/strata/{where[0]}", "line": where[1], "name": where[2]})
    return {"action": action, "addr": addr, "size": size, "frames": frames}


def test_the_peak_and_its_live_blocks():
    a, b = ("models/mla.py", 440, "mla_attention"), ("models/moe.py", 90, "route")
    trace = [ev("free_completed", 99),                     # allocated before the trace: skipped
             ev("alloc", 1, 100, a), ev("alloc", 2, 50, b), ev("alloc", 3, 30, a),
             ev("free_completed", 2), ev("alloc", 4, 10, b),   # 140 live: below the 180 peak
             ev("free_completed", 1), ev("alloc", 5, 5)]
    peak, at, groups = live_at_peak(trace)
    assert (peak, at) == (180, 3)
    assert groups == [("models/mla.py:440 mla_attention", 2, 130),
                      ("models/moe.py:90 route", 1, 50)]


def test_an_allocation_outside_strata_is_named_so():
    peak, _, groups = live_at_peak([ev("alloc", 1, 7)])
    assert peak == 7 and groups == [("(outside strata)", 1, 7)]


def test_a_skipped_line_is_not_counted():
    probe = ("bench/roofline.py", 340, "gemm_rate")
    trace = [ev("alloc", 1, 100, ("memory/cache.py", 1, "init")), ev("alloc", 2, 500, probe),
             ev("free_completed", 2), ev("alloc", 3, 30, ("models/mla.py", 1, "m"))]
    assert live_at_peak(trace)[0] == 600
    peak, at, groups = live_at_peak(trace, skip=("bench/roofline.py",))
    assert (peak, at) == (130, 3) and [g[0] for g in groups] == ["memory/cache.py:1 init",
                                                                   "models/mla.py:1 m"]
