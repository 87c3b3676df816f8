"""The fused softmax -> top-k router (strata.kernels.moe.router) against the torch ops it replaces.

Legend: T tokens, D hidden, E experts, K top-k.

Arms, each one layer's routing of a [T, D] bf16 chunk:
- torch: the models' code before the kernel (and the CPU path today): `x.float() @ w.float().t()`
  (cuBLAS fp32), softmax, torch.topk, renormalize.
- fused: softmax_topk_route at router_tile's tile; `--tiles BMxBD/wW/sS ...` adds one arm each.

What bounds it: the kernel reads x once (T·D·2 bytes) and does 2·T·D·E flops on bf16 tensor cores;
the figures are the time, the read rate of x against the device copy measured in the same run, and
TFLOP/s. The gate: every arm's ids equal the torch arm's on at least 99.9% of the rows (a row
whose K-th and next logits differ by less than the fp32 sum's rounding may go either way) and its
weights match to 1e-5 where the ids do.

    python benchmarks/router_bench.py                   # GPU: qwen3-30b-a3b, seed-512e; T 8K, 32K
    python benchmarks/router_bench.py --smoke           # CPU interpreter, tiny: checks the script
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from triton.runtime.errors import OutOfResources

from strata import bench
from strata.kernels.moe.router import (RouterTile, router_tile, softmax_topk_route,
                                       softmax_topk_route_torch)
from strata.shapes import get_preset

ROOT = Path(__file__).resolve().parents[1]
SHAPES = ("qwen3-30b-a3b", "seed-512e")
SAME_IDS = 0.999
WEIGHT_TOL = 1e-5


def parse_tile(s: str) -> RouterTile:
    """"64x64/w8s3" -> RouterTile(64, 64, 8, 3)."""
    try:
        dims, _, rest = s.partition("/")
        bm, bd = (int(v) for v in dims.split("x"))
        w = int(rest.split("w")[1].split("s")[0]) if "w" in rest else 4
        st = int(rest.split("s")[1]) if "s" in rest else 3
        return RouterTile(bm, bd, w, st)
    except (ValueError, IndexError) as exc:
        raise SystemExit(f"router_bench: a tile is BMxBD[/wWARPSsSTAGES], got {s!r} ({exc})")


def tile_name(t: RouterTile) -> str:
    return f"{t.block_m}x{t.block_d}/w{t.num_warps}s{t.num_stages}"


def copy_rate(rec: bench.Recorder) -> float:
    """The device copy's rate (bytes read + written a second), measured and recorded."""
    src = torch.empty(1 << 28, dtype=torch.uint8, device=rec.device)
    dst = torch.empty_like(src)
    t = rec.timed(lambda: dst.copy_(src), check=lambda: None, what="copy")
    rate = 2 * src.numel() / t.median_s
    rec.add("copy rate measured", rate / 1e9, "GB/s", timer=t.timer, bytes=2 * src.numel())
    return rate


def measure(args, rec: bench.Recorder) -> None:
    dev = rec.device
    copy = copy_rate(rec)
    for name in args.shapes:
        s = get_preset(name)
        D, E, K = (8, 64, 8) if args.smoke else (s.d_model, s.n_expert, s.top_k)
        E = min(E, 16) if args.smoke else E
        K = min(K, 4) if args.smoke else K
        w = (torch.randn(E, D, device=dev) / D ** 0.5).to(torch.bfloat16)
        for T in args.T:
            x = torch.randn(T, D, device=dev).to(torch.bfloat16)
            ref_ids, ref_w = softmax_topk_route_torch(x, w, K)
            arms = {"torch": (lambda: softmax_topk_route_torch(x, w, K), None),
                    "fused": (lambda: softmax_topk_route(x, w, K), router_tile(E))}
            for tl in args.tiles:
                arms[f"fused[{tile_name(tl)}]"] = (lambda tl=tl: softmax_topk_route(x, w, K,
                                                                                    tile=tl), tl)

            def check(fn):
                ids, wt = fn()
                same = (ids == ref_ids).all(1)
                if same.float().mean() < SAME_IDS:
                    return f"ids equal the torch arm's on only {same.float().mean():.4f} of rows"
                err = (wt[same] - ref_w[same]).abs().max().item() if same.any() else 0.0
                return None if err <= WEIGHT_TOL else f"weights differ by {err:.2e}"

            flops = 2 * T * D * E
            exact = torch.softmax(x.double() @ w.double().t(), -1)                # [T, E]
            for arm, (fn, tile) in arms.items():
                try:
                    t = rec.timed(fn, check=lambda fn=fn: check(fn), what=f"{name}/T{T}/{arm}")
                except OutOfResources as exc:   # an extra tile too big for this E: skip it
                    print(f"{name}/T{T}/{arm}: skipped, {exc}"[:200], file=sys.stderr)
                    rec.add("skipped", "", "", bound="out of resources", shape=name, T=T,
                            arm=arm)
                    continue
                cfg = dict(shape=name, T=T, D=D, E=E, K=K, arm=arm,
                           tile=tile_name(tile) if tile else "", command=args.command)
                gate = f"ids == torch arm on >= {SAME_IDS} of rows, weights within {WEIGHT_TOL}"
                rec.add("ms", t.median_ms, "ms", gate=gate, timer=t.timer, **cfg)
                rec.add("x read rate", T * D * 2 / t.median_s / 1e9, "GB/s",
                        bound="copy measured here / 2", bound_value=copy / 2e9, gate=gate,
                        timer=t.timer, **cfg)
                rec.add("tflops", flops / t.median_s / 1e12, "TFLOP/s", gate=gate,
                        timer=t.timer, **cfg)
                ids, wt = fn()       # accuracy: the weights against softmax in fp64 (renormalized)
                ref = exact.gather(1, ids)
                ref = ref / ref.sum(-1, keepdim=True)
                rec.add("max weight error vs fp64", ((wt.double() - ref).abs() / ref).max().item(),
                        "relative", gate=gate, **cfg)
            rec.flush()


def summary(rows: list[dict]) -> None:
    for r in rows:
        c = r["config"]
        if r["figure"] == "ms":
            print(f"[{r['label']}] {c['shape']:>14} T={c['T']:<6} {c['arm']:<24} "
                  f"{r['value']:8.3f} ms")


def main(argv=None) -> int:
    ap = bench.parser(__doc__, out=ROOT / "benchmarks" / "results", warmup=5, repeats=30)
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES))
    ap.add_argument("--T", nargs="*", type=int, default=[8192, 32768])
    ap.add_argument("--tiles", nargs="*", default=[], metavar="TILE",
                    help="extra fused arms, BMxBD/wWARPSsSTAGES (e.g. 64x64/w8s3 32x64/w4s3)")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on any device")
    args = ap.parse_args(argv)
    args.tiles = [parse_tile(t) for t in args.tiles]
    if args.smoke:
        args.T, args.repeats, args.warmup = [37], 2, 1
    elif not torch.cuda.is_available():
        print("router_bench needs a CUDA device; use --smoke to check it on a CPU",
              file=sys.stderr)
        return 2
    args.command = bench.command_line(argv)
    stem = bench.run_stem("router", ROOT, smoke=args.smoke)
    return bench.main(args, "router", measure, script=__file__, argv=argv, stem=stem,
                      summary=summary,
                      plot=lambda rs, p: bench.bars(rs, p, title=f"router ({rs[0]['gpu']})",
                                                    x_keys=["shape", "T", "arm"],
                                                    figures=["ms", "x read rate"]))


if __name__ == "__main__":
    sys.exit(main())
