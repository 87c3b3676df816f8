"""The streaming prefill A/B: auto scan vs the legacy rule, against the roofline.

For each model (a full-size synthetic pack held in host memory: strata.packs.MemoryPack) on a
VRAM budget, and each prompt length: tokens/s of the auto scan and of the legacy rule, both
against the roofline of the same run, plus the all-resident tokens/s of the same model on the
same GPU (every expert in VRAM, nothing streams: the cost of streaming is the ratio).

    roofline time of a prompt = sum over its chunks of
        max(bytes streamed / measured pinned H2D rate, expert FLOPs / measured grouped-GEMM rate)

(strata.bench.roofline: the rates, the FLOP counts and the bounds), with both rates measured in
this run: H2D as blob-sized pinned copies one after another (what the ring does), the GEMM as
torch._grouped_mm bf16 on the model's expert shape at the chunk's size, uniform routing. The
roofline leaves attention and the dense layers out on purpose: it bounds the expert streaming.
Where the engine falls short of it, wait_s and copy_s say where the time went (compute waiting
on copies vs copies hidden under compute). A second, tighter bound (`roofline_attn_*`) adds each
chunk's causal attention at the rate of torch SDPA's flash kernel measured at the chunk's size;
the third (`roofline_full_*`) also the dense layers (q/k/v/o projections, the router, shared
experts and leading dense FFNs) at torch.mm bf16's rate at their sizes: the full compute floor.

The all-resident read (one chunk of T tokens at P = 0) is judged against that full floor alone
(nothing streams): `floor_tokens_per_s` (attention + experts + dense at the measured rates) and
`floor_fraction` = floor seconds / read seconds (issue 18 item 4: target >= 0.8 at 32K). Every
rate is timed settled (strata.bench.roofline.SETTLE_S, recorded as `rates_settle_s`): before
7d195b6 the floor was timed in a burst of 4-6 calls, 10-20% above the rates a read holds.

Each row also records the fraction of each layer's experts every chunk hit (a second CSV).

Overlap (issue 18 item 2; a second PNG, `*-overlap.png`): the copy engine's achieved rate over
its window during the read (`copy_window_gbps`: bytes / each chunk's first-copy-start to
last-copy-end, so idle gaps inside the read count against it) beside the pinned rate measured in
this run (`copy_rate_fraction`, target >= 0.95), and the time compute waited on copies (`wait_s`)
beside the wait the PCIe bound forces (max(0, bytes / pinned rate - the all-resident read's
time): compute may only wait where copying the bytes takes longer than computing without them).

    python experiments/prefill_ab.py                      # GPU: both models, 8K and 32K
    python experiments/prefill_ab.py --smoke              # CPU: a tiny model, seconds
    python experiments/prefill_ab.py --base main          # the working tree against main
    python experiments/prefill_ab.py --arms auto,plane,resident   # + the auto scan with the
                                                          # plane expert GEMM (ffn="plane", GPU)

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

from strata import bench
from strata.bench.roofline import SETTLE_S, Rates, compute_floor, h2d_rate, roofline
from strata.engine.host import HostExperts
from strata.engine.prefill import EngineConfig, PrefillEngine
from strata.errors import PlanError
from strata.engine.load import load_model, resident_provider
from strata.models.moe import expert_ffn
from strata.packs.memory import MemoryPack
from strata.packs.synth import ExpertFormats
from strata.shapes import get_preset

ROOT = Path(__file__).resolve().parents[1]

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


ROW_FIGURES = {  # figure -> unit; each row of a run becomes these long-format figures
    "tokens_per_s": "tok/s", "seconds": "s", "bytes_streamed": "bytes", "h2d_gbps": "GB/s",
    "wait_s": "s", "copy_s": "s", "roofline_s": "s", "roofline_tokens_per_s": "tok/s",
    "roofline_fraction": "fraction", "roofline_attn_s": "s",
    "roofline_attn_tokens_per_s": "tok/s", "roofline_attn_fraction": "fraction",
    "roofline_full_s": "s", "roofline_full_tokens_per_s": "tok/s",
    "roofline_full_fraction": "fraction",
    "floor_s": "s", "floor_tokens_per_s": "tok/s", "floor_fraction": "fraction",
    "hit_min": "fraction", "hit_mean": "fraction",
    "copy_window_gbps": "GB/s", "copy_rate_fraction": "fraction", "copy_busy_fraction": "fraction",
    "wait_fraction": "fraction", "pcie_s": "s", "h2d_ceiling_gbps": "GB/s",
    "cache_hits": "experts", "routed": "experts", "room": "bytes", "bytes_needed": "bytes",
}
CONFIG = ("model", "arm", "prompt", "chunk", "ring", "rule")
FLOOR = "compute floor: attention + experts + dense at measured rates"


def resident_floor(shape, T: int, seconds: float, rates: Rates) -> dict:
    """The all-resident read's compute floor (one chunk of T tokens at P = 0: attention +
    experts + dense at the rates measured for T) as row figures: floor_s, floor_tokens_per_s,
    floor_fraction (floor seconds / the read's `seconds`); empty where no rate was measured
    (the CPU) and the floor is 0."""
    floor = compute_floor(shape, 0, T, rates.gemm(T), rates.attn(T), dense=rates.dense(T),
                          linear=rates.linear(T))
    if not floor:
        return dict(floor_s="", floor_tokens_per_s="", floor_fraction="")
    return dict(floor_s=floor, floor_tokens_per_s=T / floor,
                floor_fraction=floor / seconds if seconds else "")


def record(rec: bench.Recorder, row: dict, gate: str) -> None:
    """One run's row -> long-format figures, each with what bounds it."""
    cfg = {k: row[k] for k in CONFIG}
    for k in ("gemm_tflops", "rates_tflops"):
        if k in row:
            cfg[k] = row[k]
            cfg["rates_settle_s"] = SETTLE_S    # the rates were timed settled (roofline)
    roof = row.get("roofline_tokens_per_s") or None
    floor = row.get("floor_tokens_per_s") or None
    for fig, unit in ROW_FIGURES.items():
        if row.get(fig, "") == "":
            continue
        bound, bv = "", None
        if fig == "tokens_per_s" and roof:
            bound, bv = "roofline: max(H2D measured, grouped_mm measured) per chunk", roof
        elif fig == "tokens_per_s" and floor:
            bound, bv = FLOOR, floor
        elif fig == "floor_fraction":
            bound, bv = f"target >= 0.8 of the {FLOOR}", 0.8
        elif fig in ("h2d_gbps", "copy_window_gbps"):
            bound, bv = "pinned H2D blob by blob, measured in this run", row["h2d_ceiling_gbps"]
        elif fig == "copy_rate_fraction":
            bound, bv = "target: the copy engine at >= 0.95 of the pinned rate", 0.95
        elif fig in ("roofline_fraction", "roofline_attn_fraction", "roofline_full_fraction"):
            bound, bv = "1.0 = at the roofline", 1.0
        elif fig == "bytes_needed":
            bound, bv = "room", row["room"]
        rec.add(fig, row[fig], unit, bound=bound, bound_value=bv, gate=gate,
                timer=bench.WALL_TIMER if fig in ("tokens_per_s", "seconds") else "", **cfg)


def main(argv=None) -> int:
    ap = bench.parser(__doc__, out=ROOT / "experiments" / "results")
    ap.add_argument("--smoke", action="store_true", help="tiny model on the CPU (checks the script)")
    ap.add_argument("--models", default=None, help=f"comma list of {', '.join(MODELS)}")
    ap.add_argument("--prompts", default="8192,32768")
    ap.add_argument("--arms", default="auto,legacy,resident")
    ap.add_argument("--batch", type=int, default=None,
                    help="experts per streamed pass (EngineConfig.batch; default half the ring)")
    ap.add_argument("--no-gate", action="store_true",
                    help="skip the engine tests run before timing (the gate)")
    args = ap.parse_args(argv)
    if args.batch is not None and args.batch < 1:
        ap.error(f"--batch is experts per pass, at least 1; got {args.batch}")
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
        rates = Rates(shape)   # GEMM and attention rates of this shape, by chunk size
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
                    fl = resident_floor(shape, T, sec, rates)
                    record(rec, dict(model=name, arm="resident", prompt=T, chunk=T, ring="",
                                     rule="resident", tokens_per_s=T / sec, seconds=sec,
                                     rates_tflops=rates.tflops(), **fl), gate)
                    print(f"[{name}] resident T={T}: {T / sec:,.0f} tok/s; compute floor "
                          f"(attention + experts + dense) " + (
                              f"{fl['floor_tokens_per_s']:,.0f} -> {fl['floor_fraction']:.2f}"
                              if fl["floor_s"] else "not measured (no CUDA)"), flush=True)
                del model, prov
                torch.cuda.empty_cache() if torch.cuda.is_available() else None
                continue
            if arm == "plane" and not torch.cuda.is_available():
                continue   # the plane GEMM in the interpreter: minutes, and no speed to show
            cfg = EngineConfig(vram=vram or 1 << 30, scan="auto" if arm == "plane" else arm,
                               max_prompt=max_prompt,
                               cache=int(pack.expert_bytes * 0.35) if vram is None else None,
                               scan_max=1024 if args.smoke else 32768, batch=args.batch,
                               ffn="plane" if arm == "plane" else
                               "auto" if torch.cuda.is_available() else "torch")
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
                roof = roofline(st.chunks, shape, h2d, rates)
                roof_a = roofline(st.chunks, shape, h2d, rates, attention=True)
                roof_f = roofline(st.chunks, shape, h2d, rates, attention=True, dense=True)
                fr = [f for c in st.chunks for f in c.hit_fraction]
                row = dict(model=name, arm=arm, prompt=T, chunk=res.chunk, ring=res.ring,
                           rule=res.plan.rule, tokens_per_s=st.tokens_per_s, seconds=st.seconds,
                           bytes_streamed=st.bytes_streamed, h2d_gbps=st.h2d_gbps,
                           h2d_ceiling_gbps=h2d / 1e9, wait_s=st.wait_s, copy_s=st.copy_s,
                           copy_window_gbps=st.copy_window_gbps,
                           copy_rate_fraction=st.copy_window_gbps / (h2d / 1e9) if h2d else "",
                           copy_busy_fraction=st.copy_s / st.seconds if st.seconds else "",
                           wait_fraction=st.wait_s / st.seconds if st.seconds else "",
                           pcie_s=st.bytes_streamed / h2d if h2d else "",
                           roofline_s=roof, roofline_tokens_per_s=T / roof if roof else "",
                           roofline_fraction=roof / st.seconds if st.seconds else "",
                           roofline_attn_s=roof_a,
                           roofline_attn_tokens_per_s=T / roof_a if roof_a else "",
                           roofline_attn_fraction=roof_a / st.seconds if st.seconds else "",
                           roofline_full_s=roof_f,
                           roofline_full_tokens_per_s=T / roof_f if roof_f else "",
                           roofline_full_fraction=roof_f / st.seconds if st.seconds else "",
                           gemm_tflops=rates.gemm_tflops(),
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
                      f"{T / roof_a:,.0f} -> {roof_a / st.seconds:.2f}; + dense "
                      f"{T / roof_f:,.0f} -> {roof_f / st.seconds:.2f}); streamed "
                      f"{st.bytes_streamed / 1e9:.1f} GB at {st.h2d_gbps:.1f} GB/s busy, "
                      f"{st.copy_window_gbps:.1f} GB/s over the copy window (pinned "
                      f"{h2d / 1e9:.1f}); compute waited {st.wait_s:.2f} s; hit mean "
                      f"{row['hit_mean']:.3f} min {row['hit_min']:.3f}",
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
    arms = [a for a in ("auto", "legacy", "plane", "resident") if any(r["arm"] == a for r in rows)]
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
                for fig_name, lw, ls in (("roofline_attn_tokens_per_s", 1.2, "--"),
                                         ("roofline_full_tokens_per_s", 1.2, ":"),
                                         ("floor_tokens_per_s", 1.5, ":")):
                    if r.get(fig_name):
                        ax.plot([g + (i - 1) * w - w / 2, g + (i - 1) * w + w / 2],
                                [r[fig_name]] * 2, color="k", lw=lw, ls=ls)
        ax.bar(xs, ys, w, label=arm)
    ax.set_xticks(range(len(groups)), [f"{m}\nT={T}" for m, T in groups], fontsize=8)
    ax.set_ylabel("prefill tokens/s")
    ax.set_title(f"streamed prefill, auto vs legacy (black: roofline; dashed: with attention;"
                 f" dotted: the full compute floor, + dense)\n{title}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
    plot_overlap(rows, png.with_name(png.stem + "-overlap.png"), title)


def expected_wait(rows: list[dict], r: dict) -> float | None:
    """The wait the PCIe bound forces on a streamed read: max(0, bytes / pinned rate - the
    all-resident read's seconds at the same model and prompt); None without a resident row."""
    res = next((x for x in rows if x["arm"] == "resident" and x["model"] == r["model"]
                and x["prompt"] == r["prompt"]), None)
    if res is None or r.get("pcie_s") in (None, ""):
        return None
    return max(0.0, r["pcie_s"] - res["seconds"])


def plot_overlap(rows: list[dict], png: Path, title: str) -> None:
    """Left: the copy engine's rate over its window vs the pinned rate, per streamed run.
    Right: compute's wait on copies vs the wait the PCIe bound forces."""
    import matplotlib.pyplot as plt
    runs_ = sorted((r for r in rows if r["arm"] != "resident" and r.get("copy_window_gbps")),
                   key=lambda r: (r["model"], r["prompt"], r["arm"]))
    if not runs_:
        return
    labels = [f"{r['model']}\nT={r['prompt']} {r['arm']}" for r in runs_]
    xs = range(len(runs_))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(max(8, 1.8 * len(runs_)), 4.2))
    a1.bar([x - 0.2 for x in xs], [r["copy_window_gbps"] for r in runs_], 0.4,
           label="copy engine, over its window in the read")
    a1.bar([x + 0.2 for x in xs], [r.get("h2d_gbps", 0) for r in runs_], 0.4,
           label="copy engine, while busy")
    for x, r in zip(xs, runs_):
        pinned = r.get("h2d_ceiling_gbps") or 0
        a1.plot([x - 0.45, x + 0.45], [pinned] * 2, color="k", lw=1.5)
        a1.plot([x - 0.45, x + 0.45], [0.95 * pinned] * 2, color="k", lw=0.8, ls=":")
    a1.set_ylabel("GB/s (black: pinned rate; dotted: 0.95 of it)")
    a1.set_xticks(list(xs), labels, fontsize=7)
    a1.legend(fontsize=7)
    a2.bar([x - 0.2 for x in xs], [r.get("wait_s", 0) for r in runs_], 0.4,
           label="compute waited on copies", color="tab:red")
    forced = [expected_wait(rows, r) for r in runs_]
    a2.bar([x + 0.2 for x in xs], [f or 0 for f in forced], 0.4, color="tab:gray",
           label="wait the PCIe bound forces (0 where no resident row)")
    a2.set_ylabel("seconds")
    a2.set_xticks(list(xs), labels, fontsize=7)
    a2.legend(fontsize=7)
    fig.suptitle(f"overlap: copy rate and compute wait\n{title}", fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
