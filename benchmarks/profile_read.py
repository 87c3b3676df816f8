"""Where a read's device time goes, by kernel (diagnostic, not a benchmark: torch.profiler's
timings carry its own overhead; the figures to quote come from prefill_ab / kernel_bench).

    python3 benchmarks/profile_read.py --what ffn --T 512 2048 8192          # one MoE FFN call
    python3 benchmarks/profile_read.py --what resident --T 8192 32768        # a whole read

`ffn`: plane_ffn (check on and off), the fused moe_ffn (Q8_0, and on BF16 experts: strata's BF16
kernel, the bar issue 18 item 3 sets at T = 512), decode-once (what "auto" runs from 128
rows an expert) with strata's BF16 GEMM and with torch._grouped_mm over the decode buffer
(strata.kernels.moe.grouped: "auto"'s choice on sm90+ from 256 rows an expert), and
grouped_mm-bf16 at the qwen3-30b-a3b
expert shape, Q8_0; per arm the wall time of back-to-back calls (host running ahead) beside a
single synchronized call, then the device time of each kernel. `resident`: a full-width model
(`--preset`, default qwen3-30b-a3b; `--quant` a format or a stock mix, default Q8_0; `--layers`
its first N layers, for the models whose experts pass the GPU) with every expert in VRAM reading
one prompt (one chunk), its kernels summed into attention / expert GEMM / dense GEMM / the rest
(`--decoded-gemm triton|grouped` pins the decoded FFN's GEMM for the A/B; `--mla-backend`,
`--mla-block`, `--mla-key-block`, `--mla-merge` MLA's block launch, strata.models.mla_launch;
`--delta SPEC` a hybrid's delta-rule launch, strata.kernels.deltanet.launch, e.g. backend=fla),
beside the compute floor's parts (strata.bench.roofline.floor_parts where present) at this GPU's
settled rates.
Prints a table and writes `profile_<what>.csv` (kernel, calls, device ms per read) under --out.

    python3 benchmarks/profile_read.py --what resident --preset gpt-oss-120b --quant MXFP4 \
        --layers 4 --T 8192 32768
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from strata.atomic import atomic_write
from strata.errors import StrataError
from strata.bench.expert_gemm import dense_weights, grouped_mm_ffn, make_experts
from strata.kernels import moe_ffn, topk_route
from strata.kernels.moe.decoded import moe_ffn_decoded, pin_decoded_gemm
from strata.kernels.norm import pin_norm
from strata.kernels.deltanet.launch import launch_from_flag, pin_delta_launch
from strata.models.mla_launch import BACKENDS, MERGES, pin_mla_launch
from strata.kernels.moe.plane import plane_ffn
from strata.planes import to_plane_set
from strata.shapes import get_preset

CATEGORIES = (  # first match wins: a kernel's name -> what it computes
    ("combine over K", ("_combine",)),
    ("norms / q-k rope", ("_rms_norm", "norm_rope")),
    ("plane GEMM", ("_plane_gemm",)),
    ("expert GEMM (grouped)", ("groupproblemshape", "grouped")),   # cutlass's, via _grouped_mm
    ("grouped FFN glue", ("_silu_mul", "_scatter_kernel")),
    ("expert GEMM (fused)", ("_moe", "moe_")),
    ("expert GEMM (int8)", ("_int8_gemm", "_q8_1")),
    ("expert decode", ("_dequant", "_expand_codes")),
    ("linear attention (delta rule)", ("_gdn_", "_l2norm", "_gated_rms_norm", "conv1d",
                                       "gated_delta_rule", "chunk_fwd_kernel_o",
                                       "recompute_w_u", "chunk_local_cumsum")),
    ("router", ("_softmax_topk",)),
    ("attention", ("flash", "fmha", "attn", "attention", "_attend")),
    ("dense GEMM", ("gemm", "nvjet", "cutlass", "xmma", "sm90")),
    ("routing / sort", ("sort", "scan", "topk", "bincount", "histogram", "cumsum", "radix")),
    ("copy", ("memcpy", "copy")),
)


def category(name: str) -> str:
    low = name.lower()
    return next((c for c, keys in CATEGORIES if any(k in low for k in keys)), "elementwise / other")


def kernels(fn, reps: int):
    """{kernel name: (calls per rep, device ms per rep)} of fn() under the profiler."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    out = {}
    for ev in prof.key_averages():
        dev = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
        if dev > 0 and ev.device_type.name == "CUDA":
            out[ev.key] = (ev.count / reps, dev / 1e3 / reps)
    return out


