"""The expert-FFN table `--experts auto` reads (strata/kernels/moe/ffn_table.json), derived from
experiments/kernel_bench.py's CSV rows: one source, the measurement, so the table is remade by
`python experiments/ffn_table.py` on a GPU (or `--from CSV ...` from recorded runs) and a test
derives it again from the CSVs it names and holds the two equal.

Legend: T tokens of a pass, E experts, K top-k, r = T·K/E rows per expert (the axis: what an
expert GEMM sees), path one of PATHS.

Per (GPU, format) the table holds points (r, {path: TFLOP/s}). "kernel" is the fused GEMM as
its launcher runs it by default (the schedule the CSV's strata-auto tile row names: strata-dp or
strata-sk), "decoded" decode-once + the BF16 GEMM, "plane" the plane-layout GEMM (a landing
choice of the engine, listed for `--experts plane`; auto does not switch to it per call), "int8"
the int8 GEMM on q8_1 activations (other numerics: listed for `--experts int8` until its KLD
is measured; auto does not pick it), "plane-int8" the same numbers over Q8_0 / Q4_0 / Q4_K planes
(a landing choice too, listed for `--experts plane-int8`). Rows of
later CSVs replace those of earlier ones at the same (GPU, format, shape, T).
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from strata.errors import StrataError

ARM_PATH = {"strata-decoded": "decoded", "strata-plane": "plane", "strata-int8": "int8",
            "strata-plane-int8": "plane-int8"}
# + "kernel": the fused GEMM's arm of the schedule its launcher picks
SCHEDULE_ARM = {"dp": "strata-dp", "stream_k": "strata-sk"}
VERSION = 1


def derive(csvs: Iterable[str | Path], root: str | Path | None = None) -> dict:
    """The table (ffn_table.json's content) from kernel_bench CSVs, in the order given; each
    source is named relative to `root` (the repository) when it lies under it."""
    from strata.bench.expert_gemm import SHAPES, SMOKE_SHAPES
    from strata.bench.record import read_csv
    shapes = {**SHAPES, **SMOKE_SHAPES}
    cells: dict[tuple, dict] = {}          # (gpu, fmt, shape, T) -> {"rows", paths, source}
    sources = []
    for p in map(Path, csvs):
        rows = read_csv(p)
        if not rows:
            raise StrataError(f"{p}: no rows; give a kernel_bench CSV")
        under = root is not None and p.resolve().is_relative_to(Path(root).resolve())
        name = str(p.resolve().relative_to(Path(root).resolve())) if under else str(p)
        sources.append({"csv": name, "commit": rows[0]["commit"], "gpu": rows[0]["gpu"]})
        sched = {}
        for r in rows:
            c = r["config"]
            if r["figure"] == "tile" and c.get("arm") == "strata-auto":
                sched[(c["shape"], c["format"], c["T"])] = SCHEDULE_ARM[r["value"]]
        got: dict[tuple, dict] = {}
        for r in rows:
            c = r["config"]
            if r["figure"] != "tflops":
                continue
            key = (c["shape"], c["format"], c["T"])
            arm = c["arm"]
            path = ARM_PATH.get(arm) or ("kernel" if arm == sched.get(key, "strata-dp") else None)
            if path is not None:
                got.setdefault(key, {})[path] = round(float(r["value"]), 2)
        for (shape, fmt, T), paths in got.items():
            s = shapes[shape]
            cells[(rows[0]["gpu"], fmt, shape, T)] = {
                "rows": T * s.top_k / s.n_expert, "shape": shape, "T": T,
                "tflops": dict(sorted(paths.items())), "source": name}
    gpus: dict[str, dict[str, list]] = {}
    for (gpu, fmt, _, _), cell in sorted(cells.items(), key=lambda kv: (kv[0][:2], kv[1]["rows"],
                                                                        kv[0][2])):
        gpus.setdefault(gpu, {}).setdefault(fmt, []).append(cell)
    return {"version": VERSION, "sources": sources, "gpus": gpus}


def write(table: dict, path: str | Path) -> None:
    """ffn_table.json, written whole or not at all."""
    from strata.atomic import atomic_write
    with atomic_write(path) as tmp:
        Path(tmp).write_text(json.dumps(table, indent=1) + "\n")
