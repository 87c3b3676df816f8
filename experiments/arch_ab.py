"""The architectures A/B (issue 19 item 4): GPT-OSS through the model seam on the GPU.

Two figures, each against the bound it is read against:
1. streamed prefill tokens/s of a full-size synthetic gpt-oss-120b MXFP4 pack (36 layers x 128
   experts x 13.25 MB = 61 GB of expert blobs, biases inside each blob) under --vram 24GiB at 8K
   and 32K tokens (strata.packs.MemoryPack in pinned host memory, PrefillEngine, the fused
   expert GEMM with its bias + clamped-SwiGLU epilogue, chunk_attention with sinks and the
   sliding window), against the PCIe bound of the same run: bytes streamed / the pinned H2D rate
   measured blob by blob here (`pcie_bound_tokens_per_s` as formats_ab reads it), and the
   roofline max(H2D, grouped_mm) per chunk.
2. all-resident prefill tokens/s of gpt-oss-20b MXFP4 (24 x 32 experts, 10 GB: every expert in
   one VRAM arena, strata.models.ResidentProvider), bf16 dense, against the expert GEMM's own
   rate at that chunk (strata.bench.roofline.Rates: grouped_mm on bf16 experts) as the bound.

Budget (H200): MemoryPack builds 8 distinct experts per layer variant and repeats them (seconds);
pinning 61 GB takes ~30-60 s; each read runs twice (the first compiles the tiles). `--layers N`
cuts both models (a PCIe-bound read scales as 1/N on both sides, so the ratio holds).

    python experiments/arch_ab.py                 # GPU: 120b streamed 8K+32K, 20b resident
    python experiments/arch_ab.py --smoke         # CPU: a tiny GPT-OSS shape, ~1 min
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

import strata  # noqa: F401  (selects the interpreter without CUDA)
from strata import bench
from strata.bench.roofline import Rates, expert_flops, h2d_rate, record_streamed
from strata.engine.host import HostExperts
from strata.engine.prefill import EngineConfig, PrefillEngine
from strata.errors import StrataError
from strata.engine.load import load_model
from strata.models.moe import expert_ffn
from strata.models.provider import ResidentProvider
from strata.packs.memory import MemoryPack
from strata.packs.synth import ExpertFormats
from strata.shapes import get_preset

ROOT = Path(__file__).resolve().parents[1]
GIB = 1 << 30
FMT = ExpertFormats.of("MXFP4")


def tiny(name: str):
    """A GPT-OSS shape small enough for the interpreter, with the preset's options."""
    return get_preset(name).with_(n_layer=2, d_model=64, n_expert=8, d_expert=32, n_head=4,
                                  n_kv_head=2, head_dim=16, vocab=256, **{"window.size": 16})


def measure(args, rec: bench.Recorder) -> None:
    if args.smoke:
        args.warmup, args.repeats = 0, 1
        rec.warmup, rec.repeats = 0, 1
    big = tiny("gpt-oss-120b") if args.smoke else get_preset("gpt-oss-120b")
    small = tiny("gpt-oss-20b") if args.smoke else get_preset("gpt-oss-20b")
    if args.layers:
        big, small = big.with_(n_layer=args.layers), small.with_(n_layer=args.layers)
    prompts = [48, 64] if args.smoke else [int(p) for p in args.prompts.split(",")]
    streamed(rec, big, prompts, args)
    resident(rec, small, prompts[0] if args.smoke else args.resident_prompt, args)