def ops(fn, n: int) -> None:
    """The n torch ops (aten::copy_, aten::index_select, aten::add, ...) with the most device
    time in one call of fn, each with the strata frames that called it: which line of the model
    a copy or a gather comes from, before a kernel is changed to remove it."""
    fn()
    torch.cuda.synchronize()
    # verbose: without it torch 2.x profiles record no Python stack for the ops
    cfg = torch._C._profiler._ExperimentalConfig(verbose=True)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True,
                 experimental_config=cfg) as p:
        fn()
        torch.cuda.synchronize()
    rows = []
    for ev in p.key_averages(group_by_stack_n=16):
        dev = getattr(ev, "self_device_time_total", None) or getattr(ev, "self_cuda_time_total", 0)
        if dev > 0 and ev.key.startswith("aten::"):
            where = [f.rsplit("strata/", 1)[-1] for f in ev.stack if "strata/" in f
                     and "profile_read" not in f][:3]
            call = [f.split(" of ")[0].replace("<built-in method ", "") for f in ev.stack[:1]
                    if f.startswith("<built-in")]
            rows.append((dev / 1e3, ev.count, ev.key, " < ".join(call + where) or "?"))
    print(f"-- the {n} torch ops with the most device time (self), with the strata frames that "
          f"called them:")
    for ms, count, key, where in sorted(rows, reverse=True)[:n]:
        print(f"   {ms:8.3f} ms {count:4d}x  {key:28s} {where}")


