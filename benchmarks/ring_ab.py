"""The ring A/B: one prompt read with the plan's own ring and with explicit rings (`--ring N`),
tokens/s beside each read's PCIe bound, one line per model (CSV + PNG).

    python3 benchmarks/ring_ab.py PACK --vram 24GiB -p 8192 --rings 32,48,64,96 --out DIR
    python3 benchmarks/ring_ab.py PACK --vram 12GiB --rings plan/256,780/130 --out DIR
    python3 benchmarks/ring_ab.py --from DIR/*.csv --out DIR     # bench CSVs already made

Each arm is a fresh `strata bench PACK --vram V -p P -r R -o csv` process (`--ring N` for the
explicit arms), so every arm plans, borrows and warms up alone. An explicit ring changes three
things at once: the ring's run-ahead, the passes (half the ring's experts a pass,
strata.memory.layout.pass_experts), and the expert cache, which its slots leave, so more bytes
stream (the bound falls as the ring grows). An arm `R/B` pins the pass to B experts (`--batch
B`); `plan` for R keeps the plan's ring: `plan/256,780/130` sets the pass apart from the
run-ahead.
"""
from __future__ import annotations

import argparse
import csv
import re
import subprocess
import sys
from pathlib import Path

from strata.atomic import atomic_write
from strata.errors import StrataError

KEEP = ("model", "vram", "test", "chunk", "ring", "batch", "reps", "tokens_per_s",
        "tokens_per_s_sd", "bytes_streamed", "h2d_gbps", "pcie_bound_tokens_per_s",
        "compute_floor_tokens_per_s", "of_bound", "wait_s")


def arms_of(text: str) -> list[tuple[int | None, int | None]]:
    """`--rings`' arms as (ring, batch): "64" -> (64, None), "780/130" -> (780, 130),
    "plan/256" -> (None, 256). ValueError on anything else."""
    out = []
    for item in filter(None, text.split(",")):
        ring, _, batch = item.partition("/")
        try:
            r = None if ring == "plan" else int(ring)
            b = int(batch) if batch else None
        except ValueError:
            raise ValueError(item) from None
        if (r is not None and r < 1) or (b is not None and b < 1) or (r is None and b is None):
            raise ValueError(item)
        out.append((r, b))
    return out


def bench(pack: str, vram: str, P: int, reps: int, ring: int | None, batch: int | None,
          out: Path) -> Path:
    """One arm's `strata bench` CSV, whole or absent (its stderr beside it)."""
    arm = f"{ring or 'plan'}" + (f"b{batch}" if batch else "")
    name = out / f"ring_ab-{Path(pack).stem}-{P}-{arm}.csv"
    cmd = [sys.executable, "-m", "strata.cli", "bench", pack, "--vram", vram, "-p", str(P),
           "-r", str(reps), "-o", "csv"] + (["--ring", str(ring)] if ring else []) + \
        (["--batch", str(batch)] if batch else [])
    print("[ring_ab]", " ".join(cmd[2:]), flush=True)
    with atomic_write(name) as tmp, open(tmp, "w") as f, \
            name.with_suffix(".err").open("w") as e:
        subprocess.run(cmd, stdout=f, stderr=e, check=False)
    return name


def pass_of(path) -> str:
    """The pinned pass of an arm's CSV, from the name bench() gave it (`...-780b130.csv`: 130);
    "" for the plan's own (half the ring) or a CSV named otherwise. bench's rows do not carry
    it."""
    m = re.search(r"-(?:\d+|plan)b(\d+)\.csv$", str(path))
    return m.group(1) if m else ""


def rows_of(paths) -> list[dict]:
    rows = []
    for p in paths:
        try:
            text = Path(p).read_text()
        except OSError as e:
            raise StrataError(f"ring_ab: cannot read {p}: {e.strerror}; give bench CSVs "
                              f"that exist") from None
        for r in csv.DictReader(text.splitlines()):
            if r.get("tokens_per_s"):
                rows.append({k: r.get(k, "") for k in KEEP} | {"batch": pass_of(p)})
    return rows