def streamed(rec, shape, prompts, args) -> None:
    t0 = time.perf_counter()
    pack = MemoryPack(shape, FMT)
    host = HostExperts(pack.experts, [pl.blob_size for pl in pack.layers], progress=True)
    print(f"[gpt-oss-120b] {pack} built and {'pinned' if host.pinned else 'loaded'} in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    h2d = h2d_rate(host)
    rates = Rates(shape)
    for T in prompts:
        cfg = EngineConfig(vram=2 * GIB if args.smoke else args.vram * GIB, max_prompt=T,
                           cache=64 << 10 if args.smoke else None,
                           scan_max=256 if args.smoke else 32768,
                           chunk=16 if args.smoke else None, ring=2 if args.smoke else None,
                           ffn="kernel" if torch.cuda.is_available() else "torch")
        common = dict(model="gpt-oss-120b", fmt="MXFP4", prompt=T, layers=shape.n_layer,
                      vram_gib=args.vram, expert_bytes=pack.expert_bytes)
        try:
            eng = PrefillEngine(pack, cfg, host=host)
            eng.plan()
        except StrataError as e:   # the plan does not fit this budget: say so, go on
            rec.add("tokens_per_s", 0.0, "tok/s", bound=f"does not fit: {e}", **common)
            continue
        tok = torch.randint(0, shape.vocab, (T,), generator=torch.Generator().manual_seed(T))
        with torch.inference_mode():
            eng.run(tok, logits="none")           # the first read of a shape compiles its tiles
            res = eng.run(tok, logits="none")
        st = res.stats
        pcie_tps = record_streamed(rec, res, T, shape, h2d, rates, **common)
        print(f"[gpt-oss-120b] T={T}: {st.tokens_per_s:,.0f} tok/s, PCIe bound "
              f"{pcie_tps or 0:,.0f} tok/s ({st.bytes_streamed / 1e9:.1f} GB at "
              f"{h2d / 1e9:.1f} GB/s), chunk {res.chunk}, ring {res.ring}", flush=True)
        rec.flush()
        del eng
    del host, pack
    torch.cuda.empty_cache() if torch.cuda.is_available() else None


def resident(rec, shape, T: int, args) -> None:
    dev = rec.device
    pack = MemoryPack(shape, FMT, device=dev)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    ffn = "kernel" if dev.type == "cuda" else "torch"
    model = load_model(pack, device=dev, dtype=dtype, ffn=expert_ffn(ffn))
    prov = ResidentProvider([pack.experts(i) for i in range(shape.n_layer)],
                            [pl.layout for pl in pack.layers], dev)
    chunk = min(T, 16 if args.smoke else args.chunk)
    tok = torch.randint(0, shape.vocab, (T,), generator=torch.Generator().manual_seed(T)).to(dev)

    def run():
        with torch.inference_mode():
            model.prefill(tok, prov, chunk=chunk, logits="none")
    tm = rec.timed(run, check=lambda: None, what=f"gpt-oss-20b resident T={T}")
    # every layer's routed GEMMs at grouped_mm's rate (a GPU figure: the CPU has no rate)
    rate = Rates(shape).gemm(chunk) if rec.on_gpu else float("nan")
    bound_tps = T / (expert_flops(shape, T) / rate) if rate == rate and rate > 0 else ""
    rec.add("resident_tokens_per_s", T / tm.median_s, "tok/s", timer=tm.timer,
            bound="the experts' FLOPs at grouped_mm's bf16 rate (chunk-sized)",
            bound_value=bound_tps, model="gpt-oss-20b", fmt="MXFP4", prompt=T,
            chunk=chunk, layers=shape.n_layer, expert_bytes=prov.nbytes, ffn=ffn)
    print(f"[gpt-oss-20b] resident T={T}: {T / tm.median_s:,.0f} tok/s "
          f"({prov.nbytes / 1e6:,.1f} MB of experts resident)", flush=True)
    rec.flush()


def main(argv=None) -> int:
    ap = bench.parser(__doc__, out=ROOT / "experiments" / "results", warmup=1, repeats=3)
    ap.add_argument("--smoke", action="store_true", help="tiny GPT-OSS shape on the CPU")
    ap.add_argument("--layers", type=int, default=None, help="first N layers of both models")
    ap.add_argument("--prompts", default="8192,32768", help="streamed prompt lengths")
    ap.add_argument("--vram", type=int, default=24, help="streamed run's VRAM budget, GiB")
    ap.add_argument("--resident-prompt", type=int, default=8192, help="resident prompt tokens")
    ap.add_argument("--chunk", type=int, default=8192, help="resident run's chunk")
    args = ap.parse_args(argv)
    tag = "smoke" if args.smoke else bench.gpu_name().replace(" ", "_")
    return bench.main(args, "arch_ab", measure, script=__file__, argv=argv,
                      stem=f"arch_ab-{tag}", summary=summary)


def summary(rows: list[dict]) -> None:
    for r in rows:
        if r["figure"] in ("tokens_per_s", "resident_tokens_per_s"):
            c = r["config"]
            print(f"{r['figure']} {c['model']} T={c['prompt']}: {r['value']:.4g} {r['unit']} "
                  f"(bound {r['bound']}: {r['bound_value']})")


if __name__ == "__main__":
    sys.exit(main())
