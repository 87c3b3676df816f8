"""The compute floor's three rates measured in a burst (as the floor has measured them) and settled.

Legend: T chunk tokens, H query heads, hd head width, E experts, K top-k, D hidden, F expert width.

The all-resident read's compute floor (strata.bench.roofline.compute_floor) prices attention at
sdpa_rate, the experts at gemm_rate and the dense layers at dense_rate. Each was timed as one
untimed call and 3-5 timed ones: a burst of a few tens of milliseconds at 32K. A read runs its
kernels back to back for a second and more; if the GPU's clocks fall under that load, a burst
rate is one the read can never reach. This bench measures, per kind and T:
- burst: the rate function as the floor calls it (settle_s 0);
- settled: the same function after `--settle-for` seconds of the same op back to back, `--reps`
  timed repeats;
and a series: the floor's SDPA call at the largest T, each of `--series` calls timed on its own
after two idle seconds, as TFLOP/s (what the clocks do over a second of attention).

Figures: TFLOP/s of each. Nothing here is a kernel of strata's, so there is no output to gate:
the rows carry the command and the timer, as every figure does.

    python benchmarks/floor_rates_bench.py             # GPU: qwen3-30b-a3b, T 8K, 32K
    python benchmarks/floor_rates_bench.py --smoke     # CPU: checks the script (NaN rates)
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import torch

from strata import bench
from strata.bench import roofline as rl
from strata.shapes import get_preset

ROOT = Path(__file__).resolve().parents[1]
KINDS = {"attn": rl.sdpa_rate, "gemm": rl.gemm_rate, "dense": rl.dense_rate}
BURST_REPS = {"attn": 3, "gemm": 5, "dense": 3}     # how the floor timed them before 7d195b6


def series(shape, T: int, n: int) -> list[float]:
    """TFLOP/s of each of n back-to-back SDPA calls (the floor's call) after 2 s idle."""
    run = rl.sdpa_call(shape, T)
    run()
    torch.cuda.synchronize()
    time.sleep(2.0)
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
    ev[0].record()
    for i in range(n):
        run()
        ev[i + 1].record()
    torch.cuda.synchronize()
    return [rl.sdpa_flops(shape, T) / (ev[i].elapsed_time(ev[i + 1]) / 1e3) / 1e12
            for i in range(n)]


def measure(args, rec: bench.Recorder) -> None:
    shape = get_preset(args.shape)
    for T in args.T:
        for kind, fn in KINDS.items():
            for arm, kw in (("burst", dict(reps=BURST_REPS[kind], settle_s=0.0)),
                            ("settled", dict(reps=args.reps, settle_s=args.settle_for))):
                rate = fn(shape, T, **kw)
                rec.add("tflops", rate / 1e12, "TFLOP/s", timer="cuda events", shape=args.shape,
                        T=T, kind=kind, arm=arm,
                        reps=kw["reps"], settle_s=kw["settle_s"], command=args.command)
        rec.flush()
    if torch.cuda.is_available() and args.series:
        T = max(args.T)
        for i, r in enumerate(series(shape, T, args.series)):
            rec.add("series tflops", r, "TFLOP/s", timer="cuda events", shape=args.shape, T=T,
                    kind="attn", arm="series", call=i, command=args.command)


def summary(rows: list[dict]) -> None:
    for r in rows:
        c = r["config"]
        if r["figure"] == "tflops":
            v = r["value"]
            print(f"[{r['label']}] T={c['T']:<6} {c['kind']:<6} {c['arm']:<8} "
                  f"{v if isinstance(v, str) or math.isnan(v) else round(v, 1)} TFLOP/s")
    s = [r["value"] for r in rows if r["figure"] == "series tflops"]
    if s:
        print(f"series: first 4 {[round(v) for v in s[:4]]}, last 4 {[round(v) for v in s[-4:]]}")


def plot(rows: list[dict], path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4))
    rates = [r for r in rows if r["figure"] == "tflops" and isinstance(r["value"], float)
             and not math.isnan(r["value"])]
    names = [f"{r['config']['kind']} T{r['config']['T']}\n{r['config']['arm']}" for r in rates]
    a.bar(range(len(rates)), [r["value"] for r in rates],
          color=["C0" if r["config"]["arm"] == "burst" else "C1" for r in rates])
    a.set_xticks(range(len(rates)), names, fontsize=7, rotation=60)
    a.set_ylabel("TFLOP/s")
    a.set_title("floor rates: burst (as the floor measured) vs settled", fontsize=9)
    s = [r for r in rows if r["figure"] == "series tflops"]
    if s:
        b.plot([r["config"]["call"] for r in s], [r["value"] for r in s], marker=".")
        b.set_xlabel("call after 2 s idle")
        b.set_ylabel("TFLOP/s")
        b.set_title(f"SDPA T={s[0]['config']['T']}, one call at a time", fontsize=9)
    fig.suptitle(f"{rows[0]['gpu']} {rows[0]['commit']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def main(argv=None) -> int:
    ap = bench.parser(__doc__, out=ROOT / "benchmarks" / "results", warmup=0, repeats=1)
    ap.add_argument("--shape", default="qwen3-30b-a3b")
    ap.add_argument("--T", nargs="*", type=int, default=[8192, 32768])
    ap.add_argument("--settle-for", dest="settle_for", type=float, default=rl.SETTLE_S,
                    help="seconds the settled arm runs its op before timing")
    ap.add_argument("--reps", type=int, default=10, help="timed repeats of the settled arm")
    ap.add_argument("--series", type=int, default=150, help="calls in the SDPA series (0: none)")
    ap.add_argument("--smoke", action="store_true", help="tiny T on any device (CPU: NaN rates)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.T, args.settle_for, args.reps, args.series = [256], 0.05, 2, 4
    elif not torch.cuda.is_available():
        print("floor_rates_bench needs a CUDA device; use --smoke to check it on a CPU",
              file=sys.stderr)
        return 2
    args.command = bench.command_line(argv)
    stem = bench.run_stem("floor-rates", ROOT, smoke=args.smoke)
    return bench.main(args, "floor_rates", measure, script=__file__, argv=argv, stem=stem,
                      summary=summary, plot=plot)


if __name__ == "__main__":
    sys.exit(main())
