"""Expert GEMM benchmark: strata's moe_ffn (data-parallel, stream-k) against torch._grouped_mm.

Legend: T tokens, D hidden, F expert width, E experts, K top-k.

Arms, all computing one layer's MoE feed-forward y [T, D] from x [T, D] and a routing:
- strata-dp / strata-sk: moe_ffn on the blobs (weights decoded inside the kernel).
- grouped_mm-bf16: torch._grouped_mm on bf16 weights dequantized once, up front (the dense
  ceiling: it reads 2 bytes a weight).
- decode+grouped_mm: decode the routed experts' blobs to bf16 (strata.kernels.expert_dequant), then
  torch._grouped_mm: what a framework without fused decode does each time.
Every arm includes routing's grouping and the weighted sum over K.

Figure: TFLOP/s of the whole feed-forward, counting 2·T·K·3·D·F, from the median of CUDA-event
timings. Each figure is bounded by grouped_mm-bf16 on the same shape (the `bound` column holds
its TFLOP/s and the ratio row says how close). Nothing is reported for a configuration whose
correctness check against moe_ffn_torch fails; the script then exits 1.

    python experiments/kernel_bench.py             # full grid (GPU, writes CSV + PNG)
    python experiments/kernel_bench.py --quick     # T in {512, 2048}, BF16/Q8_0/Q4_0
    python experiments/kernel_bench.py --smoke     # tiny shapes, runs on the CPU
    python experiments/kernel_bench.py --sweep     # time a few pinned tiles (heuristic tuning)
"""
from __future__ import annotations

import argparse
import csv
import datetime as dt
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import strata  # noqa: E402,F401  (selects the interpreter without CUDA)
from strata.errors import StrataError  # noqa: E402
from strata.formats import get_format  # noqa: E402
from strata.kernels import moe_ffn, moe_ffn_torch, pin_tile, topk_route  # noqa: E402
from strata.kernels.expert_dequant import dequant_experts  # noqa: E402
from strata.kernels.moe import dequantize_matrix, last_launch  # noqa: E402
from strata.kernels.routing import group_ragged  # noqa: E402
from strata.kernels.synth import random_expert_set  # noqa: E402
from strata.kernels.tiles import TileConfig  # noqa: E402
from strata.shapes import get_preset  # noqa: E402

# the check's bound: tests/kernels/test_moe_ffn.py names and explains these
BF16_REL = 1e-2
DECODED_REL = 1.5e-2

SHAPES = {"qwen3-30b-a3b": get_preset("qwen3-30b-a3b"), "seed-512e": get_preset("seed-512e")}
FORMATS = ["BF16", "Q8_0", "Q4_K", "Q4_0", "Q2_0", "IQ3_S"]
TS = [512, 2048, 8192, 32768]


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, cwd=Path(__file__).parent, check=True).stdout.strip()
    except Exception:
        return os.environ.get("STRATA_COMMIT", "unknown")


def gpu_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu-interpreter"


def supported(fmt: str) -> str | None:
    """None when moe_ffn decodes this format in the kernel, else why not."""
    from strata.kernels.decode import TRITON_FORMATS
    name = get_format(fmt).name
    return None if name in TRITON_FORMATS else f"no in-kernel {name} decoder yet"