def num(x: str) -> float | None:
    """A CSV cell as a number; None where the run measured none (the CPU has no bound)."""
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def plot(rows: list[dict], png: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    series = sorted({(r["model"], r["test"], r["batch"]) for r in rows})
    for (model, test, batch), color in zip(series,
                                           plt.rcParams["axes.prop_cycle"].by_key()["color"]):
        # a STAGE ring (a prompt under stream_all_min) has no slot count to draw at
        mine = sorted((r for r in rows if (r["model"], r["test"], r["batch"]) ==
                       (model, test, batch) and r["ring"].isdigit()),
                      key=lambda r: int(r["ring"]))
        if not mine:
            continue
        x = [int(r["ring"]) for r in mine]
        ax.plot(x, [float(r["tokens_per_s"]) for r in mine], "o-", color=color,
                label=f"{model.split(' ')[0]} {mine[0]['vram']} {test}"
                + (f", passes of {batch}" if batch else ", passes of half the ring"))
        bound = [num(r["pcie_bound_tokens_per_s"]) for r in mine]
        if None not in bound:
            ax.plot(x, bound, ":", color=color,
                    label="  its PCIe bound (bytes streamed at that ring)")
    ax.set_xscale("log")
    ax.set_xlabel("ring slots (log)")
    ax.set_ylabel("tokens/s")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    with atomic_write(png) as tmp:
        fig.savefig(tmp, dpi=120, format="png")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pack", nargs="?")
    ap.add_argument("--vram", default="24GiB")
    ap.add_argument("-p", type=int, default=8192)
    ap.add_argument("-r", type=int, default=2)
    ap.add_argument("--rings", default="",
                    help="arms beside the plan's: N, N/B (passes of B) or plan/B, comma-separated")
    ap.add_argument("--batch", type=int, default=None,
                    help="experts a pass, every arm that names none")
    ap.add_argument("--from", dest="sources", nargs="*", default=None,
                    help="bench CSVs already made (no reads)")
    ap.add_argument("--name", default="ring_ab")
    ap.add_argument("--title", default="")
    ap.add_argument("--out", type=Path, default=Path("."))
    a = ap.parse_args(argv)
    if (a.pack is None) == (a.sources is None):
        ap.error("give a PACK to read, or --from CSVs already made (one of the two)")
    try:
        arms = [(None, a.batch)] + [(r, b or a.batch) for r, b in arms_of(a.rings)]
    except ValueError as e:
        ap.error(f"--rings takes arms like 32,64,780/130,plan/256; {e} is not one")
    try:
        a.out.mkdir(parents=True, exist_ok=True)
        paths = a.sources if a.sources is not None else \
            [bench(a.pack, a.vram, a.p, a.r, ring, batch, a.out) for ring, batch in arms]
        rows = rows_of(paths)
        if not rows:
            raise StrataError("ring_ab: no bench rows to report (see the arms' .err files)")
        dst = a.out / f"{a.name}.csv"
        with atomic_write(dst) as tmp, open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=KEEP)
            w.writeheader()
            w.writerows(rows)
        plot(rows, dst.with_suffix(".png"), a.title)
    except StrataError as e:
        print(e, file=sys.stderr)
        return 2
    except OSError as e:
        print(f"ring_ab: {e.strerror}: {e.filename}; give an --out folder that can be written",
              file=sys.stderr)
        return 2
    for r in rows:
        of = num(r["of_bound"])
        print(f"[ring_ab] {r['model'][:24]:24} {r['test']} ring {r['ring']:>5}"
              + (f" pass {r['batch']}" if r["batch"] else "") + ": "
              f"{float(r['tokens_per_s']):9,.0f} tok/s"
              + ("" if of is None else f", {of:.2f} of its bound"))
    print(f"wrote {dst} and {dst.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
