"""A PNG of a `strata bench -o csv` file: tokens/s per prompt beside its PCIe bound and compute
floor (the run's own columns), for the results that came back from a device call as a CSV only;
an `arm` column (several runs in one file) and `peak_vram` join each bar's label where present.

    python benchmarks/plot_bench_csv.py BENCH.csv [OUT.png] [--title T]
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("png", nargs="?")
    ap.add_argument("--title", default="")
    a = ap.parse_args(argv)
    src = Path(a.csv)
    try:
        rows = [r for r in csv.DictReader(src.open()) if r.get("tokens_per_s")]
    except OSError as e:
        print(f"plot_bench_csv: cannot read {src}: {e.strerror}", file=sys.stderr)
        return 2
    need = {"test", "model", "vram", "tokens_per_s", "of_bound", "pcie_bound_tokens_per_s",
            "compute_floor_tokens_per_s"}
    if not rows or not need <= rows[0].keys():
        print(f"plot_bench_csv: {src} is not a `strata bench -o csv` file", file=sys.stderr)
        return 2
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(7, 4))
    w = 0.27
    for i, (key, label) in enumerate((("tokens_per_s", "strata"),
                                      ("pcie_bound_tokens_per_s", "PCIe bound"),
                                      ("compute_floor_tokens_per_s", "compute floor"))):
        vals = [float(r[key] or 0) for r in rows]
        bars = ax.bar([j + (i - 1) * w for j in x], vals, w, label=label)
        if key == "tokens_per_s":
            for b, r in zip(bars, rows):
                ax.annotate(f"{float(r['tokens_per_s']):,.0f}\n{float(r['of_bound']):.2f} of bound",
                            (b.get_x() + b.get_width() / 2, b.get_height()), ha="center",
                            va="bottom", fontsize=7)
    # a file of several runs may name each in an `arm` column; a row's peak VRAM, where it has one
    ax.set_xticks(list(x), [" ".join(v for v in (r.get("arm"), r["test"],
                                                 r.get("peak_vram") and f"\npeak {r['peak_vram']}")
                                     if v) for r in rows], fontsize=7)
    ax.set_ylabel("tokens/s")
    ax.set_title(a.title or f"{rows[0]['model']}, --vram {rows[0]['vram']}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(a.png) if a.png else src.with_suffix(".png")
    part = out.with_name(out.name + ".part")
    fig.savefig(part, dpi=120, format="png")
    part.replace(out)          # whole or not at all
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