def timeit(fn, reps: int) -> float:
    """Median seconds of `reps` calls after 2 warm-ups (CUDA events on the GPU)."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(reps):
        if torch.cuda.is_available():
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def grouped_mm_ffn(x, topk_ids, topk_weights, w_gate, w_up, w_down):
    """The dense baseline: ragged grouping, torch._grouped_mm on bf16 [E, out, in] weights."""
    T, K = topk_ids.shape
    rag = group_ragged(topk_ids, w_gate.shape[0])
    xs = x[rag.order // K]                                                     # [T·K, D]
    offs = rag.offsets[1:].to(torch.int32)
    if hasattr(torch, "_grouped_mm") and x.is_cuda:
        mm = lambda a, w: torch._grouped_mm(a, w.transpose(-2, -1), offs=offs)  # noqa: E731
    else:  # CPU fallback (smoke only): a loop over experts with the same meaning
        def mm(a, w):
            out = a.new_empty(a.shape[0], w.shape[1])
            bounds = [0] + offs.tolist()
            for e in range(w.shape[0]):
                out[bounds[e]:bounds[e + 1]] = (a[bounds[e]:bounds[e + 1]].float()
                                                @ w[e].float().T).to(a.dtype)
            return out
    h = torch.nn.functional.silu(mm(xs, w_gate).float()) * mm(xs, w_up).float()  # [T·K, F]
    yk = mm(h.to(torch.bfloat16), w_down).float()                              # [T·K, D]
    yk = yk * topk_weights.reshape(-1)[rag.order, None]
    return yk[rag.inverse].view(T, K, -1).sum(1).to(torch.bfloat16)


def dense_weights(experts, names=("gate", "up", "down")):
    return [torch.stack([dequantize_matrix(experts, e, n).to(torch.bfloat16)
                         for e in range(experts.n_expert)]) for n in names]


def make_experts(shape, fmt, device, distinct: int):
    """E experts whose blobs are `distinct` random ones repeated (quantizing 512 experts on the
    host would dominate the run); every expert still has its own bytes in the arena, so the
    kernel reads E different blobs."""
    base = random_expert_set(min(distinct, shape.n_expert), shape.d_model, shape.d_expert, fmt,
                             device="cpu", seed=0, shuffle=False)
    size = base.layout.size
    reps = -(-shape.n_expert // base.n_expert)
    arena = base.arena[:base.n_expert * size].to(device).repeat(reps)[:shape.n_expert * size]
    slot = torch.arange(shape.n_expert, dtype=torch.int64, device=device) * size
    return type(base)(arena.contiguous(), slot, base.layout)


def rel_err(y, ref):
    return ((y.float() - ref.float()).norm() / ref.float().norm()).item()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes; runs on the CPU")
    ap.add_argument("--quick", action="store_true", help="T in {512, 2048}, BF16/Q8_0/Q4_0")
    ap.add_argument("--sweep", action="store_true", help="time pinned tiles instead of the grid")
    ap.add_argument("--shapes", nargs="*", default=None)
    ap.add_argument("--T", nargs="*", type=int, default=None)
    ap.add_argument("--formats", nargs="*", default=None)
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    ap.add_argument("--plot-only", metavar="CSV", help="redraw the PNG of an earlier run's CSV")
    args = ap.parse_args(argv)
    if args.plot_only:
        plot(Path(args.plot_only), Path(args.plot_only).with_suffix(".png"))
        return 0
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cpu" and not args.smoke:
        print("kernel_bench: no GPU; use --smoke for the CPU interpreter run", file=sys.stderr)
        return 2
    shapes = dict(SHAPES)
    if args.smoke:
        shapes = {"tiny": get_preset("tiny").with_(n_expert=5, top_k=2)}
    names = args.shapes or list(shapes)
    Ts = args.T or ([5, 16] if args.smoke else [512, 2048] if args.quick or args.sweep else TS)
    fmts = args.formats or (["BF16", "Q8_0", "Q4_0"] if args.quick or args.smoke or args.sweep
                            else FORMATS)
    reps = args.reps or (2 if args.smoke else 10)
    if args.sweep:
        return sweep(shapes, names, Ts, fmts, dev, reps)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    rows, failed = [], []
    gpu, sha = gpu_name(), commit()
    try:
        from tqdm import tqdm
    except ImportError:  # progress is a nicety; the GPU image may lack tqdm
        def tqdm(it, **_):
            return it
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = "smoke" if args.smoke else ("quick" if args.quick else "full")
    path = out / f"kernel_bench_{tag}.csv"
    todo = [(n, f, T) for n in names for f in fmts for T in Ts]
    cache = {}
    for name, fmt, T in tqdm(todo, desc="kernel_bench", file=sys.stderr):
        shape = shapes[name]
        why = supported(fmt)
        cfg = f"{name}/T{T}/{fmt}"
        if why:
            print(f"skip {cfg}: {why}", file=sys.stderr)
            rows.append(dict(config=cfg, arm="-", figure="skipped", value="", bound=why))
            continue
        if (name, fmt) not in cache:
            cache.clear()
            torch.cuda.empty_cache() if dev.type == "cuda" else None
            ex = make_experts(shape, fmt, dev, distinct=4 if args.smoke else 8)
            cache[(name, fmt)] = (ex, dense_weights(ex))
        experts, (wg, wu, wd) = cache[(name, fmt)]
        gen = torch.Generator().manual_seed(T)
        x = torch.randn(T, shape.d_model, generator=gen).to(torch.bfloat16).to(dev)
        ids, w = topk_route(torch.randn(T, shape.n_expert, generator=gen).to(dev), shape.top_k)
        counts = torch.bincount(ids.reshape(-1), minlength=shape.n_expert)
        bufs = [torch.empty_like(t) for t in (wg, wu, wd)]

        def decode_then_mm():
            g, u, d = (dequant_experts(experts, n, counts, out=b)
                       for n, b in zip(("gate", "up", "down"), bufs))
            return grouped_mm_ffn(x, ids, w, g, u, d)

        arms = {"strata-dp": lambda: moe_ffn(x, ids, w, experts, schedule="dp"),
                "strata-sk": lambda: moe_ffn(x, ids, w, experts, schedule="stream_k"),
                "grouped_mm-bf16": lambda: grouped_mm_ffn(x, ids, w, wg, wu, wd),
                "decode+grouped_mm": decode_then_mm}
        ref = moe_ffn_torch(x, ids, w, experts)
        bound_rel = BF16_REL if fmt == "BF16" else DECODED_REL
        ok = {}
        for arm, fn in list(arms.items()):
            try:
                err = rel_err(fn(), ref)
            except Exception as exc:  # e.g. torch._grouped_mm unsupported here: drop the arm
                if arm.startswith("strata"):
                    raise
                print(f"{cfg}: arm {arm} unavailable: {type(exc).__name__}: {exc}"[:300],
                      file=sys.stderr)
                rows.append(dict(config=cfg, arm=arm, figure="skipped", value="",
                                 bound=f"{type(exc).__name__}"))
                del arms[arm]
                continue
            ok[arm] = err < bound_rel and err == err
            rows.append(dict(config=cfg, arm=arm, figure="rel_err", value=f"{err:.3e}",
                             bound=f"< {bound_rel:g} ({'pass' if ok[arm] else 'FAIL'})"))
            if not ok[arm]:
                failed.append(f"{cfg}/{arm}: normalized error {err:.3e} >= {bound_rel:g}")
        if not all(ok.values()):
            continue  # refuse to time a configuration that computes the wrong thing
        flops = 2 * T * shape.top_k * 3 * shape.d_model * shape.d_expert
        secs = {arm: timeit(fn, reps) for arm, fn in arms.items()}
        moe_ffn(x, ids, w, experts, schedule="stream_k")
        sk_rec = last_launch()
        moe_ffn(x, ids, w, experts)
        auto = last_launch().tile
        ceiling = flops / secs["grouped_mm-bf16"] / 1e12 if "grouped_mm-bf16" in secs else None
        for arm, s in secs.items():
            tf = flops / s / 1e12
            rows.append(dict(config=cfg, arm=arm, figure="ms", value=f"{s * 1e3:.4f}", bound=""))
            rows.append(dict(config=cfg, arm=arm, figure="tflops", value=f"{tf:.3f}",
                             bound=f"grouped_mm-bf16 {ceiling:.3f} TFLOP/s" if ceiling
                             else "no grouped_mm baseline"))
            if ceiling:
                rows.append(dict(config=cfg, arm=arm, figure="ratio_vs_grouped_mm_bf16",
                                 value=f"{tf / ceiling:.3f}", bound="1.0 = dense bf16"))
        rows.append(dict(config=cfg, arm="strata-sk", figure="scratch_bytes",
                         value=str(sk_rec.scratch_bytes), bound=f"tile {sk_rec.tile}"))
        rows.append(dict(config=cfg, arm="strata-auto", figure="tile", value=auto.schedule,
                         bound=str(auto)))
        print(f"{cfg}: " + "  ".join(f"{a} {flops / s / 1e12:.1f}" for a, s in secs.items())
              + " TFLOP/s", file=sys.stderr)
        write_csv(path, rows, gpu, sha, stamp)  # after every configuration: a cut run keeps some
    write_csv(path, rows, gpu, sha, stamp)
    print(f"wrote {path}", file=sys.stderr)
    plot(path, path.with_suffix(".png"))
    if failed:
        print("correctness check FAILED; those configurations were not timed:\n  "
              + "\n  ".join(failed), file=sys.stderr)
        return 1
    return 0


def write_csv(path, rows, gpu, sha, stamp):
    with open(path, "w", newline="") as fh:
        wr = csv.DictWriter(fh, ["gpu", "commit", "timestamp", "config", "arm", "figure", "value",
                                 "bound"])
        wr.writeheader()
        for r in rows:
            wr.writerow(dict(gpu=gpu, commit=sha, timestamp=stamp, **r))


def plot(csv_path: Path, png_path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no PNG (plot later with --plot-only)", file=sys.stderr)
        return
    rows = [r for r in csv.DictReader(open(csv_path)) if r["figure"] == "tflops"]
    if not rows:
        return
    shapes = sorted({r["config"].split("/")[0] for r in rows})
    fmts = sorted({r["config"].split("/")[2] for r in rows}, key=FORMATS.index
                  if all(f in FORMATS for r in rows for f in [r["config"].split("/")[2]]) else str)
    fig, axes = plt.subplots(len(shapes), len(fmts), figsize=(3.2 * len(fmts), 3 * len(shapes)),
                             squeeze=False, sharey="row")
    for i, s in enumerate(shapes):
        for j, f in enumerate(fmts):
            ax = axes[i][j]
            for arm in ("strata-dp", "strata-sk", "grouped_mm-bf16", "decode+grouped_mm"):
                pts = sorted((int(r["config"].split("/")[1][1:]), float(r["value"])) for r in rows
                             if r["arm"] == arm and r["config"].startswith(f"{s}/")
                             and r["config"].endswith(f"/{f}"))
                if pts:
                    ax.plot(*zip(*pts), marker="o", label=arm)
            ax.set_xscale("log", base=2)
            ax.set_title(f"{s} {f}", fontsize=9)
            ax.set_xlabel("T")
            if j == 0:
                ax.set_ylabel("TFLOP/s (2·T·K·3·D·F)")
    axes[0][0].legend(fontsize=7)
    r0 = next(csv.DictReader(open(csv_path)))
    fig.suptitle(f"MoE FFN, {r0['gpu']} @ {r0['commit']} ({r0['timestamp']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    print(f"wrote {png_path}", file=sys.stderr)


SWEEP_TILES = [  # (BM, BN, BK, warps, stages)
    (64, 128, 64, 4, 3), (128, 128, 64, 8, 3), (128, 64, 64, 4, 3), (64, 64, 64, 4, 3),
    (32, 64, 64, 4, 3), (128, 128, 32, 8, 4), (64, 128, 128, 8, 2), (16, 64, 64, 4, 3),
]


def sweep(shapes, names, Ts, fmts, dev, reps) -> int:
    """Time each pinned tile (data-parallel and stream-k) against the heuristic's choice."""
    for name in names:
        shape = shapes[name]
        for fmt in fmts:
            if supported(fmt):
                continue
            experts = make_experts(shape, fmt, dev, distinct=4)
            for T in Ts:
                gen = torch.Generator().manual_seed(T)
                x = torch.randn(T, shape.d_model, generator=gen).to(torch.bfloat16).to(dev)
                ids, w = topk_route(torch.randn(T, shape.n_expert, generator=gen).to(dev),
                                    shape.top_k)
                flops = 2 * T * shape.top_k * 3 * shape.d_model * shape.d_expert
                moe_ffn(x, ids, w, experts)
                auto = last_launch().tile
                res = [("auto", auto, flops / timeit(lambda: moe_ffn(x, ids, w, experts),
                                                     reps) / 1e12)]
                for bm, bn, bk, nw, ns in SWEEP_TILES:
                    for sched in ("dp", "stream_k"):
                        cfg = TileConfig(bm, bn, bk, nw, ns, sched, auto.programs)
                        try:
                            with pin_tile(cfg):
                                t = timeit(lambda: moe_ffn(x, ids, w, experts), reps)
                        except Exception as exc:  # e.g. out of shared memory: report, go on
                            print(f"  {cfg}: {type(exc).__name__}", file=sys.stderr)
                            continue
                        res.append((f"{bm}x{bn}x{bk}/w{nw}s{ns}/{sched}", cfg, flops / t / 1e12))
                        print(f"  {name} {fmt} T{T} {res[-1][0]}: {res[-1][2]:.1f} TFLOP/s "
                              f"(auto {res[0][2]:.1f})", file=sys.stderr, flush=True)
                res.sort(key=lambda r: -r[2])
                print(f"{name} {fmt} T{T}: auto {res[[r[0] for r in res].index('auto')][2]:.1f}"
                      f" ({auto.BLOCK_M}x{auto.BLOCK_N}x{auto.BLOCK_K}/{auto.schedule}); best "
                      + ", ".join(f"{k} {v:.1f}" for k, _, v in res[:4]), file=sys.stderr)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except StrataError as exc:
        print(f"kernel_bench: {exc}", file=sys.stderr)
        sys.exit(2)
