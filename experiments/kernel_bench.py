"""Expert GEMM benchmark: strata's moe_ffn (data-parallel, stream-k) against torch._grouped_mm.

Legend: T tokens, D hidden, F expert width, E experts, K top-k.

Arms, all computing one layer's MoE feed-forward y [T, D] from x [T, D] and a routing:
- strata-dp / strata-sk: moe_ffn on the blobs (weights decoded inside the kernel).
- strata-decoded: strata.kernels.moe.decoded.moe_ffn_decoded: the routed experts decoded once to
  bf16 (expert_dequant), then strata's BF16 kernel (the engine's FFN for long chunks).
- strata-decoded-grouped: the same decode, then torch._grouped_mm straight over the decode buffer
  (pin_decoded_gemm("grouped"): what "auto" runs on sm90+ from GROUPED_MIN_ROWS rows an expert).
- grouped_mm-bf16: torch._grouped_mm on bf16 weights dequantized once, up front (the dense
  ceiling: it reads 2 bytes a weight).
- decode+grouped_mm: decode the routed experts' blobs to bf16 (strata.kernels.moe.expert_dequant), then
  torch._grouped_mm: what a framework without fused decode does each time.
- strata-int8 (strata.kernels.moe.int8.INT8_FORMATS): moe_ffn_int8, x and h quantized to q8_1,
  the weights' int8 codes on the int8 tensor cores (its check bound is INT8_REL: two more
  quantizations than the bf16 path's); `--int8-tiles T1 T2 ...` adds one arm `strata-int8[T]`
  per Int8Tile, e.g. --int8-tiles 128x128/w8s3 128x64/w4s3 128x128/w8s3k4 (kK: K q8_1 blocks a
  reduction step).
- strata-plane-int8 (Q8_0, Q4_0, Q4_K: strata.kernels.moe.plane_int8.FORMATS): moe_ffn_plane_int8,
  strata-int8's numbers (the same bound) on the experts re-laid once into the plane layout (the
  weights' codes as plain code tiles, the 4-bit ones unpacked in registers), at PLANE_INT8_TILE;
  `--int8-tiles` adds `strata-plane-int8[T]` arms at the same tiles as strata-int8's.
- strata-plane (Q8_0, Q4_0, Q4_K: plane.KERNEL_FORMATS): strata.kernels.moe.plane.plane_ffn on the
  same experts re-laid once into the plane layout (strata.planes: aligned code tiles, scales
  apart), the tile from its default table; `--tiles T1 T2 ...` adds one arm `strata-plane[T]`
  per PlaneTile (the sweep of its launch choices in the same call), e.g.
  --tiles 128x128x64/w8s4/tma 64x128x64/w8s4/noswap.
`--arms A B ...` keeps only those arms (grouped_mm-bf16 always runs: it is every figure's bound).
Every arm includes routing's grouping and the weighted sum over K. The strata arms run as the
engine calls them, check=False (no host sync validating the routing: the engine vouches for it);
`--checked` times them with the check (a sync a call), the default of a standalone call.

Each arm runs back to back for SETTLE_S seconds before its timed repeats (`--settle`; the rows
carry settle_s): timed in bursts, the same grouped_mm-bf16 arm read 97.9 / 112.8 / 117.0 TFLOP/s
at T = 2048 in one call (21ffca6), the clocks it happened to get.
Figure: TFLOP/s of the whole feed-forward, counting 2·T·K·3·D·F, from the median of CUDA-event
timings. Each figure is bounded by grouped_mm-bf16 on the same shape (the `bound` column holds
its TFLOP/s and the ratio row says how close). Follows strata.bench: every arm is checked against
moe_ffn_torch on the very inputs it is timed on (normalized error under BF16_REL / DECODED_REL);
a failure refuses the whole run (exit 1, nothing written). The CSV is strata.bench's long format
(config: shape, T, format, arm), written as `<stem>.partial.csv` after every configuration so a
cut run keeps some; `--base REF` adds the same run at a git ref.

    python experiments/kernel_bench.py             # full grid (GPU, writes CSV + PNG)
    python experiments/kernel_bench.py --quick     # T in {512, 2048}, BF16/Q8_0/Q4_0
    python experiments/kernel_bench.py --smoke     # tiny shapes, runs on the CPU
    python experiments/kernel_bench.py --sweep     # time a few pinned tiles (heuristic tuning)
    python experiments/kernel_bench.py --quick --base main   # the working tree against main
    python experiments/kernel_bench.py --shapes qwen3-30b-a3b --T 512 2048 8192 \
        --formats BF16 Q8_0 --arms strata-dp strata-plane      # the plane GEMM (gpu_session: plane;
                                                               # plane4 Q4_0, plane4k Q4_K)
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

import strata  # noqa: F401  (selects the interpreter without CUDA)
from strata import bench
from strata.bench.expert_gemm import (BF16_REL, DECODED_REL, INT8_REL, SHAPES, SMOKE_SHAPES,
                                      dense_weights, grouped_mm_ffn, make_experts, rel_err)
from strata.bench.roofline import expert_flops
from strata.errors import StrataError
from strata.formats import get_format
from strata.kernels import moe_ffn, moe_ffn_torch, pin_tile, topk_route
from strata.kernels.moe.decoded import last_decoded_gemm, moe_ffn_decoded, pin_decoded_gemm
from strata.kernels.moe.expert_dequant import dequant_experts
from strata.kernels.moe.ffn import last_launch
from strata.kernels.moe.int8 import INT8_FORMATS, Int8Tile, moe_ffn_int8
from strata.kernels.moe.plane import KERNEL_FORMATS as PLANE_FORMATS
from strata.kernels.moe.plane import PlaneTile, plane_ffn, plane_tile
from strata.kernels.moe.plane_int8 import FORMATS as PLANE_INT8_FORMATS
from strata.kernels.moe.plane_int8 import PLANE_INT8_TILE, moe_ffn_plane_int8
from strata.kernels.moe.tiles import TileConfig
from strata.planes import to_plane_set

FORMATS = ["BF16", "Q8_0", "Q4_K", "Q4_0", "Q2_0", "IQ3_S"]
TS = [512, 2048, 8192, 32768]
SETTLE_S = 0.3
ARMS = ["strata-dp", "strata-sk", "strata-decoded", "strata-decoded-grouped", "grouped_mm-bf16",
        "decode+grouped_mm", "strata-plane", "strata-int8", "strata-plane-int8"]


def supported(fmt: str, shape=None) -> str | None:
    """None when moe_ffn decodes this format in the kernel (and, given a shape, its D and F are
    whole blocks of it), else why not."""
    from strata.kernels.decode import TRITON_FORMATS
    f = get_format(fmt)
    if f.name not in TRITON_FORMATS:
        return f"no in-kernel {f.name} decoder yet"
    if shape is not None and (shape.d_model % f.block or shape.d_expert % f.block):
        return (f"{f.name} blocks of {f.block} weights do not tile D={shape.d_model}, "
                f"F={shape.d_expert}")
    return None


def timeit(fn, reps: int) -> float:
    """Median seconds of `reps` calls after 2 warm-ups (strata.bench: CUDA events on the GPU)."""
    return bench.time_fn(fn, warmup=2, repeats=reps).median_s


def measure(args, rec: bench.Recorder) -> None:
    dev = rec.device
    shapes, names, Ts, fmts = args.grid
    try:
        from tqdm import tqdm
    except ImportError:  # progress is a nicety; the GPU image may lack tqdm
        def tqdm(it, **_):
            return it
    todo = [(n, f, T) for n in names for f in fmts for T in Ts]
    cache = {}
    for name, fmt, T in tqdm(todo, desc="kernel_bench", file=sys.stderr):
        shape = shapes[name]
        why = supported(fmt, shape)
        cfg = dict(shape=name, T=T, format=fmt, check=args.checked)
        if why:
            print(f"skip {name}/T{T}/{fmt}: {why}", file=sys.stderr)
            rec.add("skipped", "", "", bound=why, arm="-", **cfg)
            continue
        pint8 = fmt in PLANE_INT8_FORMATS and "strata-plane-int8" in args.arms
        plane = fmt in PLANE_FORMATS and ("strata-plane" in args.arms or args.tiles or pint8)
        if (name, fmt) not in cache:
            cache.clear()
            torch.cuda.empty_cache() if dev.type == "cuda" else None
            ex = make_experts(shape, fmt, dev, distinct=4 if args.smoke else 8)
            cache[(name, fmt)] = (ex, dense_weights(ex), to_plane_set(ex) if plane else None)
        experts, (wg, wu, wd), planes = cache[(name, fmt)]
        gen = torch.Generator().manual_seed(T)
        x = torch.randn(T, shape.d_model, generator=gen).to(torch.bfloat16).to(dev)
        ids, w = topk_route(torch.randn(T, shape.n_expert, generator=gen).to(dev), shape.top_k)
        counts = torch.bincount(ids.reshape(-1), minlength=shape.n_expert)
        bufs = [torch.empty_like(t) for t in (wg, wu, wd)]

        def decode_then_mm():
            g, u, d = (dequant_experts(experts, n, counts, out=b)
                       for n, b in zip(("gate", "up", "down"), bufs))
            return grouped_mm_ffn(x, ids, w, g, u, d)

        def decoded(gemm):   # a figure under the grouped label must be the grouped GEMM's
            with pin_decoded_gemm(gemm):
                y = moe_ffn_decoded(x, ids, w, experts, check=chk)
            ran = last_decoded_gemm()
            if ran.backend != gemm:
                raise StrataError(f"strata-decoded pinned to {gemm} ran {ran.backend}: "
                                  f"{ran.reason}")
            return y

        chk = args.checked   # the engine's calls vouch for their routing: check=False

        arms = {"strata-dp": lambda: moe_ffn(x, ids, w, experts, schedule="dp", check=chk),
                "strata-sk": lambda: moe_ffn(x, ids, w, experts, schedule="stream_k",
                                             check=chk),
                "strata-decoded": lambda: decoded("triton"),
                "strata-decoded-grouped": lambda: decoded("grouped"),
                "grouped_mm-bf16": lambda: grouped_mm_ffn(x, ids, w, wg, wu, wd),
                "decode+grouped_mm": decode_then_mm}
        arms = {a: fn for a, fn in arms.items() if a in args.arms or a == "grouped_mm-bf16"}
        if fmt in INT8_FORMATS and "strata-int8" in args.arms:
            arms["strata-int8"] = lambda: moe_ffn_int8(x, ids, w, experts, check=chk)
        for it in (args.int8_tiles if fmt in INT8_FORMATS else []):
            arms[f"strata-int8[{it.name}]"] = lambda it=it: moe_ffn_int8(x, ids, w, experts,
                                                                         tile=it, check=chk)
        if pint8:
            arms["strata-plane-int8"] = lambda: moe_ffn_plane_int8(x, ids, w, planes, check=chk)
            for it in args.int8_tiles:
                arms[f"strata-plane-int8[{it.name}]"] = lambda it=it: moe_ffn_plane_int8(
                    x, ids, w, planes, tile=it, check=chk)
        if fmt == "BF16":   # nothing to decode: moe_ffn_decoded is moe_ffn on the blobs
            arms.pop("strata-decoded-grouped", None)
        if plane:
            if "strata-plane" in args.arms:
                arms["strata-plane"] = lambda: plane_ffn(x, ids, w, planes, check=chk)
            for pt in args.tiles:
                arms[f"strata-plane[{pt.name}]"] = lambda pt=pt: plane_ffn(x, ids, w, planes,
                                                                            schedule=pt,
                                                                            check=chk)
        ref = moe_ffn_torch(x, ids, w, experts)
        bound_rel = BF16_REL if fmt == "BF16" else DECODED_REL
        gate = (f"normalized error vs moe_ffn_torch < {bound_rel:g} "
                f"(strata-int8 {INT8_REL:.3g})")
        errs = {}
        rel_of = {a: INT8_REL if a.startswith(("strata-int8", "strata-plane-int8")) else bound_rel
                  for a in arms}
        for arm, fn in list(arms.items()):
            try:
                errs[arm] = rel_err(fn(), ref)
            except Exception as exc:  # e.g. torch._grouped_mm unsupported here: drop the arm
                if arm.startswith("strata"):
                    raise
                print(f"{name}/T{T}/{fmt}: arm {arm} unavailable: {type(exc).__name__}: "
                      f"{exc}"[:300], file=sys.stderr)
                rec.add("skipped", "", "", bound=type(exc).__name__, arm=arm, **cfg)
                del arms[arm]
                continue
            rec.add("rel_err", errs[arm], "ratio", bound=f"< {rel_of[arm]:g}",
                    bound_value=rel_of[arm], arm=arm, **cfg)

        def check(arm):   # the gate, on exactly the inputs timed below
            e = errs[arm]
            return None if e < rel_of[arm] else f"normalized error {e:.3e} >= {rel_of[arm]:g}"

        flops = expert_flops(shape, T, layers=1)
        timed = {arm: rec.timed(fn, check=lambda arm=arm: check(arm),
                                what=f"{name}/T{T}/{fmt}/{arm}") for arm, fn in arms.items()}
        if "strata-sk" in arms:
            moe_ffn(x, ids, w, experts, schedule="stream_k")
            sk_rec = last_launch()
            rec.add("scratch_bytes", sk_rec.scratch_bytes, "bytes", bound=f"tile {sk_rec.tile}",
                    arm="strata-sk", **cfg)
        if "strata-dp" in arms:
            moe_ffn(x, ids, w, experts)
            auto = last_launch().tile
            rec.add("tile", auto.schedule, "schedule", bound=str(auto), arm="strata-auto", **cfg)
        if "strata-plane-int8" in arms:
            rec.add("tile", PLANE_INT8_TILE.name, "int8 tile", bound=str(PLANE_INT8_TILE),
                    arm="strata-plane-int8", **cfg)
        if "strata-plane" in arms:
            pt = plane_tile(T, shape.top_k, shape.n_expert, fmt)
            rec.add("tile", pt.name, "plane tile", bound=str(pt), arm="strata-plane", **cfg)
        ceiling = (flops / timed["grouped_mm-bf16"].median_s / 1e12
                   if "grouped_mm-bf16" in timed else None)
        for arm, t in timed.items():
            tf = flops / t.median_s / 1e12
            rec.add("ms", t.median_ms, "ms", gate=gate, timer=t.timer, arm=arm, **cfg)
            rec.add("tflops", tf, "TFLOP/s",
                    bound=f"grouped_mm-bf16 {ceiling:.3f} TFLOP/s" if ceiling
                    else "no grouped_mm baseline", bound_value=ceiling, gate=gate,
                    timer=t.timer, arm=arm, **cfg)
            if ceiling:
                rec.add("ratio_vs_grouped_mm_bf16", tf / ceiling, "ratio",
                        bound="1.0 = dense bf16", bound_value=1.0, gate=gate, timer=t.timer,
                        arm=arm, **cfg)
        print(f"{name}/T{T}/{fmt}: " + "  ".join(f"{a} {flops / t.median_s / 1e12:.1f}"
                                                  for a, t in timed.items())
              + " TFLOP/s", file=sys.stderr)
        rec.flush()  # after every configuration: a cut run keeps some


def main(argv=None) -> int:
    ap = bench.parser(__doc__, out=Path(__file__).parent / "results", warmup=2, repeats=None,
                      settle=SETTLE_S)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes; runs on the CPU")
    ap.add_argument("--quick", action="store_true", help="T in {512, 2048}, BF16/Q8_0/Q4_0")
    ap.add_argument("--sweep", action="store_true", help="time pinned tiles instead of the grid")
    ap.add_argument("--shapes", nargs="*", default=None)
    ap.add_argument("--T", nargs="*", type=int, default=None)
    ap.add_argument("--formats", nargs="*", default=None)
    ap.add_argument("--reps", type=int, default=None, help="same as --repeats")
    ap.add_argument("--arms", nargs="*", default=None, metavar="ARM",
                    help=f"only these arms (of {', '.join(ARMS)}; grouped_mm-bf16 always runs)")
    ap.add_argument("--tiles", nargs="*", default=[], metavar="TILE",
                    help="extra strata-plane arms at these PlaneTiles, BMxBNxBK/wWsS[/noswap][/tma]"
                         " (e.g. 128x128x64/w8s4/tma)")
    ap.add_argument("--int8-tiles", nargs="*", default=[], metavar="TILE",
                    help="extra strata-int8 (and strata-plane-int8, where that arm runs) arms at "
                         "these Int8Tiles, BMxBN/wWsS[kK] (e.g. 128x128/w8s3, 128x128/w8s3k4: "
                         "4 q8_1 blocks a reduction step)")
    ap.add_argument("--checked", action="store_true",
                    help="strata arms validate the routing on the host first (check=True: a "
                         "sync a call); default off, as the engine runs them")
    ap.add_argument("--plot-only", metavar="CSV", help="redraw the PNG of an earlier run's CSV")
    args = ap.parse_args(argv)
    args.arms = args.arms or list(ARMS)
    unknown = sorted(set(args.arms) - set(ARMS))
    if unknown:
        print(f"kernel_bench: no arm {', '.join(unknown)}; choose from {', '.join(ARMS)}",
              file=sys.stderr)
        return 2
    try:
        args.tiles = [PlaneTile.parse(t) for t in args.tiles]
        args.int8_tiles = [Int8Tile.parse(t) for t in args.int8_tiles]
    except StrataError as exc:
        print(f"kernel_bench: {exc}", file=sys.stderr)
        return 2
    if args.plot_only:
        plot(bench.read_csv(args.plot_only), Path(args.plot_only).with_suffix(".png"))
        return 0
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cpu" and not args.smoke:
        print("kernel_bench: no GPU; use --smoke for the CPU interpreter run", file=sys.stderr)
        return 2
    shapes = dict(SHAPES)
    if args.smoke:
        shapes = dict(SMOKE_SHAPES)
    names = args.shapes or list(shapes)
    Ts = args.T or ([5, 16] if args.smoke else [512, 2048] if args.quick or args.sweep else TS)
    fmts = args.formats or (["BF16", "Q8_0", "Q4_0"] if args.quick or args.smoke or args.sweep
                            else FORMATS)
    args.repeats = args.reps or args.repeats or (2 if args.smoke else 10)
    if args.sweep:
        return sweep(shapes, names, Ts, fmts, dev, args.repeats)
    args.grid = (shapes, names, Ts, fmts)
    tag = ("smoke" if args.smoke else "quick" if args.quick else
           "full" if args.arms == ARMS and not (args.tiles or args.int8_tiles) else "arms")
    if args.formats and tag == "arms":   # one call's runs by format must not overwrite each other
        tag += "_" + "-".join(args.formats)
    return bench.main(args, "kernel_bench", measure, script=__file__, argv=argv,
                      stem=f"kernel_bench_{tag}", plot=plot, summary=lambda rows: None)


def plot(rows: list[dict], png_path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no PNG (plot later with --plot-only)", file=sys.stderr)
        return
    r0 = rows[0]
    skipped = {(r["config"]["shape"], r["config"]["format"]): r["bound"] for r in rows
               if r["figure"] == "skipped"}
    rows = [r for r in rows if r["figure"] == "tflops"]
    if not rows:
        return
    shapes = sorted({r["config"]["shape"] for r in rows})
    fmts = sorted({r["config"]["format"] for r in rows},
                  key=lambda f: FORMATS.index(f) if f in FORMATS else len(FORMATS))
    labels = list(dict.fromkeys(r["label"] for r in rows))
    found = list(dict.fromkeys(r["config"]["arm"] for r in rows))
    arms = [a for a in ARMS if a in found] + [a for a in found if a not in ARMS]
    fig, axes = plt.subplots(len(shapes), len(fmts), figsize=(3.2 * len(fmts), 3 * len(shapes)),
                             squeeze=False, sharey="row")
    for i, s in enumerate(shapes):
        for j, f in enumerate(fmts):
            ax = axes[i][j]
            for label in labels:
                for arm in arms:
                    pts = sorted((r["config"]["T"], r["value"]) for r in rows
                                 if r["config"]["arm"] == arm and r["config"]["shape"] == s
                                 and r["config"]["format"] == f and r["label"] == label)
                    if pts:   # one color an arm in every panel: the figure's legend holds
                        ax.plot(*zip(*pts), marker="o", ls="-" if label == "tree" else ":",
                                color=f"C{arms.index(arm) % 10}",
                                label=arm if label == "tree" else f"{arm} @{label}")
            if not ax.lines and (s, f) in skipped:   # say why the panel is empty
                ax.text(0.5, 0.5, "skipped:\n" + skipped[(s, f)].replace(" do not", "\ndo not"),
                        ha="center", va="center", fontsize=7, transform=ax.transAxes)
            ax.set_xscale("log", base=2)
            ax.set_title(f"{s} {f}", fontsize=9)
            ax.set_xlabel("T")
            if j == 0:
                ax.set_ylabel("TFLOP/s (2·T·K·3·D·F)")
    handles = {}
    for ax in axes.flat:   # every arm once, from whichever panel drew it
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    fig.legend(handles.values(), handles.keys(), fontsize=7, loc="lower center",
               ncol=min(len(handles), 4))
    fig.suptitle(f"MoE FFN, {r0['gpu']} @ {r0['commit']} ({r0['timestamp']})", fontsize=10)
    fig.tight_layout(rect=(0, 0.06 + 0.03 * ((len(handles) - 1) // 4), 1, 1))
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
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
            if supported(fmt, shape):
                continue
            experts = make_experts(shape, fmt, dev, distinct=4)
            for T in Ts:
                gen = torch.Generator().manual_seed(T)
                x = torch.randn(T, shape.d_model, generator=gen).to(torch.bfloat16).to(dev)
                ids, w = topk_route(torch.randn(T, shape.n_expert, generator=gen).to(dev),
                                    shape.top_k)
                flops = expert_flops(shape, T, layers=1)
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
