"""A/B of how decoded weights reach the tensor cores in moe_ffn (the tile's `dot`, pinned with
`pin_tile(dot=...)`).

Legend: T tokens, D hidden, F expert width, E experts, K top-k.

Variants (strata.kernels.moe.tiles.DOT_VARIANTS): "decode" (every weight decoded to bf16),
"scaled" (codes into the dot, each run's scale on the partial sum), "scaled_swap" (as scaled, the
dot transposed so the codes are the MMA's register operand), the swap_fast* paths of Q8_0/Q4_0
(see strata.kernels.moe.tiles). The aligned-word pair* dots were retired after this A/B measured them
slower (experiments/results/decoded_dot_pair_ab.csv). Each variant is checked against
moe_ffn_torch (the named DECODED_REL bound) before it is timed, on each shape's first T, for
the heuristic tile and a few pinned ones; grouped_mm on bf16 weights is the reference speed.
Writes experiments/results/decoded_dot_ab.csv (+ PNG) with GPU, commit and command.

    python experiments/decoded_dot_ab.py                  # GPU
    python experiments/decoded_dot_ab.py --smoke          # tiny shape in the interpreter
"""
from __future__ import annotations

import argparse
import csv
import datetime as dt
import sys
import time
from pathlib import Path

import torch

from strata import bench
from strata.bench import expert_gemm as eg
from strata.bench.roofline import expert_flops
from strata.kernels import moe_ffn, moe_ffn_torch, pin_tile, topk_route
from strata.kernels.moe.ffn import last_launch
from strata.kernels.moe.tiles import DOT_VARIANTS, TileConfig
from strata.shapes import get_preset

TILES = [(128, 128, 64, 8, 3), (64, 128, 64, 4, 3), (64, 64, 64, 4, 3), (128, 64, 128, 4, 2)]
# (BM, BN, BK, warps, stages), timed beside the heuristic's tile (128x64x64/w4 at T >= 2048)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--shapes", nargs="*", default=["qwen3-30b-a3b"])
    ap.add_argument("--T", nargs="*", type=int, default=[2048, 512, 8192])
    ap.add_argument("--formats", nargs="*", default=["Q8_0", "Q4_0"])
    ap.add_argument("--variants", nargs="*", default=list(DOT_VARIANTS))
    ap.add_argument("--auto-only", action="store_true", help="time the heuristic's tile only")
    ap.add_argument("--budget-s", type=float, default=240.0, help="stop starting new configs")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "decoded_dot_ab.csv"))
    args = ap.parse_args(argv)
    t_start = time.time()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shapes = dict(eg.SHAPES)
    if args.smoke:
        shapes = {"tiny": get_preset("tiny").with_(n_expert=5, top_k=2)}
        args.shapes, args.T = ["tiny"], [5]
    tiles = [] if args.smoke or args.auto_only else TILES
    reps = 2 if args.smoke else 10
    gpu, sha = bench.gpu_name(), bench.commit_of(Path(__file__).resolve().parents[1])
    cmd = " ".join(["python", "experiments/decoded_dot_ab.py"] + (argv or sys.argv[1:]))
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    rows = []
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    failed = []
    for name in args.shapes:
        shape = shapes[name]
        for fmt in args.formats:
            experts = eg.make_experts(shape, fmt, dev, distinct=4 if args.smoke else 8)
            dense = eg.dense_weights(experts)
            for i, T in enumerate(args.T):
                if time.time() - t_start > args.budget_s:
                    print(f"budget spent: skipping {name}/{fmt}/T{T}", file=sys.stderr)
                    continue
                gen = torch.Generator().manual_seed(T)
                x = torch.randn(T, shape.d_model, generator=gen).to(torch.bfloat16).to(dev)
                ids, w = topk_route(torch.randn(T, shape.n_expert, generator=gen).to(dev),
                                    shape.top_k)
                flops = expert_flops(shape, T, layers=1)
                cfg = f"{name}/T{T}/{fmt}"
                t = median_s(lambda: eg.grouped_mm_ffn(x, ids, w, *dense), reps)
                rows.append(dict(config=cfg, variant="grouped_mm-bf16", tile="-",
                                 tflops=f"{flops / t / 1e12:.3f}", rel_err=""))
                ref = moe_ffn_torch(x, ids, w, experts) if i == 0 else None
                moe_ffn(x, ids, w, experts)
                auto = last_launch().tile
                cands = [("auto", None)] + [
                    (f"{bm}x{bn}x{bk}/w{nw}s{ns}", TileConfig(bm, bn, bk, nw, ns, "dp",
                                                              auto.programs))
                    for bm, bn, bk, nw, ns in tiles]
                for v in args.variants:
                    for label, tc in cands:
                        if v == "decode" and label != "auto":
                            continue  # the old path is known; time it at the heuristic tile
                        try:
                            with pin_tile(tc.with_(dot=v)) if tc else pin_tile(dot=v):
                                fn = lambda: moe_ffn(x, ids, w, experts)  # noqa: E731
                                err = eg.rel_err(fn(), ref) if ref is not None else float("nan")
                                if ref is not None and not err < eg.DECODED_REL:
                                    failed.append(f"{cfg}/{v}/{label}: {err:.3e}")
                                    continue
                                t = median_s(fn, reps)
                        except Exception as exc:  # e.g. out of shared memory: report, go on
                            print(f"{cfg} {v} {label}: {type(exc).__name__}: {exc}"[:300],
                                  file=sys.stderr)
                            continue
                        lab = f"auto={auto.BLOCK_M}x{auto.BLOCK_N}" if tc is None else label
                        rows.append(dict(config=cfg, variant=v, tile=lab,
                                         tflops=f"{flops / t / 1e12:.3f}",
                                         rel_err="" if err != err else f"{err:.3e}"))
                        print(f"{cfg} {v:12s} {lab:22s} {flops / t / 1e12:7.1f} TFLOP/s",
                              file=sys.stderr, flush=True)
                _write(out, rows, gpu, sha, stamp, cmd)
    _write(out, rows, gpu, sha, stamp, cmd)
    if failed:
        print("over the DECODED_REL bound (not timed):\n  " + "\n  ".join(failed),
              file=sys.stderr)
        return 1
    return 0


def median_s(fn, reps: int) -> float:
    """Median seconds of `reps` calls after 2 warm-ups (CUDA events on the GPU)."""
    return bench.time_fn(fn, warmup=2, repeats=reps).median_s


def _write(path, rows, gpu, sha, stamp, cmd):
    with open(path, "w", newline="") as fh:
        wr = csv.DictWriter(fh, ["gpu", "commit", "timestamp", "command", "config", "variant",
                                 "tile", "tflops", "rel_err"])
        wr.writeheader()
        for r in rows:
            wr.writerow(dict(gpu=gpu, commit=sha, timestamp=stamp, command=cmd, **r))


if __name__ == "__main__":
    sys.exit(main())
