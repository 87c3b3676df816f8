"""Warm up, then time with device events; the median of repeats (triton.testing.do_bench-like).

On a CUDA device each repeat is bracketed by two CUDA events (GPU time, no host overhead). On the
CPU (the Triton interpreter) there are no device events: perf_counter is used and the result is
labelled "perf_counter (CPU)", so a CPU number is never mistaken for a GPU figure.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from strata.errors import StrataError

CUDA_TIMER = "cuda events"
CPU_TIMER = "perf_counter (CPU)"
# a whole synchronized run (a prompt, not one kernel) timed on the host clock
WALL_TIMER = "perf_counter (wall, synchronized)"


@dataclass(frozen=True)
class Timing:
    median_s: float
    min_s: float
    repeats: int
    timer: str          # CUDA_TIMER | CPU_TIMER: how the seconds were measured

    @property
    def median_ms(self) -> float:
        return self.median_s * 1e3


def time_fn(fn, *, device=None, warmup: int = 5, repeats: int = 20,
            settle_s: float = 0.0) -> Timing:
    """Median seconds of fn() over `repeats` runs after `warmup` untimed runs and, on a CUDA
    device with `settle_s` > 0, after running fn() back to back for settle_s seconds: a kernel
    timed in its first tens of milliseconds runs at boost clocks the GPU does not hold (the
    H200's SDPA at 32K: ~680 TFLOP/s for three calls, then ~595; benchmarks/results/
    floor-rates-nvidia-h200-7d195b6), so arms timed one after another in short bursts are
    compared at whatever clocks each happened to get."""
    if repeats < 1 or warmup < 0:
        raise StrataError(f"timing needs repeats >= 1 and warmup >= 0, got {repeats}, {warmup}")
    dev = torch.device(device) if device is not None else (
        torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))
    for _ in range(warmup):
        fn()
    times = []
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < settle_s:
            for _ in range(4):
                fn()
            torch.cuda.synchronize(dev)
        for _ in range(repeats):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        timer = CUDA_TIMER
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        timer = CPU_TIMER
    return Timing(statistics.median(times), min(times), repeats, timer)
