"""The order a GPU run hands its tests to pytest-xdist's workers: the longest first, by the call
times the last whole GPU suite recorded (benchmarks/gpu_session.sh's `suite` step writes them,
one `seconds outcome when nodeid` line a test; the file lands in experiments/results).

Why: the suite is four workers over ~1,000 s of tests whose slowest take ~40 s (Triton's first
compiles), and the wall time is the busiest worker's: 343.6 s at c46f6a8 against 257 s of work
a worker, collection and start-up included. In file order a 40 s test may start when the others
are nearly done; longest first, with xdist's worksteal, is list scheduling's classic order,
whose tail is at most one (short) test. A test the file does not name (new, or renamed) goes
first, as if slow: better early than at the tail. Within equal times the collection order stays.
"""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the newest whole-suite times on the device (update with the file a suite step brings back)
GPU_TIMES = ROOT / "experiments" / "results" / "gpu_suite_times-NVIDIA_H100-c46f6a8.txt"


def read_times(path: Path = GPU_TIMES) -> dict[str, float]:
    """nodeid -> recorded call seconds (setup lines added to their test's; a missing file: {})."""
    times: dict[str, float] = {}
    if not path.exists():
        return times
    for line in path.read_text().splitlines():
        parts = line.split(maxsplit=3)
        if len(parts) != 4:
            continue
        try:
            secs = float(parts[0])
        except ValueError:
            continue
        times[parts[3]] = times.get(parts[3], 0.0) + secs
    return times


def longest_first(items: list, times: dict[str, float]) -> list:
    """`items` (anything with a `nodeid`) reordered: those `times` does not name first, then the
    rest by recorded time, longest first; a stable sort, so ties keep their order."""
    return sorted(items, key=lambda it: -times.get(it.nodeid, float("inf")))
