"""Long prompts on a small card: the KV cache in the budget (bf16 or int8, a resident window,
the rest in pinned host memory), tokens/s against the PCIe bound and the compute floor.

For a full-size synthetic qwen3-30b-a3b Q8_0 pack held in pinned host memory (MemoryPack, as
experiments/prefill_ab.py builds it) under `--vram 12GiB`, each cell (prompt, KV dtype, resident
window) reads one prompt through the streaming engine and records tokens/s, the bytes of experts
and of KV streamed, and two bounds from the same run:

    PCIe bound     (expert bytes + KV bytes streamed) / pinned H2D rate measured in this run
    compute floor  sum over chunks: expert FLOPs at torch._grouped_mm's measured rate for the
                   chunk size + causal attention FLOPs (4·H·hd per visible pair at the
                   qwen3 widths: strata.bench.flops) at chunk_attention's measured rate (a
                   chunk against a 4-chunk prefix, counted as one full-attention layer)

Cells (`--cells`, PROMPT:KV:RESIDENT, RESIDENT `all` or tokens). The default is the issue's grid:
prompts 32K, 64K, 131,072 and 262,144, KV bf16 and int8, resident windows 32K and all, ordered so
the cells that matter most run first (131K on 12 GiB, then 32K/64K where both dtypes fit, then
262K) and a step cut by its time limit still records them. Measured on the H200 (e825595): the
32 GB pack pins in ~10 s, a 32K prompt reads in ~2 s, 131K in ~28 s; a cell whose plan or host
memory does not fit (bf16 KV of 131K tokens all resident: 12.9 GB) is recorded as `does not fit`
with the engine's line in well under a second.

    python experiments/long_prompt.py                 # GPU: the default cells
    python experiments/long_prompt.py --smoke         # CPU: a tiny model, seconds

Before the timed read, `--warm engine` (the default) runs the engine's own warm-up
(PrefillEngine.warmup: a two-chunk dry prompt that also probes the long prefixes' attention
launches), what a user's first prompt gets; `--warm full` reads the whole prompt once instead.
Each cell records the warm-up's seconds and, on CUDA, how many kernels Triton compiled or loaded
during the timed read (compiled_in_read, from Triton's caches: 0 when the warm-up covered the
prompt); in the interpreter (the smoke), the variants the timed read launched that the warm-up
did not (variants_missed, strata.engine.variants).

Follows strata.bench: a long-format CSV (tokens_per_s bound by the lower of the two bounds,
pcie_bound_tokens_per_s, compute_floor_tokens_per_s, expert_bytes, kv_bytes, warmup_s,
compiled_in_read, ...) and a PNG. Wall times are perf_counter around a synchronized read of a
whole prompt.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from strata import bench
from strata.bench.roofline import (Rates, attention_flops, compute_floor, gemm_rate, h2d_rate,
                                   pcie_bound)
from strata.engine.host import HostExperts
from strata.engine.variants import KernelLaunches
from strata.engine.prefill import EngineConfig, PrefillEngine
from strata.errors import StrataError
from strata.packs.memory import MemoryPack
from strata.packs.synth import ExpertFormats
from strata.shapes import get_preset

ROOT = Path(__file__).resolve().parents[1]
GIB = 1 << 30
DEFAULT_CELLS = ("131072:int8:32768,131072:bf16:32768,131072:int8:all,131072:bf16:all,"
                 "32768:bf16:all,32768:int8:all,32768:bf16:32768,32768:int8:32768,"
                 "65536:bf16:all,65536:int8:all,65536:bf16:32768,65536:int8:32768,"
                 "262144:int8:32768,262144:bf16:32768,262144:int8:all,262144:bf16:all")
SMOKE_CELLS = "40:bf16:all,40:int8:all,40:bf16:8,40:int8:8"


def parse_cells(text: str) -> list[tuple[int, str, int | None]]:
    out = []
    for cell in text.split(","):
        try:
            T, kv, res = cell.split(":")
            out.append((int(T), kv, None if res == "all" else int(res)))
        except ValueError:
            raise SystemExit(f"long_prompt: --cells takes PROMPT:KV:RESIDENT[,...], got {cell!r}")
    return out


def attn_rate(shape, T: int, reps: int = 3) -> float:
    """chunk_attention's FLOP/s for a T-token chunk after a 4T-token bf16 prefix (one layer)."""
    from strata.kernels.attention import KVSegment, chunk_attention, chunk_attention_torch
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    fn = chunk_attention if dev == "cuda" else chunk_attention_torch
    H, Hkv, hd, P = shape.n_head, shape.n_kv_head, shape.head_dim, 4 * T
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(T, H, hd, device=dev, generator=g).bfloat16()
    k, v = (torch.randn(T, Hkv, hd, device=dev, generator=g).bfloat16() for _ in range(2))
    seg = KVSegment(*(torch.randn(P, Hkv, hd, device=dev, generator=g).bfloat16()
                      for _ in range(2)))
    fn(q, k, v, [seg])
    sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn(q, k, v, [seg])
    sync()
    return attention_flops(shape, P, T, layers=1) * reps / (time.perf_counter() - t0)


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


