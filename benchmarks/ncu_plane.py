"""The expert GEMMs of one qwen3-30b-a3b feed-forward, for Nsight Compute to read (the hardware
counters say where the plane GEMM's time goes: memory throughput, issue slots, stall reasons).

    ncu --clock-control none --kernel-name regex:"_plane_gemm|_moe_gemm" \\
        --section SpeedOfLight --section WarpStateStats \\
        python3 benchmarks/ncu_plane.py --T 512 --formats BF16 Q8_0 Q4_K --calls 1

Each arm runs its layer `--calls` times (check=False, the engine's: two GEMM launches a call);
BF16 runs strata's fused GEMM (schedule dp), the others the plane GEMM at the table's tile and
at `--tiles`. Without ncu it prints each arm's CUDA-event median, to line the counters up with
kernel_bench. Shapes: T tokens, D 2048 hidden, F 768 expert width, E 128 experts, K 8 top-k.
"""
from __future__ import annotations

import argparse
import sys

import torch

import strata  # noqa: F401  (selects the interpreter without CUDA)
from strata.bench.expert_gemm import SHAPES, make_experts
from strata.kernels import moe_ffn, topk_route
from strata.kernels.moe.plane import PlaneTile, plane_ffn, plane_tile
from strata.planes import to_plane_set


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, default=512)
    ap.add_argument("--formats", nargs="+", default=["BF16", "Q8_0", "Q4_0", "Q4_K"])
    ap.add_argument("--tiles", nargs="*", default=[], help="plane tiles (PlaneTile names) "
                    "besides the table's")
    ap.add_argument("--calls", type=int, default=6)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("ncu_plane: needs a CUDA device", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    shape = SHAPES["qwen3-30b-a3b"]
    gen = torch.Generator().manual_seed(args.T)
    x = torch.randn(args.T, shape.d_model, generator=gen).to(torch.bfloat16).to(dev)
    ids, w = topk_route(torch.randn(args.T, shape.n_expert, generator=gen).to(dev), shape.top_k)
    for fmt in args.formats:
        ex = make_experts(shape, fmt, dev, distinct=8)
        if fmt == "BF16":
            arms = {"strata-dp": lambda: moe_ffn(x, ids, w, ex, schedule="dp", check=False)}
        else:
            ps = to_plane_set(ex)
            tiles = [plane_tile(args.T, shape.top_k, shape.n_expert, fmt)]
            tiles += [PlaneTile.parse(t) for t in args.tiles]
            arms = {f"plane[{t.name}]": (lambda t=t: plane_ffn(x, ids, w, ps, schedule=t,
                                                               check=False)) for t in tiles}
        for name, fn in arms.items():
            fn()
            torch.cuda.synchronize()
            ms = []
            for _ in range(args.calls):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                ms.append(a.elapsed_time(b))
            ms.sort()
            print(f"T{args.T} {fmt} {name}: median {ms[len(ms) // 2]:.3f} ms a call "
                  f"(under ncu: counter replay, not a timing)", flush=True)
        del ex
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
