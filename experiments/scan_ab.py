"""A/B of the planning rules: legacy list + fixed ring vs. the auto scan (byte-budget ring + bisection).

Sweeps VRAM sizes x presets x expert formats on one GPU, plans both rules, and records the chunk,
the ring (slots and bytes), the bytes_needed probes, and the modelled room spent (bytes_needed /
room). Pure arithmetic from strata's planner: no GPU, no timing; what it bounds is the plan, not
the speed (the seed's +51% came from exactly these two changes on a real rig).

    PYTHONPATH=. python experiments/scan_ab.py [--out experiments/results] [--base REF]

Writes scan_ab.csv (strata.bench long format: one row per case, rule and figure; config = preset,
quant, vram_gib, max_blob, rule, status, plan_rule) and scan_ab.png. Untimed: no gate applies.
"""
from __future__ import annotations

import sys
from itertools import product
from pathlib import Path

from tqdm import tqdm

from strata import bench, config
from strata.blob import BlobLayout
from strata.errors import StrataError
from strata.memory.rig import participants
from strata.memory.scan import plan_prefill
from strata.planning import model_sizes, prompt_layout
from strata.shapes import get_preset

VRAM_GIB = [4, 5, 6, 7, 8, 10, 12, 16, 24, 32, 48, 80]
CASES = {  # preset -> formats whose block fits the shape's widths
    "qwen3-30b-a3b": ["Q2_0", "IQ3_S", "Q4_K", "Q8_0"],
    "seed-512e": ["Q2_0", "Q4_0", "Q8_0"],
    "qwen3-235b-a22b": ["Q2_0", "IQ3_S", "Q4_K", "Q8_0"],
}


def sweep() -> list[dict]:
    rows = []
    policy = config.ring_policy()     # the STRATA_* ring knobs, as strata plan honours them
    jobs = [(p, q, v) for p, qs in CASES.items() for q in qs for v in VRAM_GIB]
    for preset, quant, vram in tqdm(jobs, desc="scan_ab", file=sys.stderr):
        shape = get_preset(preset)
        blob = BlobLayout.make(shape.d_model, shape.d_expert, quant).size
        base = dict(preset=preset, quant=quant, vram_gib=vram, max_blob=blob)
        try:
            parts, _ = participants(model_sizes(shape), [blob] * shape.n_layer, [vram << 30])
        except StrataError:
            for rule in ("legacy", "auto"):   # dense weights alone overflow this card
                rows.append(base | dict(rule=rule, status="no-cache"))
            continue
        lay = prompt_layout(shape, blob)
        for rule in ("legacy", "auto"):
            try:
                p = plan_prefill(lay, parts, scan=rule, policy=policy)
            except StrataError:
                rows.append(base | dict(rule=rule, status="no-fit", room=parts[0].room))
                continue
            rows.append(base | dict(rule=rule, status="ok", plan_rule=p.rule, chunk=p.chunk,
                                    ring=p.ring, ring_bytes=p.ring_bytes,
                                    bytes_needed=p.bytes_needed, room=p.room, probes=p.probes,
                                    room_spent=round(p.bytes_needed / p.room, 4)))
    return rows


FIGURES = {  # figure -> (unit, bound in words)
    "chunk": ("tokens", ""), "ring": ("slots", ""), "ring_bytes": ("bytes", ""),
    "bytes_needed": ("bytes", "room: the GPU's free VRAM after the cache"),
    "room": ("bytes", ""), "probes": ("plans", ""),
    "room_spent": ("fraction", "1.0 = all the room"),
}
CONFIG = ("preset", "quant", "vram_gib", "max_blob", "rule", "status", "plan_rule")


def measure(args, rec: bench.Recorder) -> None:
    """Each sweep row becomes long-format rows; a case that could not plan keeps one row
    (figure "planned" = 0) so it is not lost."""
    for r in sweep():
        cfg = {k: r[k] for k in CONFIG if k in r}
        rec.add("planned", float(r["status"] == "ok"), "bool", **cfg)
        if r["status"] != "ok":
            continue
        for fig, (unit, bound) in FIGURES.items():
            bv = r["room"] if fig == "bytes_needed" else 1.0 if fig == "room_spent" else None
            rec.add(fig, r[fig], unit, bound=bound, bound_value=bv, **cfg)


def pivot(long_rows: list[dict], label: str = "tree") -> list[dict]:
    """Long rows of one label back to one dict per (case, rule), figures as keys."""
    out: dict = {}
    for r in long_rows:
        if r["label"] != label:
            continue
        key = tuple(sorted(r["config"].items()))
        row = out.setdefault(key, dict(r["config"]))
        if r["figure"] != "planned":
            row[r["figure"]] = r["value"]
    return list(out.values())


def plot(long_rows: list[dict], path: Path) -> None:
    """Chunk and ring per VRAM size; the --base run (if any) dotted and faint beside the tree."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    presets = list(CASES)
    labels = list(dict.fromkeys(r["label"] for r in long_rows))
    fig, axes = plt.subplots(2, len(presets), figsize=(5.2 * len(presets), 8), squeeze=False)
    by_label = {label: pivot(long_rows, label) for label in labels}
    for j, preset in enumerate(presets):
        for label, quant, (rule, style) in product(labels, CASES[preset],
                                                   (("auto", "-"), ("legacy", "--"))):
            tag, alpha = ("", 1.0) if label == "tree" else (f" @{label}", 0.45)
            pts = [(r["vram_gib"], r) for r in by_label[label] if r["preset"] == preset
                   and r["quant"] == quant and r["rule"] == rule and r["status"] == "ok"]
            if not pts:
                continue
            xs = [v for v, _ in pts]
            line, = axes[0][j].plot(xs, [r["chunk"] for _, r in pts], style, marker="o",
                                    ms=3, alpha=alpha, label=f"{quant} {rule}{tag}")
            axes[1][j].plot(xs, [r["ring_bytes"] / 2**20 for _, r in pts], style, marker="o",
                            ms=3, alpha=alpha, color=line.get_color(), label=f"{quant} {rule}{tag}")
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


def summary(long_rows: list[dict]) -> None:
    for label in dict.fromkeys(r["label"] for r in long_rows):
        rows = pivot(long_rows, label)
        pairs = {}
        for r in rows:
            if r["status"] == "ok":
                pairs.setdefault((r["preset"], r["quant"], r["vram_gib"]), {})[r["rule"]] = r
        both = [p for p in pairs.values() if len(p) == 2]
        bigger = sum(p["auto"]["chunk"] > p["legacy"]["chunk"] for p in both)
        smaller = sum(p["auto"]["chunk"] < p["legacy"]["chunk"] for p in both)
        only_auto = sum(1 for p in pairs.values() if set(p) == {"auto"})
        print(f"[{label}] {len(both)} cases planned by both rules: auto's chunk bigger in "
              f"{bigger}, smaller in {smaller}; {only_auto} cases only auto could plan")


def main(argv=None) -> int:
    ap = bench.parser(__doc__, out=Path(__file__).parent / "results")
    args = ap.parse_args(argv)
    return bench.main(args, "scan_ab", measure, script=__file__, argv=argv, plot=plot,
                      summary=summary)


if __name__ == "__main__":
    sys.exit(main())
