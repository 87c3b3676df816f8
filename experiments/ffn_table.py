"""Remake the expert-FFN table `--experts auto` reads (strata/kernels/moe/ffn_table.json): time
every path for each format over a range of rows per expert with experiments/kernel_bench.py, then
derive the table from that CSV (strata.bench.ffn_table). One command on a GPU:

    python experiments/ffn_table.py                      # kernel_bench over the grid below, then the table
    python experiments/ffn_table.py --from A.csv B.csv   # the table from recorded kernel_bench CSVs
    python experiments/ffn_table.py --smoke              # the CPU interpreter, tiny shapes (a check)

Legend: T tokens of a pass, E experts, K top-k; rows per expert r = T·K/E (qwen3-30b-a3b: E 128,
K 8, so T 64 .. 32768 is r 4 .. 2048).

The grid: qwen3-30b-a3b's expert shape, T in TS, the stock mixes' expert formats (FORMATS), arms
strata-dp / strata-sk (the kernel; the table takes the schedule its launcher picks),
strata-decoded, strata-plane (where plane reads the format), strata-int8 (listed, not chosen by
auto). The kernel_bench CSV and its PNG go
to --out as kernel_bench writes them; the table is written to --table (default: the packaged
one) with the CSVs it came from; a PNG of the chosen path per format and rows beside it.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from strata.bench.ffn_table import derive, write
from strata.kernels.moe.choices import PATHS, TABLE, FfnTable

ROOT = Path(__file__).resolve().parents[1]

FORMATS = ["Q8_0", "Q4_K", "Q6_K", "MXFP4", "IQ4_XS", "Q5_K", "Q4_0", "BF16"]   # most used first
TS = [64, 512, 2048, 8192, 32768]
ARMS = ["strata-dp", "strata-sk", "strata-decoded", "strata-plane", "strata-int8"]


def run_bench(args) -> Path:
    """kernel_bench over the grid; the CSV it wrote."""
    cmd = [sys.executable, str(ROOT / "experiments" / "kernel_bench.py"), "--out", str(args.out),
           "--arms", *ARMS, "--formats", *args.formats, "--label", "ffn_table"]
    cmd += ["--smoke"] if args.smoke else ["--shapes", "qwen3-30b-a3b", "--T", *map(str, args.T)]
    print("ffn_table: " + " ".join(cmd[1:]), file=sys.stderr, flush=True)
    t0 = time.time()
    try:
        subprocess.run(cmd, check=True, timeout=args.budget)
        whole = True
    except subprocess.TimeoutExpired:    # what it measured so far: its partial CSV
        print(f"ffn_table: kernel_bench stopped at --budget {args.budget:g} s; the table takes "
              f"the configurations it finished", file=sys.stderr)
        whole = False
    csvs = sorted((p for p in Path(args.out).glob("kernel_bench_*.csv")
                   if p.name.endswith(".partial.csv") != whole and p.stat().st_mtime >= t0),
                  key=lambda p: p.stat().st_mtime)
    if not csvs:
        raise SystemExit(f"ffn_table: kernel_bench wrote no CSV under {args.out}")
    return csvs[-1]


def plot(table: FfnTable, png: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no PNG", file=sys.stderr)
        return
    for gpu, fmts in table.gpus.items():
        fig, axes = plt.subplots(1, len(fmts), figsize=(3.0 * len(fmts), 3), squeeze=False)
        for ax, (fmt, pts) in zip(axes[0], fmts.items()):
            for path in dict.fromkeys(p for pt in pts for p in pt["tflops"]):
                xy = [(pt["rows"], pt["tflops"][path]) for pt in pts if path in pt["tflops"]]
                ax.plot(*zip(*xy), marker="o", label=path)
            ax.set_xscale("log", base=2)
            ax.set_title(fmt, fontsize=9)
            ax.set_xlabel("rows per expert")
            ax.legend(fontsize=6)
        axes[0][0].set_ylabel("TFLOP/s")
        commits = ", ".join(dict.fromkeys(s["commit"] for s in table.sources))
        fig.suptitle(f"expert FFN paths on {gpu} (auto picks among {', '.join(PATHS)}); "
                     f"measured at {commits}", fontsize=9)
        fig.tight_layout()
        fig.savefig(png, dpi=110)
        plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from", dest="csvs", nargs="+", metavar="CSV",
                    help="derive the table from these kernel_bench CSVs (later ones win)")
    ap.add_argument("--out", type=Path, default=ROOT / "experiments" / "results")
    ap.add_argument("--table", type=Path, default=TABLE, help=f"where to write it ({TABLE.name})")
    ap.add_argument("--formats", nargs="+", default=FORMATS)
    ap.add_argument("--T", nargs="+", type=int, default=TS)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (a check)")
    ap.add_argument("--budget", type=float, default=None, metavar="S",
                    help="stop kernel_bench after S seconds and take what it finished")
    args = ap.parse_args(argv)
    missing = [c for c in args.csvs or () if not Path(c).is_file()]
    if missing:
        print(f"ffn_table: no such CSV {missing[0]}; give kernel_bench CSVs", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    if args.smoke:
        args.formats = [f for f in args.formats if f in ("BF16", "Q8_0", "Q4_0")]
    csvs = [Path(c) for c in args.csvs] if args.csvs else [run_bench(args)]
    table = derive(csvs, root=ROOT)
    write(table, args.table)
    plot(FfnTable(table["gpus"], tuple(table["sources"])), args.table.with_suffix(".png")
         if args.table != TABLE else args.out / "ffn_table.png")
    print(f"ffn_table: {args.table} from {', '.join(map(str, csvs))}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