FIGURES = {"tokens_per_s": "tok/s", "seconds": "s", "expert_bytes": "bytes", "kv_bytes": "bytes",
           "pcie_bound_tokens_per_s": "tok/s", "compute_floor_tokens_per_s": "tok/s",
           "floor_fraction": "fraction", "wait_s": "s", "warmup_s": "s",
           "compiled_in_read": "kernels", "variants_missed": "variants"}


def main(argv=None) -> int:
    ap = bench.parser(__doc__, out=ROOT / "experiments" / "results")
    ap.add_argument("--smoke", action="store_true", help="tiny model on the CPU (checks the script)")
    ap.add_argument("--cells", default=None, help=f"PROMPT:KV:RESIDENT,... (default {DEFAULT_CELLS})")
    ap.add_argument("--vram", default=12 * GIB, type=int, help="VRAM budget in bytes (12 GiB)")
    ap.add_argument("--warm", choices=["full", "engine"], default="engine",
                    help="before the timed read: the engine's own warm-up (engine, "
                         "PrefillEngine.warmup: what a user's first prompt gets), or the whole "
                         "prompt read once (full)")
    args = ap.parse_args(argv)
    tag = "smoke" if args.smoke else bench.gpu_name().replace(" ", "_")
    return bench.main(args, "long_prompt", measure, script=__file__, argv=argv,
                      stem=f"long_prompt-{tag}", plot=plot, summary=lambda rows: None)


