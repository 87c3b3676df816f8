"""Which expert-FFN path `--experts auto` runs for a pass: read from the measured table
(ffn_table.json beside this module; strata.bench.ffn_table derives it from kernel_bench's CSVs,
experiments/ffn_table.py remakes it on a GPU), not from constants.

Legend: r rows per expert of the pass (its routed (token, expert) pairs / E), path one of
"kernel" (the fused GEMM decoding in its loop) or "decoded" (decode-once + the BF16 GEMM).

    table = FfnTable.load()
    table.choose("NVIDIA H200", [("Q4_K", 2/3), ("Q6_K", 1/3)], r)   # -> "kernel" | "decoded"

A pass's time is the sum of its matrices' (gate and up: 2/3 of the FLOPs, down 1/3), each at its
format's rate for the path; the rate at r is interpolated linearly in log2(r) between the two
measured points around it (held flat above the last; below the first the fused kernel runs).
A format the table lacks for the GPU takes its own curve measured on another GPU where there is
one (`curve`: the paths' order is the format's decode against its GEMM, which GPUs share more
than two formats do), else the curve of its decode class's measured format (`proxy`: the
word-decoded formats, else the format family: K-quants, i-quants, legacy, mx, plain); a GPU the
table lacks takes the table's first GPU; `describe` says which was used.
"""
from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path

from strata.errors import StrataError

TABLE = Path(__file__).with_name("ffn_table.json")
PATHS = ("kernel", "decoded")     # what auto may switch between call by call


def decode_class(fmt: str) -> str:
    """How the kernels decode `fmt`: "words" (codes loaded as words: Q8_0, Q4_0), else its
    family in strata.formats (plain, legacy, kquant, iquant, mx)."""
    from strata.formats.table import get_format
    f = get_format(fmt)
    return "words" if f.code_words else f.family


@dataclass(frozen=True)
class FfnTable:
    gpus: dict        # gpu -> format -> [{"rows", "tflops": {path: TFLOP/s}, ...}] by rows
    sources: tuple

    @classmethod
    def load(cls, path: str | Path = TABLE) -> "FfnTable":
        try:
            t = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise StrataError(f"cannot read the expert-FFN table {path}: {e}; remake it with "
                              f"python experiments/ffn_table.py") from None
        if not t.get("gpus"):
            raise StrataError(f"the expert-FFN table {path} holds no GPU; remake it with "
                              f"python experiments/ffn_table.py")
        return cls(t["gpus"], tuple(t.get("sources", ())))

    def gpu(self, name: str) -> str:
        """The table's entry for GPU `name`: its own, else the first measured."""
        return name if name in self.gpus else next(iter(self.gpus))

    def proxy(self, gpu: str, fmt: str) -> str:
        """The measured format whose curve `fmt` takes on `gpu`: itself, else the measured
        format of its decode class with the most points (then by name), else the quantized one
        with the most points."""
        fmts = self.gpus[self.gpu(gpu)]
        if fmt in fmts:
            return fmt
        same = [f for f in fmts if decode_class(f) == decode_class(fmt)] or \
            [f for f in fmts if decode_class(f) != "plain"] or list(fmts)
        return max(sorted(same), key=lambda f: len(fmts[f]))

    def curve(self, gpu: str, fmt: str) -> tuple[str, str]:
        """(table GPU, table format) whose points `fmt` on `gpu` reads: its own GPU's entry
        when it measured `fmt`, else another GPU's that did (the most points), else its own
        GPU's `proxy`."""
        used = self.gpu(gpu)
        if fmt not in self.gpus[used]:
            other = [g for g in self.gpus if fmt in self.gpus[g]]
            if other:
                return max(other, key=lambda g: len(self.gpus[g][fmt])), fmt
        return used, self.proxy(used, fmt)

    def points(self, gpu: str, fmt: str) -> list:
        g, f = self.curve(gpu, fmt)
        return self.gpus[g][f]

    def rate(self, gpu: str, fmt: str, path: str, rows: float) -> float:
        """TFLOP/s of `path` for `fmt` at `rows` rows per expert (interpolated in log2 rows)."""
        pts = [(math.log2(p["rows"]), p["tflops"][path])
               for p in self.points(gpu, fmt) if path in p["tflops"]]
        if not pts:
            raise StrataError(f"the expert-FFN table has no {path!r} figure for {fmt} on {gpu}")
        x = math.log2(max(rows, 1e-9))
        if x <= pts[0][0]:
            return pts[0][1]
        for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
            if x <= x1:
                return y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 > x0 else y1
        return pts[-1][1]

    def choose(self, gpu: str, mats: list[tuple[str, float]], rows: float,
               paths: tuple[str, ...] = PATHS) -> str:
        """The path of least time for a pass whose matrices are `mats` [(format, FLOP share)].
        Below the fewest rows measured for them the table says nothing: the fused kernel, which
        reads each weight once and needs no decode buffer (decode-once pays a whole expert's
        decode for those few rows)."""
        least = max(self.points(gpu, f)[0]["rows"] for f, _ in mats)
        if rows < least and "kernel" in paths:
            return "kernel"

        def seconds(path):
            return sum(share / self.rate(gpu, fmt, path, rows) for fmt, share in mats)
        return min(paths, key=seconds)

    def describe(self, gpu: str, fmts: list[str]) -> str:
        """One line: the table entry and curves `--experts auto` reads for these formats."""
        used = self.gpu(gpu)
        curves = ", ".join(f"{f}" + (f" as {p}" if p != f else "") +
                           (f" (measured on {g})" if g != used else "")
                           for f in dict.fromkeys(fmts) for g, p in [self.curve(gpu, f)])
        note = "" if used == gpu else f" (no table for {gpu})"
        commits = ", ".join(dict.fromkeys(s["commit"] for s in self.sources))
        return f"experts auto: {used} table{note}, measured at {commits}: {curves}"


@functools.cache
def table() -> FfnTable:
    """The packaged table (read once)."""
    return FfnTable.load()


@functools.cache
def device_name(index: int) -> str:
    import torch
    return torch.cuda.get_device_name(index)
