"""Where the host's time goes in one expert FFN call (a diagnostic, not a benchmark: cProfile
slows what it watches; the figures to quote come from kernel_bench / profile_read).

At T = 512 the device runs strata's BF16 moe_ffn in 0.46 ms while back-to-back calls take 1.44 ms
each (profile_read --what ffn, 48f21b6): the host issuing the call is the limit. This prints, per
arm, the wall time of back-to-back calls and the functions that take the host's time (cProfile,
by own time and by cumulative time) over `--calls` calls.

    python3 benchmarks/host_profile.py --T 512 2048         # GPU
    python3 benchmarks/host_profile.py --smoke              # CPU interpreter, tiny: checks it
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time

import torch

import strata  # noqa: F401  (selects the interpreter without CUDA)
from strata.bench.expert_gemm import dense_weights, grouped_mm_ffn, make_experts
from strata.kernels import moe_ffn, topk_route
from strata.kernels.moe.decoded import moe_ffn_decoded
from strata.kernels.moe.plane import plane_ffn
from strata.planes import to_plane_set
from strata.shapes import get_preset


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", nargs="*", type=int, default=[512, 2048])
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--top", type=int, default=22)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type != "cuda" and not args.smoke:
        print("host_profile needs a CUDA device; use --smoke to check it on a CPU", file=sys.stderr)
        return 2
    shape = get_preset("qwen3-30b-a3b")
    if args.smoke:
        from dataclasses import replace
        shape = replace(shape, d_model=64, d_expert=64, n_expert=8, top_k=2)
        args.T, args.calls = [16], 2
    ex = make_experts(shape, "Q8_0", dev, distinct=2)
    ex16 = make_experts(shape, "BF16", dev, distinct=2)
    planes = to_plane_set(ex)
    wg, wu, wd = dense_weights(ex)
    for T in args.T:
        gen = torch.Generator().manual_seed(T)
        x = torch.randn(T, shape.d_model, generator=gen).to(torch.bfloat16).to(dev)
        ids, w = topk_route(torch.randn(T, shape.n_expert, generator=gen).to(dev), shape.top_k)
        arms = {"BF16 moe_ffn": lambda: moe_ffn(x, ids, w, ex16, check=False),
                "Q8_0 plane_ffn": lambda: plane_ffn(x, ids, w, planes, check=False),
                "Q8_0 decoded": lambda: moe_ffn_decoded(x, ids, w, ex, check=False),
                "grouped_mm-bf16": lambda: grouped_mm_ffn(x, ids, w, wg, wu, wd)}
        for arm, fn in arms.items():
            for _ in range(3):
                fn()
            sync(dev)
            t0 = time.perf_counter()
            for _ in range(args.calls):
                fn()
            host = (time.perf_counter() - t0) / args.calls
            sync(dev)
            both = (time.perf_counter() - t0) / args.calls
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(args.calls):
                fn()
            prof.disable()
            sync(dev)
            print(f"== T={T} {arm}: host {host * 1e3:.3f} ms a call issued, "
                  f"{both * 1e3:.3f} ms a call to the last sync")
            for key in ("tottime", "cumulative"):
                s = io.StringIO()
                pstats.Stats(prof, stream=s).sort_stats(key).print_stats(args.top)
                body = s.getvalue().split("\n")
                start = next(i for i, ln in enumerate(body) if ln.strip().startswith("ncalls"))
                print(f"-- by {key}")
                print("\n".join(ln[:160] for ln in body[start:start + args.top + 1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