def measure(args, rec: bench.Recorder) -> None:
    cells = parse_cells(args.cells or (SMOKE_CELLS if args.smoke else DEFAULT_CELLS))
    shape = get_preset("tiny" if args.smoke else "qwen3-30b-a3b")
    pack = MemoryPack(shape, ExpertFormats.of("Q8_0"))
    t0 = time.perf_counter()
    host = HostExperts(pack.experts, [pl.blob_size for pl in pack.layers], progress=not args.smoke)
    print(f"[long] {pack} {'pinned' if host.pinned else 'loaded'} in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    h2d = h2d_rate(host)
    rates = Rates(shape, measure_gemm=gemm_rate if torch.cuda.is_available()
                  else (lambda s, T: float("nan")), measure_attn=attn_rate)
    cuda = torch.cuda.is_available()
    for T, kv, res in cells:
        cfg = dict(model=f"{'tiny' if args.smoke else 'qwen3-30b-a3b'}-Q8_0", prompt=T, kv=kv,
                   resident="all" if res is None else res)
        try:
            eng = PrefillEngine(pack, EngineConfig(
                vram=args.vram if cuda else 1 << 30, cache=None if cuda else 256 * 1024,
                # the smoke forces chunks of 8 on the GPU too: one chunk would stream no host KV
                max_prompt=T, kv=kv, kv_resident=res, chunk=8 if args.smoke else None,
                ring=4 if args.smoke else None,
                ffn="auto" if cuda else "ref", device=None if cuda else "cpu"), host=host)
            tok = torch.randint(0, shape.vocab, (T,), generator=torch.Generator().manual_seed(T))
            with torch.inference_mode():
                # untimed first: every kernel variant this prompt launches (the chunk's tiles,
                # the int8 pieces' first / middle / last launches) compiled and loaded; the
                # engine's warm-up probes the long prefixes' launches (strata.engine.warm)
                t0 = time.perf_counter()
                with KernelLaunches() as warmed:
                    if args.warm == "full":
                        eng.run(tok, logits="none")
                    else:
                        eng.warmup(T)
                warm_s = time.perf_counter() - t0
                # the timed read: on CUDA Triton's caches say whether it compiled anything
                # (no hooks then: nothing added to a launch); in the interpreter the variants
                with KernelLaunches(record=not cuda) as seen:
                    r = eng.run(tok, logits="none")
        except StrataError as e:
            print(f"[long] T={T} {kv} resident {cfg['resident']}: does not fit: {e}", flush=True)
            rec.add("tokens_per_s", 0.0, "tok/s", bound=f"does not fit: {e}", **cfg)
            continue
        st = r.stats
        pcie = pcie_bound(st.bytes_streamed + r.kv_streamed, h2d)
        floor = sum(compute_floor(shape, c.start, c.tokens, rates.gemm(c.tokens),
                                  rates.attn(c.tokens)) for c in st.chunks)
        row = dict(tokens_per_s=st.tokens_per_s, seconds=st.seconds,
                   expert_bytes=st.bytes_streamed, kv_bytes=r.kv_streamed,
                   pcie_bound_tokens_per_s=T / pcie if pcie else "",
                   compute_floor_tokens_per_s=T / floor if floor else "",
                   floor_fraction=floor / st.seconds if floor and st.seconds else "",
                   wait_s=st.wait_s, warmup_s=warm_s,
                   compiled_in_read=seen.compiled if seen.compiled is not None else "",
                   variants_missed=len(seen.variants - warmed.variants) if not cuda else "")
        bound = min(v for v in (row["pcie_bound_tokens_per_s"], row["compute_floor_tokens_per_s"])
                    if v != "") if (pcie or floor) else None
        for fig, unit in FIGURES.items():
            if row[fig] == "":
                continue
            rec.add(fig, row[fig], unit, bound="min(PCIe bound, compute floor), this run"
                    if fig == "tokens_per_s" and bound else "",
                    bound_value=bound if fig == "tokens_per_s" else None,
                    timer=bench.WALL_TIMER if fig in ("tokens_per_s", "seconds") else "",
                    chunk=r.chunk, ring=r.ring, warm=args.warm, **cfg)
        rec.flush()
        print(f"[long] T={T} {kv} resident {cfg['resident']}: chunk {r.chunk} ring {r.ring} "
              f"{st.tokens_per_s:,.0f} tok/s; experts {st.bytes_streamed / 1e9:.1f} GB, KV "
              f"{r.kv_streamed / 1e9:.2f} GB; PCIe bound {T / pcie if pcie else float('inf'):,.0f}"
              f" tok/s; compute floor {T / floor if floor else float('inf'):,.0f} tok/s; warm-up "
              f"({args.warm}) {warm_s:.1f} s, compiled in the timed read: "
              f"{seen.compiled if cuda else len(seen.variants - warmed.variants)}", flush=True)
        del eng


def plot(long_rows: list[dict], png: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows: dict = {}
    for r in long_rows:
        if r["label"] != "tree":
            continue
        c = r["config"]
        rows.setdefault((c["prompt"], c["kv"], str(c["resident"])), {})[r["figure"]] = r["value"]
    keys = sorted(rows)
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(keys)), 4.2))
    for i, k in enumerate(keys):
        d = rows[k]
        ax.bar(i, d.get("tokens_per_s", 0), 0.6, color="C1" if k[1] == "int8" else "C0")
        for fig_name, ls in (("pcie_bound_tokens_per_s", "-"), ("compute_floor_tokens_per_s", "--")):
            if d.get(fig_name):
                ax.plot([i - 0.3, i + 0.3], [d[fig_name]] * 2, color="k", ls=ls, lw=1.3)
    ax.set_xticks(range(len(keys)), [f"T={T}\n{kv}\nres {r}" for T, kv, r in keys], fontsize=7)
    ax.set_ylabel("prefill tokens/s")
    ax.set_yscale("log")
    ax.set_title(f"long prompts (blue bf16, orange int8; solid PCIe bound, dashed compute floor)"
                 f"\n{long_rows[0]['gpu']} @ {long_rows[0]['commit']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
