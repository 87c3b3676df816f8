"""The streaming prefill A/B (issue 6): auto scan vs the legacy rule, against the roofline.

For each model (a full-size synthetic pack held in host memory: strata.packs.MemoryPack) on a
VRAM budget, and each prompt length: tokens/s of the auto scan and of the legacy rule, both
against the roofline of the same run, plus the all-resident tokens/s of the same model on the
same GPU (every expert in VRAM, nothing streams: the cost of streaming is the ratio).

    roofline time of a prompt = sum over its chunks of
        max(bytes streamed / measured pinned H2D rate, expert FLOPs / measured grouped-GEMM rate)

(expert FLOPs of a chunk: all its layers, 2·T·K·3·D·F each; until 2026-11-30 one layer's were
counted, which changed no recorded roofline: every one was bound by H2D),

with both rates measured in this run: H2D as blob-sized pinned copies one after another (what
the ring does), the GEMM as torch._grouped_mm bf16 on the model's expert shape at the chunk's
size, uniform routing. The roofline leaves attention and the dense layers out on purpose (it is
the issue's definition): where the engine falls short of it, the `where` columns say where the
time went (compute waiting on copies vs copies hidden under compute). A second, tighter bound
(`roofline_attn_*`) adds each chunk's causal attention (4·H·hd FLOPs per query-key pair, all
layers) at the rate of torch SDPA's flash kernel measured at the chunk's size.

Each row also records the fraction of each layer's experts every chunk hit (a second CSV).

    python experiments/prefill_ab.py                      # GPU: both models, 8K and 32K
    python experiments/prefill_ab.py --smoke              # CPU: a tiny model, seconds
    python experiments/prefill_ab.py --base main          # the working tree against main

Follows strata.bench: one long-format CSV (figures tokens_per_s, roofline_fraction, ... per model,
arm and prompt, bound = the roofline; hit_fraction per chunk and layer) and a PNG. The gate: before
timing, the engine's own tests (tests/engine/test_streaming.py: streamed == resident) must pass
(`--no-gate` skips it; --smoke does not run it). Wall times are perf_counter around synchronized
runs (a whole prompt, not one kernel).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from strata import bench  # noqa: E402
from strata.engine.host import HostExperts  # noqa: E402
from strata.engine.prefill import EngineConfig, PrefillEngine  # noqa: E402
from strata.errors import PlanError  # noqa: E402
from strata.models.load import load_model, resident_provider  # noqa: E402
from strata.models.moe import expert_ffn  # noqa: E402
from strata.packs.memory import MemoryPack  # noqa: E402
from strata.packs.synth import ExpertFormats  # noqa: E402
from strata.shapes import get_preset  # noqa: E402

GIB = 1 << 30
MODELS = {  # name: (preset, quant, VRAM per GPU, layers or None)
    "qwen3-30b-a3b-Q8_0": ("qwen3-30b-a3b", "Q8_0", 12 * GIB, None),
    # seed-512e at 12 layers: the seeds' 512-expert shape; 12 x 512 x 5.2 MB = 32 GB of experts,
    # the same host footprint as the 30B pack (the device host has 128 GiB).
    "seed-512e-Q8_0": ("seed-512e", "Q8_0", 12 * GIB, 12),
}
SMOKE = {"demo-Q8_0": ("demo", "Q8_0", None, None)}


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def h2d_rate(host: HostExperts, n: int = 96, device=None) -> float:
    """Bytes/s of blob-sized pinned host->device copies back to back (the ring's pattern)."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    E = host.layers[0].shape[0]
    blobs = [host.blob(i % host.n_layer, (i * 7) % E) for i in range(n)]
    dst = torch.empty(blobs[0].numel(), dtype=torch.uint8, device=dev)

    def sync_dev():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
    for b in blobs[:4]:
        dst[:b.numel()].copy_(b, non_blocking=True)
    sync_dev()
    t0 = time.perf_counter()
    for b in blobs:
        dst[:b.numel()].copy_(b, non_blocking=True)
    sync_dev()
    return sum(b.numel() for b in blobs) / (time.perf_counter() - t0)


def gemm_rate(shape, T: int, reps: int = 5) -> float:
    """FLOP/s of the expert FFN's three GEMMs through torch._grouped_mm bf16, uniform routing
    over E experts, T tokens x K (the ceiling the SPEC's table measures)."""
    E, K, D, F = shape.n_expert, shape.top_k, shape.d_model, shape.d_expert
    if not (torch.cuda.is_available() and hasattr(torch, "_grouped_mm")):
        return float("nan")
    dev = "cuda"
    M = T * K
    counts = torch.full((E,), M // E, dtype=torch.int32)
    counts[: M % E] += 1
    offs = torch.cumsum(counts, 0).to(torch.int32).to(dev)
    x = torch.randn(M, D, device=dev, dtype=torch.bfloat16)
    wgu = torch.randn(E, D, 2 * F, device=dev, dtype=torch.bfloat16) * 0.02
    wd = torch.randn(E, F, D, device=dev, dtype=torch.bfloat16) * 0.02
    h = torch.randn(M, F, device=dev, dtype=torch.bfloat16)

    def run():
        torch._grouped_mm(x, wgu, offs=offs)
        torch._grouped_mm(h, wd, offs=offs)
    return 2 * M * 3 * D * F / bench.time_fn(run, device=dev, warmup=1, repeats=reps).median_s


def sdpa_rate(shape, T: int, reps: int = 3) -> float:
    """FLOP/s of causal flash attention (torch SDPA, bf16, GQA) over one T-token chunk at the
    model's head shape: 2·T²·H·hd FLOPs (QKᵀ and PV, half of them masked away)."""
    if not torch.cuda.is_available():
        return float("nan")
    H, Hkv, hd = shape.n_head, shape.n_kv_head, shape.head_dim
    q = torch.randn(1, H, T, hd, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, Hkv, T, hd, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)

    def run():
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return 2 * T * T * H * hd / bench.time_fn(run, device="cuda", warmup=1,
                                              repeats=reps).median_s


def attention_flops(shape, P: int, T: int) -> float:
    """Causal attention FLOPs of a T-token chunk after P cached positions, all layers: query i
    sees P + i + 1 keys, 4·H·hd FLOPs per query-key pair (QKᵀ and PV)."""
    return 4.0 * shape.n_head * shape.head_dim * (T * P + T * (T + 1) / 2) * shape.n_layer


def roofline(res, shape, h2d: float, gemm: dict, attn: dict | None = None) -> float:
    """Seconds the prompt needs at the roofline (see the module docstring). With `attn` (a rate
    cache like `gemm`), each chunk's compute side also pays its causal attention at the measured
    SDPA rate: a second, tighter bound (the issue's roofline leaves attention out)."""
    t = 0.0
    for c in res.stats.chunks:
        P = c.start
        flops = 2 * c.tokens * shape.top_k * 3 * shape.d_model * shape.d_expert * shape.n_layer
        rate = gemm.get(c.tokens) or gemm_rate(shape, c.tokens)
        gemm[c.tokens] = rate
        t_comp = flops / rate if rate == rate else 0.0
        if attn is not None:
            ar = attn.get(c.tokens) or sdpa_rate(shape, c.tokens)
            attn[c.tokens] = ar
            t_comp += attention_flops(shape, P, c.tokens) / ar if ar == ar else 0.0
        t += max(c.bytes_streamed / h2d, t_comp)
    return t


WALL = "perf_counter (wall, synchronized)"
ROW_FIGURES = {  # figure -> unit; each row of a run becomes these long-format figures
    "tokens_per_s": "tok/s", "seconds": "s", "bytes_streamed": "bytes", "h2d_gbps": "GB/s",
    "wait_s": "s", "copy_s": "s", "roofline_s": "s", "roofline_tokens_per_s": "tok/s",
    "roofline_fraction": "fraction", "roofline_attn_s": "s",
    "roofline_attn_tokens_per_s": "tok/s", "roofline_attn_fraction": "fraction",
    "hit_min": "fraction", "hit_mean": "fraction",
    "cache_hits": "experts", "routed": "experts", "room": "bytes", "bytes_needed": "bytes",
}
CONFIG = ("model", "arm", "prompt", "chunk", "ring", "rule")


def record(rec: bench.Recorder, row: dict, gate: str) -> None:
    """One run's row -> long-format figures, each with what bounds it."""
    cfg = {k: row[k] for k in CONFIG}
    if "gemm_tflops" in row:
        cfg["gemm_tflops"] = row["gemm_tflops"]
    roof = row.get("roofline_tokens_per_s") or None
    for fig, unit in ROW_FIGURES.items():
        if row.get(fig, "") == "":
            continue
        bound, bv = "", None
        if fig == "tokens_per_s" and roof:
            bound, bv = "roofline: max(H2D measured, grouped_mm measured) per chunk", roof
        elif fig == "h2d_gbps":
            bound, bv = "pinned H2D blob by blob, measured in this run", row["h2d_ceiling_gbps"]
        elif fig in ("roofline_fraction", "roofline_attn_fraction"):
            bound, bv = "1.0 = at the roofline", 1.0
        elif fig == "bytes_needed":
            bound, bv = "room", row["room"]
        rec.add(fig, row[fig], unit, bound=bound, bound_value=bv, gate=gate,
                timer=WALL if fig in ("tokens_per_s", "seconds") else "", **cfg)


def main(argv=None) -> int:
    ap = bench.parser(__doc__, out=ROOT / "experiments" / "results")
    ap.add_argument("--smoke", action="store_true", help="tiny model on the CPU (checks the script)")
    ap.add_argument("--models", default=None, help=f"comma list of {', '.join(MODELS)}")
    ap.add_argument("--prompts", default="8192,32768")
    ap.add_argument("--arms", default="auto,legacy,resident")
    ap.add_argument("--no-gate", action="store_true",
                    help="skip the engine tests run before timing (the gate)")
    args = ap.parse_args(argv)
    tag = "smoke" if args.smoke else bench.gpu_name().replace(" ", "_")
    return bench.main(args, "prefill_ab", measure, script=__file__, argv=argv,
                      stem=f"prefill_ab-{tag}", plot=plot, summary=lambda rows: None)


def measure(args, rec: bench.Recorder) -> None:
    gate = ""
    if not (args.smoke or args.no_gate):
        gate = bench.pytest_gate("tests/engine/test_streaming.py", cwd=ROOT)
    models = SMOKE if args.smoke else {k: MODELS[k] for k in (args.models.split(",") if
                                                              args.models else MODELS)}
    prompts = [300, 700] if args.smoke else [int(p) for p in args.prompts.split(",")]
    arms = args.arms.split(",")
    gemm: dict = {}
    attn: dict = {}
    for name, (preset, quant, vram, layers) in models.items():
        shape = get_preset(preset)
        if layers:
            shape = shape.with_(n_layer=layers)
        t0 = time.perf_counter()
        pack = MemoryPack(shape, ExpertFormats.of(quant))
        host = HostExperts(pack.experts, [pl.blob_size for pl in pack.layers], progress=True)
        print(f"[{name}] {pack} built and {'pinned' if host.pinned else 'loaded'} in "
              f"{time.perf_counter() - t0:.1f} s", flush=True)
        h2d = h2d_rate(host)
        print(f"[{name}] pinned H2D, blob by blob: {h2d / 1e9:.1f} GB/s", flush=True)
        gemm.clear()
        attn.clear()
        max_prompt = max(prompts)
        for arm in arms:
            if arm == "resident":
                if not torch.cuda.is_available() and not args.smoke:
                    continue
                model = load_model(pack, dtype=torch.bfloat16 if torch.cuda.is_available()
                                   else torch.float32,
                                   ffn=expert_ffn("auto" if torch.cuda.is_available() else "torch"))
                prov = resident_provider(pack)
                for T in prompts:
                    tok = torch.randint(0, shape.vocab, (T,), generator=torch.Generator().manual_seed(T))
                    with torch.inference_mode():   # warm at this shape (Triton compiles per tile)
                        model.prefill(tok, prov, logits="none")
                    sync()
                    t1 = time.perf_counter()
                    with torch.inference_mode():
                        model.prefill(tok, prov, logits="none")
                    sync()
                    sec = time.perf_counter() - t1
                    record(rec, dict(model=name, arm="resident", prompt=T, chunk=T, ring="",
                                     rule="resident", tokens_per_s=T / sec, seconds=sec), gate)
                    print(f"[{name}] resident T={T}: {T / sec:,.0f} tok/s", flush=True)
                del model, prov
                torch.cuda.empty_cache() if torch.cuda.is_available() else None
                continue
            cfg = EngineConfig(vram=vram or 1 << 30, scan=arm, max_prompt=max_prompt,
                               cache=int(pack.expert_bytes * 0.35) if vram is None else None,
                               scan_max=1024 if args.smoke else 32768,
                               ffn="auto" if torch.cuda.is_available() else "torch")
            eng = PrefillEngine(pack, cfg, host=host)
            try:
                eng.plan()
            except PlanError as e:   # e.g. legacy's fixed ring leaves no room for any chunk
                print(f"[{name}] {arm}: {e}", flush=True)
                for T in prompts:
                    rec.add("tokens_per_s", 0.0, "tok/s", bound=f"does not fit: {e}",
                            model=name, arm=arm, prompt=T, chunk="", ring="",
                            rule="does not fit")
                del eng
                continue
            for T in prompts:
                tok = torch.randint(0, shape.vocab, (T,), generator=torch.Generator().manual_seed(T))
                with torch.inference_mode():
                    # the first read of a shape compiles its tiles: time the second
                    eng.run(tok, logits="none")
                    res = eng.run(tok, logits="none")
                st = res.stats
                roof = roofline(res, shape, h2d, gemm)
                roof_a = roofline(res, shape, h2d, gemm, attn)   # the bound with attention
                fr = [f for c in st.chunks for f in c.hit_fraction]
                row = dict(model=name, arm=arm, prompt=T, chunk=res.chunk, ring=res.ring,
                           rule=res.plan.rule, tokens_per_s=st.tokens_per_s, seconds=st.seconds,
                           bytes_streamed=st.bytes_streamed, h2d_gbps=st.h2d_gbps,
                           h2d_ceiling_gbps=h2d / 1e9, wait_s=st.wait_s, copy_s=st.copy_s,
                           roofline_s=roof, roofline_tokens_per_s=T / roof if roof else "",
                           roofline_fraction=roof / st.seconds if st.seconds else "",
                           roofline_attn_s=roof_a,
                           roofline_attn_tokens_per_s=T / roof_a if roof_a else "",
                           roofline_attn_fraction=roof_a / st.seconds if st.seconds else "",
                           gemm_tflops={k: round(v / 1e12, 1) for k, v in gemm.items()},
                           hit_min=min(fr), hit_mean=sum(fr) / len(fr),
                           cache_hits=st.cache_hits, routed=st.routed,
                           room=res.plan.room, bytes_needed=res.plan.bytes_needed)
                record(rec, row, gate)
                for ci, c in enumerate(st.chunks):
                    for li, f in zip(c.layers, c.hit_fraction):
                        rec.add("hit_fraction", f, "fraction", model=name, arm=arm, prompt=T,
                                chunk_index=ci, chunk_tokens=c.tokens, layer=li)
                rec.flush()
                print(f"[{name}] {arm:6s} T={T}: chunk {res.chunk} ring {res.ring} "
                      f"({res.plan.rule}) {st.tokens_per_s:,.0f} tok/s; roofline "
                      f"{T / roof:,.0f} tok/s -> {roof / st.seconds:.2f} of it (with attention "
                      f"{T / roof_a:,.0f} -> {roof_a / st.seconds:.2f}); streamed "
                      f"{st.bytes_streamed / 1e9:.1f} GB at {st.h2d_gbps:.1f} GB/s; compute waited "
                      f"{st.wait_s:.2f} s; hit mean {row['hit_mean']:.3f} min {row['hit_min']:.3f}",
                      flush=True)
            del eng
        del host, pack


def runs(long_rows: list[dict], label: str) -> list[dict]:
    """The long rows of one label back to one dict per (model, arm, prompt)."""
    out: dict = {}
    for r in long_rows:
        if r["label"] != label or r["figure"] == "hit_fraction":
            continue
        c = r["config"]
        row = out.setdefault((c["model"], c["arm"], c["prompt"]), dict(c))
        row[r["figure"]] = r["value"]
    return list(out.values())


def plot(long_rows: list[dict], png: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    title = f"{long_rows[0]['gpu']} @ {long_rows[0]['commit']}"
    rows = runs(long_rows, "tree")
    groups = sorted({(r["model"], r["prompt"]) for r in rows})
    arms = ["auto", "legacy", "resident"]
    fig, ax = plt.subplots(figsize=(max(6, 2.2 * len(groups)), 4.2))
    w = 0.25
    for i, arm in enumerate(arms):
        xs, ys = [], []
        for g, (m, T) in enumerate(groups):
            r = next((r for r in rows if r["model"] == m and r["prompt"] == T and r["arm"] == arm), None)
            if r:
                xs.append(g + (i - 1) * w)
                ys.append(r["tokens_per_s"])
                if r.get("roofline_tokens_per_s"):
                    ax.plot([g + (i - 1) * w - w / 2, g + (i - 1) * w + w / 2],
                            [r["roofline_tokens_per_s"]] * 2, color="k", lw=1.5)
                if r.get("roofline_attn_tokens_per_s"):
                    ax.plot([g + (i - 1) * w - w / 2, g + (i - 1) * w + w / 2],
                            [r["roofline_attn_tokens_per_s"]] * 2, color="k", lw=1.2, ls="--")
        ax.bar(xs, ys, w, label=arm)
    ax.set_xticks(range(len(groups)), [f"{m}\nT={T}" for m, T in groups], fontsize=8)
    ax.set_ylabel("prefill tokens/s")
    ax.set_title(f"streamed prefill, auto vs legacy (black: roofline; dashed: with attention)"
                 f"\n{title}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
