"""Where a read's VRAM goes at its peak (diagnostic, not a benchmark): `strata bench` run in this
process under torch's allocator history, its trace replayed to the live peak on cuda:0
(strata.bench.peaks.live_at_peak), the blocks live there grouped by the strata line that
allocated them. The expert cache, the dense weights and the KV show as the lines that made
them; everything else live at the peak is a transient beside the plan's carve.

    python3 benchmarks/peak_where.py --out DIR -- PACK --vram 24GiB -p 32768 -r 1

Prints the peak beside torch's max_memory_allocated and the top lines, and writes
peak_where.csv (where, blocks, bytes) under --out.
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
from pathlib import Path

import torch

from strata.atomic import atomic_write
from strata.bench.peaks import live_at_peak
from strata.cli import main as strata_main
from strata.units import fmt_bytes


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--entries", type=int, default=2_000_000,
                    help="allocator events kept (the oldest drop past it)")
    ap.add_argument("--skip", nargs="*", default=["bench/roofline.py"],
                    help="allocations made here are not counted (the GEMM-rate probe beside "
                         "the reads)")
    ap.add_argument("bench", nargs=argparse.REMAINDER, help="-- then strata bench's arguments")
    args = ap.parse_args(argv)
    bench = args.bench[1:] if args.bench[:1] == ["--"] else args.bench
    if not torch.cuda.is_available():
        print("peak_where: needs a CUDA device (torch's allocator history)", file=sys.stderr)
        return 2
    try:   # the output folder before the read, not after it
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        print(f"peak_where: cannot make --out {args.out}: {e.strerror}", file=sys.stderr)
        return 2
    if not os.access(args.out, os.W_OK):
        print(f"peak_where: --out {args.out} is not writable; give another folder",
              file=sys.stderr)
        return 2
    torch.cuda.memory._record_memory_history(max_entries=args.entries, stacks="python")
    rc = strata_main(["bench", *bench])
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    peak, at, groups = live_at_peak(snap["device_traces"][0], skip=tuple(args.skip))
    n = len(snap["device_traces"][0])
    top = fmt_bytes(torch.cuda.max_memory_allocated())
    print(f"peak_where: {fmt_bytes(peak)} live at event {at:,} of {n:,} (torch's "
          f"max_memory_allocated since its last reset {top}; bench exit {rc})")
    for where, k, b in groups[:args.top]:
        print(f"{fmt_bytes(b):>12} {k:>6}  {where}")
    with atomic_write(args.out / "peak_where.csv") as tmp, open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["where", "blocks", "bytes"])
        w.writerows(groups)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
