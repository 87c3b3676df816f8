"""`strata bench PACK -p 8192,32768 [-r 3] [--vram SIZE ...] [-o md|csv|json]`

Prompt-reading throughput in llama-bench's manner: one process, one engine (host blobs pinned
and the cache filled once), a warm-up per prompt length (PrefillEngine.warmup: every kernel
variant its plan launches is compiled and loaded first; `--no-warmup` measures cold), then `-r`
timed repeats of each length. A row per length: mean ± sd tokens/s, the plan (chunk, ring),
bytes streamed per read, and beside it the bounds measured in the same run:

    PCIe bound    = (expert bytes streamed + host-held KV bytes staged back) / pinned H2D
                    rate (blob-sized copies, measured here)
    compute floor = expert GEMMs at torch._grouped_mm bf16's measured rate + causal attention
                    (sliding windows, MLA as counted per architecture) at torch SDPA's measured
                    rate + dense GEMMs at torch.mm bf16's measured rate + linear-attention
                    layers at the delta rule's measured rate, chunk by chunk
                    (strata.bench.roofline)

(both as tokens/s: prompt tokens / bound seconds; the compute floor needs CUDA and reads n/a on
the CPU). The floor's parts, in seconds over the whole prompt, are columns of their own
(floor_experts_s, floor_attention_s, floor_linear_s, floor_dense_s) and a line under the
markdown table; linear_at_dense_s prices a hybrid's delta rule at the dense rate instead (the
stricter figure, not in the bound); kv_streamed is the host-held KV staged back. The budget flags
are strata plan's and strata prefill's (strata.commands._args).
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import math
import statistics
import sys
import time

import torch

from strata.commands._args import add_budget_flags
from strata.errors import StrataError
from strata.engine.host import expert_bytes
from strata.engine.prompt_plan import prefix_path
from strata.bench.peaks import Peaks, past_budget
from strata.kernels.deltanet.launch import delta_spec
from strata.units import fmt_bytes

FORMATS = ("md", "csv", "json")
FLOOR_PARTS = ("experts", "attention", "linear", "dense")     # strata.bench.roofline's
PART_COLUMNS = [f"floor_{k}_s" for k in FLOOR_PARTS]
COLUMNS = ["model", "pack_bytes", "vram", "kv", "delta", "prefix_attention", "dense_layers",
           "planned_for",
           "cache_bytes", "peak_vram", "test", "n_tokens", "chunk", "ring", "reps",
           "tokens_per_s", "tokens_per_s_sd", "seconds", "bytes_streamed", "kv_streamed",
           "h2d_gbps", "pcie_bound_tokens_per_s", "compute_floor_tokens_per_s",
           "bound_tokens_per_s", "of_bound",
           "warmup_s", "wait_s", *PART_COLUMNS, "linear_at_dense_s"]


def lengths(text: str) -> list[int]:
    try:
        out = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"-p takes comma-separated prompt lengths like "
                                         f"8192,32768, got {text!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"-p needs prompt lengths >= 1, got {text!r}")
    return out


def add_parser(sub) -> argparse.ArgumentParser:
    from strata.commands._args import DTYPES
    from strata.commands.prefill import add_run_flags
    p = sub.add_parser("bench", help="tokens/s per prompt length, repeats, beside the bounds",
                       description=__doc__.split("\n\n")[1].replace("\n", " "))
    p.add_argument("pack", help="a pack file (strata pack / strata synth)")
    p.add_argument("-p", "--prompts", type=lengths, default=[512, 8192], metavar="N,N,...",
                   help="prompt lengths in tokens (default 512,8192)")
    p.add_argument("-r", "--repeats", type=int, default=3, metavar="R",
                   help="timed reads of each length (default 3)")
    p.add_argument("-o", "--output", choices=FORMATS, default="md",
                   help="md (a table), csv or json rows (default md)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random prompts (default 0)")
    add_budget_flags(p)
    p.add_argument("--devices", default=None, metavar="D,D,...",
                   help="devices of the participants (default cuda:0.. or cpu)")
    p.add_argument("--dtype", choices=["auto", *DTYPES], default="auto",
                   help="dense compute dtype (auto: bfloat16 on cuda, float32 on cpu)")
    p.add_argument("--progress", action="store_true", help="progress bars on stderr")
    add_run_flags(p)
    return p


def run(args) -> int:
    from strata.bench.roofline import (Rates, bound_rate, floor_parts_of, h2d_rate,
                                        linear_at_dense, roofline)
    from strata.commands._args import engine_config
    from strata.commands._prompt import check_context, open_checked
    from strata.commands._args import refuse_unfit_plan
    from strata.commands.prefill import check_trace, write_trace
    from strata.engine.prefill import PrefillEngine
    from strata.engine.trace import LaneTrace

    if args.repeats < 1:
        raise StrataError(f"-r must be at least 1, got {args.repeats}")
    trace_path = check_trace(args)
    pack = open_checked(args)
    longest = max(args.prompts)
    check_context(longest, pack.shape, "the longest -p prompt")
    cfg = engine_config(args, longest, progress=args.progress)
    for n in args.prompts:
        refuse_unfit_plan(pack, cfg, n)
    t0 = time.perf_counter()
    engine = PrefillEngine(pack, cfg, early=getattr(args, "_early", None))
    startup = time.perf_counter() - t0
    h2d = h2d_rate(engine.host, device=engine.device)       # the PCIe bound's rate, this run
    no_gemm = Rates(engine.shape, measure_gemm=lambda s, T: math.nan,
                    measure_attn=lambda s, T: math.nan)
    rates = Rates(engine.shape)
    cache_bytes = sum(p.cache.buffer.numel() for p in engine.parts)
    trace = LaneTrace(str(args.pack)) if trace_path else None
    rows = []
    for n in args.prompts:
        g = torch.Generator().manual_seed(args.seed + n)
        tokens = torch.randint(0, engine.shape.vocab, (n,), generator=g, dtype=torch.int64)
        warm = 0.0 if args.no_warmup else engine.warmup(n)
        if trace is not None and trace not in engine.observers:
            engine.observers.append(trace)
        tps, secs, res = [], [], None
        held = Peaks([p.device for p in engine.parts])
        for _ in range(args.repeats):
            with torch.inference_mode():
                res = engine.run(tokens, logits="none")
            secs.append(res.stats.seconds)
            tps.append(res.stats.tokens_per_s)
        st = res.stats
        peaks = held.read()
        for line in past_budget([p.name for p in engine.parts], peaks, cfg.vram,
                                f"the {n}-token reads"):
            print(f"strata bench: {line}", file=sys.stderr)
        # every byte the link carries in: the experts, and a long prompt's host-held KV staged
        # back for the later chunks' attention (at 131K on 12 GiB, a third more than experts)
        pcie_s = roofline(st.chunks, engine.shape, h2d, no_gemm) + res.kv_streamed / h2d
        parts = floor_parts_of(st.chunks, engine.shape, rates)
        floor_s = sum(parts.values())
        pcie_tps = n / pcie_s if pcie_s > 0 else None
        floor_tps = n / floor_s if floor_s > 0 else None
        bound = bound_rate(pcie_tps, floor_tps)
        rows.append({
            "model": f"{engine.shape.arch} L{engine.shape.n_layer} E{engine.shape.n_expert}",
            "pack_bytes": expert_bytes(engine.pack),
            "vram": "+".join(fmt_bytes(v) for v in cfg.vram),
            "kv": str(getattr(args, "kv", "") or "bf16"),
            # a hybrid's delta-rule launch (strata.kernels.deltanet.launch): which path ran
            "delta": delta_spec(engine.shape, engine.dtype.itemsize),
            # a later chunk's prefix through the engine's KV: chunk_attention or blocks
            # (attention/flash_prefix); empty where no route applies (prompt_plan.prefix_path)
            "prefix_attention": prefix_path(engine.shape, engine.cfg, engine.device.type) or "",
            # the layers' block-format matrices: kept as blocks (the plan counts a turn's
            # decode: Sizes.dense_scratch), decoded at load, or none to keep ("")
            "dense_layers": ("blocks" if any(engine.sizes.dense_scratch) else
                             "decoded" if cfg.dense_layers == "decoded" else ""),
            # one engine reads every -p length, planned for the longest (--max-prompt): a
            # shorter prompt runs under that plan's smaller expert cache, so its row says which
            "planned_for": cfg.max_prompt, "cache_bytes": cache_bytes,
            # what the process held live on each GPU at the timed reads' peak (torch's
            # allocator: the cache, dense weights, KV and every transient; not the CUDA
            # context), beside the --vram it was planned for; empty off CUDA
            "peak_vram": "+".join(fmt_bytes(v) for v in peaks if v is not None),
            "test": f"pp{n}", "n_tokens": n, "chunk": res.chunk, "ring": res.ring,
            "reps": args.repeats,
            "tokens_per_s": statistics.fmean(tps),
            "tokens_per_s_sd": statistics.stdev(tps) if len(tps) > 1 else 0.0,
            "seconds": statistics.fmean(secs),
            "bytes_streamed": st.bytes_streamed, "kv_streamed": res.kv_streamed,
            "h2d_gbps": h2d / 1e9,
            "pcie_bound_tokens_per_s": pcie_tps, "compute_floor_tokens_per_s": floor_tps,
            "bound_tokens_per_s": bound,
            "of_bound": (n / statistics.fmean(secs)) / bound if bound else None,
            "warmup_s": warm, "wait_s": st.wait_s,
            **{f"floor_{k}_s": v if floor_s > 0 else None for k, v in parts.items()},
            # the stricter price of the delta rule (the dense GEMM rate; roofline.floor_parts
            # says why the floor takes the rule's own): beside it, not in the bound
            "linear_at_dense_s": linear_at_dense(st.chunks, engine.shape, rates),
        })
    written = write_trace(trace, trace_path)
    out = {"md": markdown, "csv": to_csv, "json": to_json}[args.output](rows)
    sys.stdout.write(out)
    if args.output == "md":
        print(f"\nstartup {startup:.2f} s (host blobs {'pinned' if engine.host.pinned else 'pageable'}"
              f", cache {fmt_bytes(cache_bytes)} filled, planned for {cfg.max_prompt:,} tokens); "
              f"pinned H2D {h2d / 1e9:.1f} GB/s measured in this run"
              + (f"; trace {', '.join(written)}" if written else ""))
    return 0


def _num(v, fmt="{:,.1f}") -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)


def markdown(rows: list[dict]) -> str:
    head = ["model", "experts", "vram", "kv", "chunk", "ring", "test", "t/s", "streamed",
            "PCIe bound t/s", "compute floor t/s", "of bound"]
    lines = ["| " + " | ".join(head) + " |",
             "| " + " | ".join("---:" if i > 3 else "---" for i in range(len(head))) + " |"]
    for r in rows:
        cells = [r["model"], fmt_bytes(r["pack_bytes"]), r["vram"], r["kv"], str(r["chunk"]),
                 str(r["ring"]), r["test"],
                 f"{r['tokens_per_s']:,.1f} ± {r['tokens_per_s_sd']:,.1f}",
                 fmt_bytes(r["bytes_streamed"]), _num(r["pcie_bound_tokens_per_s"]),
                 _num(r["compute_floor_tokens_per_s"]), _num(r["of_bound"], "{:.2f}")]
        lines.append("| " + " | ".join(cells) + " |")
    parts = [f"{r['test']} " + ", ".join(f"{k} {_num(r[f'floor_{k}_s'], '{:.3f}')}"
                                         for k in FLOOR_PARTS)
             for r in rows if r.get("floor_experts_s") is not None]
    if parts:
        lines += ["", "compute floor by part, seconds a prompt: " + "; ".join(parts)]
    deltas = sorted({r["delta"] for r in rows if r.get("delta")})
    if deltas:
        lines += ["", f"delta rule launch (linear-attention layers): {', '.join(deltas)}"]
    return "\n".join(lines) + "\n"


def to_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r[k] is None else r[k]) for k in COLUMNS})
    return buf.getvalue()


def to_json(rows: list[dict]) -> str:
    return json.dumps(rows, indent=1) + "\n"