def wall(fn, reps: int) -> tuple[float, float]:
    """(ms a call back to back, ms of one synchronized call), medians."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    back = (time.perf_counter() - t) / reps * 1e3
    one = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        one.append((time.perf_counter() - t) * 1e3)
    return back, sorted(one)[len(one) // 2]


def report(title: str, ks: dict, rows: list, top: int = 12) -> None:
    total = sum(ms for _, ms in ks.values())
    cats = defaultdict(float)
    for k, (_, ms) in ks.items():
        cats[category(k)] += ms
    print(f"-- {title}: device {total:.3f} ms; " +
          "; ".join(f"{c} {ms:.3f}" for c, ms in sorted(cats.items(), key=lambda x: -x[1])))
    for k, (n, ms) in sorted(ks.items(), key=lambda x: -x[1][1])[:top]:
        print(f"   {ms:8.3f} ms {n:7.1f}x  {category(k):20s} {k[:110]}")
    rows += [dict(what=title, kernel=k, category=category(k), calls=n, device_ms=ms)
             for k, (n, ms) in ks.items()]


def ffn(args, rows: list) -> None:
    shape = get_preset("qwen3-30b-a3b")
    ex = make_experts(shape, "Q8_0", "cuda", distinct=8)
    ex16 = make_experts(shape, "BF16", "cuda", distinct=8)   # strata's BF16 kernel: item 3's bar
    planes = to_plane_set(ex)
    wg, wu, wd = dense_weights(ex)
    for T in args.T:
        gen = torch.Generator().manual_seed(T)
        x = torch.randn(T, shape.d_model, generator=gen).to(torch.bfloat16).cuda()
        ids, w = topk_route(torch.randn(T, shape.n_expert, generator=gen).cuda(), shape.top_k)
        def decoded(gemm):
            with pin_decoded_gemm(gemm):
                return moe_ffn_decoded(x, ids, w, ex, check=False)
        arms = {"plane (check)": lambda: plane_ffn(x, ids, w, planes),
                "plane (no check)": lambda: plane_ffn(x, ids, w, planes, check=False),
                "fused moe_ffn (no check)": lambda: moe_ffn(x, ids, w, ex, check=False),
                "BF16 moe_ffn (no check)": lambda: moe_ffn(x, ids, w, ex16, check=False),
                "decode once + BF16 GEMM (no check)": lambda: decoded("triton"),
                "decode once + grouped_mm (no check)": lambda: decoded("grouped"),
                "grouped_mm-bf16": lambda: grouped_mm_ffn(x, ids, w, wg, wu, wd)}
        for arm, fn in arms.items():
            back, one = wall(fn, args.reps)
            ks = kernels(fn, args.reps)
            print(f"T={T} {arm}: {back:.3f} ms a call back to back, {one:.3f} ms synchronized")
            report(f"T={T} {arm}", ks, rows, top=6)


def resident(args, rows: list) -> None:
    from strata.engine.load import load_model, resident_provider
    from strata.models.moe import expert_ffn
    from strata.packs.memory import MemoryPack
    from strata.packs.synth import ExpertFormats
    from strata.packs.synth import Mix
    from strata.packs.mixes import MIXES
    shape = get_preset(args.preset)
    if args.layers:
        shape = shape.with_(n_layer=args.layers)
    t = time.perf_counter()
    fmts = Mix.stock(args.quant, shape) if args.quant.upper() in MIXES else \
        ExpertFormats.of(args.quant)
    pack = MemoryPack(shape, fmts)
    model = load_model(pack, dtype=torch.bfloat16, ffn=expert_ffn(args.ffn))
    prov = resident_provider(pack)
    print(f"{args.preset} {args.quant} ({shape.n_layer} layers) resident in "
          f"{time.perf_counter() - t:.1f} s", flush=True)
    for T in args.T:
        tok = torch.randint(0, shape.vocab, (T,), generator=torch.Generator().manual_seed(T))

        def read():
            with torch.inference_mode():
                model.prefill(tok, prov, logits="none")
        back, one = wall(read, 2)
        print(f"T={T} resident read ({args.ffn}): {one:.3f} ms = {T / one * 1e3:,.0f} tok/s")
        floor(shape, T)
        report(f"T={T} resident read", kernels(read, 1), rows, top=args.top)
        if args.ops:
            ops(read, args.ops)


def floor(shape, T: int) -> None:
    """One line: the compute floor's parts for a one-chunk read of T tokens at this GPU's
    settled rates (what the kernels above are read against)."""
    from strata.bench import roofline as rl
    rates = rl.Rates(shape)
    parts = getattr(rl, "floor_parts", None)
    if parts is None:
        got = {"experts": rl.seconds_at(rl.expert_flops(shape, T), rates.gemm(T)),
               "attention": rl.seconds_at(rl.attention_flops(shape, 0, T), rates.attn(T)),
               "dense": rl.seconds_at(rl.dense_flops(shape, T), rates.dense(T))}
    else:
        got = parts(shape, 0, T, rates)
    total = sum(got.values())
    print(f"T={T} compute floor {total * 1e3:.3f} ms = {T / total:,.0f} tok/s: " +
          "; ".join(f"{k} {v * 1e3:.3f} ms" for k, v in got.items()) +
          f" (rates TFLOP/s {rates.tflops()})", flush=True)


def check_flags(args) -> None:
    """The resident read's flags are refused with --what ffn (its shape is qwen3-30b-a3b Q8_0),
    MLA's launch with a model that has no MLA, and a preset, mix or format strata lacks: one
    line each, before any GPU work."""
    from strata.packs.mixes import MIXES
    from strata.formats.table import get_format
    mla = (args.mla_backend, args.mla_block, args.mla_merge, args.mla_key_block)
    if args.ops < 0:
        raise StrataError(f"--ops takes a count of ops to list (0: none), got {args.ops}")
    if args.what == "ffn":
        given = [f for f, v, d in (("--preset", args.preset, "qwen3-30b-a3b"),
                                   ("--quant", args.quant, "Q8_0"), ("--layers", args.layers, 0),
                                   ("--ffn", args.ffn, "auto"), ("--delta", args.delta, None),
                                   ("--ops", args.ops, 0),
                                   *(("--mla-*", v, None) for v in mla)) if v != d]
        if given:
            raise StrataError(f"{', '.join(dict.fromkeys(given))} set the resident read's "
                              f"model; give --what resident")
        return
    shape = get_preset(args.preset)
    if any(v is not None for v in mla) and not shape.mla:
        raise StrataError(f"--mla-* pins MLA's launch; {args.preset} has no MLA")
    with pin_mla_launch(**{k: v for k, v in zip(("backend", "block", "merge", "key_block"), mla)
                           if v is not None}):
        pass    # the launch these flags make is one MLALaunch takes (its one line if not)
    if args.delta is not None:
        if shape.linear is None:
            raise StrataError(f"--delta pins the delta rule's launch; {args.preset} has no "
                              f"linear-attention layers")
        launch_from_flag(args.delta)
    if args.quant.upper() not in MIXES:
        get_format(args.quant)


def run(args, rows: list) -> None:
    """The profile under the pins the flags ask for."""
    with contextlib.ExitStack() as pins:
        if args.norm != "auto":
            pins.enter_context(pin_norm(args.norm))
        if args.decoded_gemm != "auto":
            pins.enter_context(pin_decoded_gemm(args.decoded_gemm))
        mla = {k: v for k, v in (("backend", args.mla_backend), ("block", args.mla_block),
                                 ("merge", args.mla_merge), ("key_block", args.mla_key_block))
               if v is not None}
        if mla:
            pins.enter_context(pin_mla_launch(**mla))
        if args.delta is not None:
            pins.enter_context(pin_delta_launch(launch_from_flag(args.delta)))
        (ffn if args.what == "ffn" else resident)(args, rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--what", choices=("ffn", "resident"), default="ffn")
    ap.add_argument("--T", nargs="*", type=int, default=[512, 2048, 8192])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--ffn", default="auto", help="the resident model's expert FFN (expert_ffn)")
    ap.add_argument("--preset", default="qwen3-30b-a3b", help="the resident read's model")
    ap.add_argument("--quant", default="Q8_0", help="its experts: a format or a stock mix")
    ap.add_argument("--layers", type=int, default=0, help="its first N layers (0: all)")
    ap.add_argument("--norm", choices=("auto", "torch", "triton"), default="auto",
                    help="the models' norms and q/k RoPE: auto (fused kernels on CUDA) or pinned "
                         "(strata.kernels.norm.pin_norm), for the A/B")
    ap.add_argument("--decoded-gemm", choices=("auto", "triton", "grouped"), default="auto",
                    help="the decoded FFN's GEMM (strata.kernels.moe.grouped.pin_decoded_gemm), for "
                         "the resident read's A/B")
    ap.add_argument("--mla-backend", choices=BACKENDS, default=None,
                    help="MLA's block launch (strata.models.mla_launch.pin_mla_launch), for the "
                         "A/B; default: the launch in force")
    ap.add_argument("--mla-block", type=int, default=None,
                    help="MLA's queries and keys a launch (default: the launch in force)")
    ap.add_argument("--mla-key-block", type=int, default=None,
                    help="the cudnn backend's keys a launch before the masked block (default: "
                         "the launch in force)")
    ap.add_argument("--mla-merge", choices=MERGES, default=None,
                    help="MLA's merge of the key blocks (default: the launch in force)")
    ap.add_argument("--delta", default=None, metavar="SPEC",
                    help="the delta rule's launch for a hybrid (strata.kernels.deltanet.launch: "
                         "backend=fla, split,prec=tf32, ...), for the A/B; default: the launch "
                         "in force")
    ap.add_argument("--ops", type=int, default=0, metavar="N",
                    help="the resident read's N torch ops with the most device time, each with "
                         "the strata lines that called it (a second, stack-recording profile)")
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args(argv)
    try:
        check_flags(args)
    except StrataError as e:
        print(f"profile_read: {e}")
        return 2
    if not torch.cuda.is_available():
        print("profile_read needs CUDA: run it on the GPU (benchmarks/gpu_session.sh profile*)")
        return 2
    rows: list = []
    try:
        run(args, rows)
    except StrataError as e:
        print(f"profile_read: {e}")
        return 2
    tag = "" if args.what == "ffn" or args.preset == "qwen3-30b-a3b" else \
        f"_{args.preset}-{args.quant}" + (f"-L{args.layers}" if args.layers else "")
    tag += "" if args.ffn == "auto" else f"_ffn_{args.ffn}"
    tag += "" if args.norm == "auto" else f"_norm_{args.norm}"
    tag += "" if args.decoded_gemm == "auto" else f"_gemm_{args.decoded_gemm}"
    tag += "".join(f"_mla_{v}" for v in (args.mla_backend, args.mla_block, args.mla_merge)
                   if v is not None)
    tag += "" if args.mla_key_block is None else f"_mla_keys{args.mla_key_block}"
    tag += "" if args.delta is None else "_delta_" + "".join(
        c if c.isalnum() else "-" for c in args.delta)
    path = args.out / f"profile_{args.what}{tag}.csv"
    try:
        args.out.mkdir(parents=True, exist_ok=True)
        with atomic_write(path) as tmp, open(tmp, "w", newline="") as f:   # whole, or not at all
            wr = csv.DictWriter(f, fieldnames=["what", "kernel", "category", "calls", "device_ms"])
            wr.writeheader()
            wr.writerows(rows)
    except (OSError, StrataError) as e:
        print(f"profile_read: cannot write {path}: {e}; pass --out a writable folder")
        return 2
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
