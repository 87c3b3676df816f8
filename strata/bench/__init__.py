"""strata.bench: the one convention every experiment script follows.

    from strata import bench

    def measure(args, rec: bench.Recorder) -> None:
        x = make_inputs(args)
        t = rec.timed(lambda: kernel(x), what="kernel == reference",
                      check=lambda: torch.equal(kernel(x), reference(x)))   # the gate
        rec.add("kernel time", t.median_ms, "ms", gate="kernel == reference", timer=t.timer,
                shape=args.n)

    def main(argv=None):
        ap = bench.parser(__doc__)                  # --out --label --base --warmup --repeats
        ap.add_argument("--n", type=int, default=4096)
        return bench.main(ap.parse_args(argv), "kernel", measure, script=__file__, argv=argv)

`bench.main` runs `measure` on the working tree (`rec.flush()` writes `<stem>.partial.csv` as it
goes, so a long run cut short keeps what it measured), adds the rows of the same script run at
`--base REF` (from a temporary git worktree), writes `<out>/<stem>.csv` (long format, COLUMNS) and
a PNG (the script's own plot, or `plot.bars`), prints the figures, and returns the exit status:
1 with nothing written when a gate refused.

What several scripts share lives here too, so no script imports another: `strata.bench.roofline`
(the measured H2D, grouped-GEMM and attention rates and the bounds built from them),
`strata.bench.flops` (the FLOPs of each part of the compute floor, per architecture),
`strata.bench.expert_gemm` (the expert-GEMM shapes, inputs, dense baseline and check bounds) and
`strata.bench.text` (the text the perplexity experiments read).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from strata.bench.base import run_base, strip_own_args
from strata.bench.gate import GateRefused, pytest_gate, run_check
from strata.bench.plot import bars
from strata.bench.record import COLUMNS, commit_of, gpu_name, read_csv, write_csv
from strata.bench.recorder import Recorder
from strata.bench.timing import CPU_TIMER, CUDA_TIMER, WALL_TIMER, Timing, time_fn
from strata.errors import StrataError

__all__ = ["run_stem", "command_line", "parser", "main", "Recorder", "Timing", "time_fn", "GateRefused", "pytest_gate",
           "run_check", "run_base", "strip_own_args", "write_csv", "read_csv", "COLUMNS",
           "bars", "commit_of", "gpu_name", "CUDA_TIMER", "CPU_TIMER", "WALL_TIMER"]


def run_stem(name: str, root: str | Path, *, smoke: bool = False) -> str:
    """A results file's stem: `name`-<gpu slug>-<commit of root>[-smoke] (the benchmarks/ naming)."""
    slug = "".join(c if c.isalnum() else "-" for c in gpu_name()).strip("-").lower()
    return f"{name}-{slug}-{commit_of(root)}{'-smoke' if smoke else ''}"


def command_line(argv: list[str] | None) -> str:
    """The command that ran a script, for its rows (`argv` as main got it; None: sys.argv)."""
    import shlex
    return shlex.join([sys.executable, *sys.argv]) if argv is None else shlex.join(argv)


def parser(doc: str | None, *, out: str | Path | None = None, warmup: int = 5,
           repeats: int = 20, settle: float = 0.0) -> argparse.ArgumentParser:
    """An ArgumentParser with the harness's options; the script adds its own."""
    ap = argparse.ArgumentParser(description=(doc or "").strip().split("\n")[0],
                                 epilog=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", "--out-dir", dest="out", default=str(out) if out else None,
                    help="folder for the CSV and PNG (default: the script's results folder)")
    ap.add_argument("--label", default="tree", help="label of this run's rows (default: tree)")
    ap.add_argument("--base", metavar="REF", default=None,
                    help="also run this script at git REF (a temporary worktree) and put both "
                         "runs in the CSV, labelled tree and REF")
    ap.add_argument("--warmup", type=int, default=warmup, help="untimed runs before timing")
    ap.add_argument("--repeats", type=int, default=repeats, help="timed runs (median reported)")
    ap.add_argument("--settle", type=float, default=settle,
                    help="seconds each timed arm runs back to back before its repeats count, "
                         "so arms compare at the clocks the GPU holds (CUDA only; default "
                         f"{settle})")
    return ap


def main(args: argparse.Namespace, experiment: str, measure, *, script: str | Path,
         argv: list[str] | None = None, stem: str | None = None, plot=None,
         summary=None) -> int:
    """Run `measure(args, rec)`, merge the --base run, write CSV + PNG. See the module docstring.

    plot(rows, png_path) draws the script's own figure (default: `bars`); summary(rows) prints
    the script's own lines (default: one line per row)."""
    script = Path(script).resolve()
    out = Path(args.out) if args.out else script.parent / "results"
    argv = list(sys.argv[1:] if argv is None else argv)
    stem = stem or experiment
    rec = Recorder(experiment, args.label, root=script.parent, warmup=args.warmup,
                   repeats=args.repeats, settle_s=getattr(args, "settle", 0.0))
    rec.partial_path = out / f"{stem}.partial.csv"
    try:
        measure(args, rec)
        rows = rec.rows
        if not rows:
            raise StrataError(f"{experiment}: the run produced no figures")
        if args.base:
            rows = rows + run_base(args.base, script, argv)
    except GateRefused as e:
        rec.partial_path.unlink(missing_ok=True)   # a wrong kernel anywhere: report nothing
        print(f"{experiment}: REFUSED, no figures reported: {e}", file=sys.stderr)
        return 1
    except StrataError as e:       # bad input: one line, exit 2 (a partial CSV stays, named so)
        print(f"{experiment}: {e}", file=sys.stderr)
        return 2
    csv_path = write_csv(rows, out / f"{stem}.csv")
    rec.partial_path.unlink(missing_ok=True)
    png = out / f"{stem}.png"
    (plot or (lambda rs, p: bars(rs, p, title=f"{experiment} ({rs[0]['gpu']})")))(rows, png)
    if summary:
        summary(rows)
    else:
        for r in rows:
            cfg = " ".join(f"{k}={v}" for k, v in r["config"].items())
            bound = f"  (bound: {r['bound']})" if r["bound"] else ""
            val = f"{r['value']:.6g}" if isinstance(r["value"], float) else r["value"]
            print(f"[{r['label']}] {r['figure']} {cfg}: {val} {r['unit']}{bound}")
    print(f"wrote {csv_path} and {png}")
    return 0
