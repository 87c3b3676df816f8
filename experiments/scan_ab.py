"""A/B of the planning rules: legacy list + fixed ring vs. the auto scan (byte-budget ring + bisection).

Sweeps VRAM sizes x presets x expert formats on one GPU, plans both rules, and records the chunk,
the ring (slots and bytes), the bytes_needed probes, and the modelled room spent (bytes_needed /
room). Pure arithmetic from strata's planner: no GPU, no timing; what it bounds is the plan, not
the speed (the seed's +51% came from exactly these two changes on a real rig).

    PYTHONPATH=. python experiments/scan_ab.py [--out experiments/results]

Writes scan_ab.csv (long format: one row per case and rule) and scan_ab.png.
"""
from __future__ import annotations

import argparse
import csv
import datetime as dt
import subprocess
import sys
from pathlib import Path

from tqdm import tqdm

from strata.blob import BlobLayout
from strata.errors import StrataError
from strata.memory.layout import PromptLayout
from strata.memory.rig import participants
from strata.memory.scan import plan_prefill
from strata.shapes import get_preset

VRAM_GIB = [4, 5, 6, 7, 8, 10, 12, 16, 24, 32, 48, 80]
CASES = {  # preset -> formats whose block fits the shape's widths
    "qwen3-30b-a3b": ["Q2_0", "IQ3_S", "Q4_K", "Q8_0"],
    "seed-512e": ["Q2_0", "Q4_0", "Q8_0"],
    "qwen3-235b-a22b": ["Q2_0", "IQ3_S", "Q4_K", "Q8_0"],
}


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except Exception:
        return "unknown"


def sweep() -> list[dict]:
    rows, stamp, rev = [], dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), commit()
    jobs = [(p, q, v) for p, qs in CASES.items() for q in qs for v in VRAM_GIB]
    for preset, quant, vram in tqdm(jobs, desc="scan_ab", file=sys.stderr):
        shape = get_preset(preset)
        blob = BlobLayout.make(shape.d_model, shape.d_expert, quant).size
        base = dict(time=stamp, commit=rev, preset=preset, quant=quant, vram_gib=vram,
                    max_blob=blob)
        try:
            parts, _ = participants(shape, [blob] * shape.n_layer, [vram << 30])
        except StrataError:
            for rule in ("legacy", "auto"):   # dense weights alone overflow this card
                rows.append(base | dict(rule=rule, status="no-cache"))
            continue
        lay = PromptLayout(shape, blob)
        for rule in ("legacy", "auto"):
            try:
                p = plan_prefill(lay, parts, scan=rule)
            except StrataError:
                rows.append(base | dict(rule=rule, status="no-fit", room=parts[0].room))
                continue
            rows.append(base | dict(rule=rule, status="ok", plan_rule=p.rule, chunk=p.chunk,
                                    ring=p.ring, ring_bytes=p.ring_bytes,
                                    bytes_needed=p.bytes_needed, room=p.room, probes=p.probes,
                                    room_spent=round(p.bytes_needed / p.room, 4)))
    return rows


def write_csv(rows: list[dict], path: Path) -> None:
    cols = ["time", "commit", "preset", "quant", "vram_gib", "max_blob", "rule", "status",
            "plan_rule", "chunk", "ring", "ring_bytes", "bytes_needed", "room", "probes",
            "room_spent"]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({c: r.get(c, "") for c in cols})


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    presets = list(CASES)
    fig, axes = plt.subplots(2, len(presets), figsize=(5.2 * len(presets), 8), squeeze=False)
    for j, preset in enumerate(presets):
        for quant in CASES[preset]:
            for rule, style in (("auto", "-"), ("legacy", "--")):
                pts = [(r["vram_gib"], r) for r in rows if r["preset"] == preset
                       and r["quant"] == quant and r["rule"] == rule and r["status"] == "ok"]
                if not pts:
                    continue
                xs = [v for v, _ in pts]
                line, = axes[0][j].plot(xs, [r["chunk"] for _, r in pts], style, marker="o",
                                        ms=3, label=f"{quant} {rule}")
                axes[1][j].plot(xs, [r["ring_bytes"] / 2**20 for _, r in pts], style,
                                marker="o", ms=3, color=line.get_color(), label=f"{quant} {rule}")
        axes[0][j].set_title(f"{preset}: chunk (tokens)")
        axes[1][j].set_title(f"{preset}: ring (MiB)")
        for i in (0, 1):
            axes[i][j].set_xscale("log", base=2)
            axes[i][j].set_xlabel("VRAM per GPU (GiB)")
            axes[i][j].grid(alpha=0.3)
        axes[0][j].set_yscale("log", base=2)
        axes[0][j].legend(fontsize=7, ncol=2)
    fig.suptitle("strata plan: legacy (dashed: ring 384 slots, list of chunks) vs auto (solid: "
                 "byte-budget ring, bisection)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = sweep()
    write_csv(rows, out / "scan_ab.csv")
    plot(rows, out / "scan_ab.png")
    ok = [r for r in rows if r["status"] == "ok"]
    pairs = {}
    for r in ok:
        pairs.setdefault((r["preset"], r["quant"], r["vram_gib"]), {})[r["rule"]] = r
    both = [p for p in pairs.values() if len(p) == 2]
    bigger = sum(p["auto"]["chunk"] > p["legacy"]["chunk"] for p in both)
    smaller = sum(p["auto"]["chunk"] < p["legacy"]["chunk"] for p in both)
    only_auto = sum(1 for p in pairs.values() if set(p) == {"auto"})
    print(f"{len(both)} cases planned by both rules: auto's chunk bigger in {bigger}, smaller in "
          f"{smaller}; {only_auto} cases only auto could plan; wrote {out}/scan_ab.csv and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
