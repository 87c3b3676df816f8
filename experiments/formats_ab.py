"""The formats A/B: Q4_K_M and IQ4_XS beside Q8_0 on the full-size qwen3-30b-a3b shape, one run.

Three figures per format, each against the bound it is read against:
1. expert GEMM TFLOP/s (strata.bench.expert_gemm, experiments/kernel_bench's arms: the in-kernel
   decode `strata-kernel` and decode-once `strata-decoded`) against torch._grouped_mm on the same
   experts decoded to bf16, at T tokens, uniform routing; every timed arm first passes the
   kernel tests' error bound against moe_ffn_torch (the gate).
2. decode GB/s: dequant_experts (the decode-once path) of every expert of one layer, bytes read
   (blocks) + written (bf16) per second, against a device copy of the same volume measured here
   (benchmarks/dequant_bench's reading).
3. streamed prefill tokens/s at each --prompts length (default 32K) under --vram 12GiB (experiments/prefill_ab's machinery:
   strata.packs.MemoryPack in pinned host memory, PrefillEngine, the roofline of the same run)
   against the PCIe bound of the pack's own bytes: bytes streamed / the pinned H2D rate measured
   blob by blob in this run (`pcie_bound_tokens_per_s`), and the roofline max(H2D, grouped_mm)
   per chunk.
The blob formats: Q8_0 everywhere; Q4_K_M and IQ4_XS as llama.cpp lays the experts out for 48
layers (strata.packs.mixes: Q4_K_M gate/up Q4_K, down Q6_K on use_more_bits layers; IQ4_XS down
Q5_K on the first eighth without an imatrix); the GEMM and decode figures take each distinct
expert-matrix format of the mixes (Q8_0, Q4_K, Q6_K, IQ4_XS, Q5_K).

Target: a Q4_K_M pack reads >= 1.5x faster than Q8_0 where PCIe bounds it (`speedup_vs_Q8_0`,
bound 1.5; its bytes are 0.53x-0.61x of Q8_0's per layer, so a PCIe-bound read is 1.6-1.9x).

Budget (H200): MemoryPack builds a layer's random blocks for 8 distinct experts and repeats them
(seconds, no 32 GB file is synthesized: writing one takes minutes, packs/synth's doc), pinning
32 GB of Q8_0 takes ~10-20 s, each 32K read ~2-5 s and is run twice (the first compiles the
tiles); all 48 layers fit in ~5 min. `--layers N` cuts the model (tokens/s and the bound both
scale as 1/N for a PCIe-bound read, so the ratio holds).

    python experiments/formats_ab.py                 # GPU: the three formats, 32K, 12 GiB
    python experiments/formats_ab.py --prompts 2048,4096,8192 --no-gemm   # where PCIe bounds Q8_0
    python experiments/formats_ab.py --smoke         # CPU: the tiny shape (legacy fallbacks), ~1 min
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

import strata  # noqa: F401  (selects the interpreter without CUDA)
from strata import bench
from strata.bench.expert_gemm import (DECODED_REL, dense_weights, grouped_mm_ffn, make_experts,
                                      rel_err)
from strata.bench.roofline import Rates, expert_flops, h2d_rate, record_streamed
from strata.engine.host import HostExperts
from strata.engine.prefill import EngineConfig, PrefillEngine
from strata.errors import StrataError
from strata.kernels import moe_ffn, moe_ffn_torch, topk_route
from strata.kernels.moe.decoded import moe_ffn_decoded
from strata.kernels.moe.expert_dequant import dequant_experts
from strata.packs.memory import MemoryPack
from strata.packs.synth import ExpertFormats, Mix
from strata.shapes import get_preset

ROOT = Path(__file__).resolve().parents[1]
GIB = 1 << 30
PACKS = ("Q8_0", "Q4_K_M", "IQ4_XS")
TARGET = 1.5


def pack_formats(name: str, shape, full_layers: int) -> list[ExpertFormats]:
    """Per-layer expert formats of pack `name`: the mix's rules for the full model, first layers."""
    if name == "Q8_0":
        return [ExpertFormats()] * shape.n_layer
    return list(Mix.stock(name, shape.with_(n_layer=full_layers)).experts[:shape.n_layer])


def measure(args, rec: bench.Recorder) -> None:
    dev = rec.device
    if args.smoke:   # the interpreter runs every kernel call: one timed call, the tiny shape
        args.warmup, args.repeats = 0, 1
        rec.warmup, rec.repeats = 0, 1
    full = get_preset("tiny" if args.smoke else "qwen3-30b-a3b")
    shape = full.with_(n_layer=args.layers) if args.layers else full
    T_gemm = 8 if args.smoke else args.gemm_tokens
    prompts = [64] if args.smoke else [int(p) for p in str(args.prompts).split(",")]
    fmts_by_pack = {p: pack_formats(p, shape, full.n_layer) for p in PACKS}
    matrix_fmts = sorted({getattr(f, w) for fs in fmts_by_pack.values() for f in fs
                          for w in ("gate", "up", "down")})
    if not args.no_gemm:
        gemm_and_decode(rec, dev, full, matrix_fmts, T_gemm, smoke=args.smoke)
    streamed(rec, shape, fmts_by_pack, prompts, smoke=args.smoke)


def gemm_and_decode(rec, dev, shape, fmts, T: int, smoke: bool) -> None:
    # the copy the decode rates are read against (dequant_bench's: read + write volume)
    nbytes = shape.n_expert * shape.d_expert * shape.d_model * 2
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    t = rec.timed(lambda: dst.copy_(src), check=lambda: None, what="copy")
    copy_rate = 2 * nbytes / t.median_s
    rec.add("copy_rate", copy_rate / 1e9, "GB/s", bound="device copy, measured here",
            timer=t.timer, bytes=2 * nbytes)
    del src, dst
    gen = torch.Generator().manual_seed(T)
    x = torch.randn(T, shape.d_model, generator=gen).to(torch.bfloat16).to(dev)
    ids, w = topk_route(torch.randn(T, shape.n_expert, generator=gen).to(dev), shape.top_k)
    counts = torch.bincount(ids.reshape(-1), minlength=shape.n_expert)
    every = torch.ones(shape.n_expert, dtype=torch.int64, device=dev)
    flops = expert_flops(shape, T, layers=1)
    for fmt in fmts:
        # one format for gate, up and down: the matrix format's own figures
        experts = make_experts(shape, fmt, dev, distinct=2 if smoke else 8)
        wg, wu, wd = dense_weights(experts)
        ref = moe_ffn_torch(x, ids, w, experts)
        arms = {"strata-kernel": lambda: moe_ffn(x, ids, w, experts),
                "strata-decoded": lambda: moe_ffn_decoded(x, ids, w, experts),
                "grouped_mm-bf16": lambda: grouped_mm_ffn(x, ids, w, wg, wu, wd)}
        errs = {a: rel_err(fn(), ref) for a, fn in arms.items()}
        gate = f"normalized error vs moe_ffn_torch < {DECODED_REL:g}"
        timed = {a: rec.timed(fn, what=f"{fmt}/{a}", check=lambda a=a: None if errs[a] <
                              DECODED_REL else f"normalized error {errs[a]:.3e}")
                 for a, fn in arms.items()}
        ceiling = flops / timed["grouped_mm-bf16"].median_s / 1e12
        for a, tm in timed.items():
            rec.add("tflops", flops / tm.median_s / 1e12, "TFLOP/s",
                    bound=f"grouped_mm-bf16 {ceiling:.3f} TFLOP/s", bound_value=ceiling,
                    gate=gate, timer=tm.timer, arm=a, format=fmt, T=T)
        out = torch.empty(shape.n_expert, shape.d_expert, shape.d_model, dtype=torch.bfloat16,
                          device=dev)
        tm = rec.timed(lambda: dequant_experts(experts, "gate", every, out=out),
                       check=lambda: None, what=f"{fmt}/decode")
        moved = experts.layout.gate.nbytes * shape.n_expert + out.numel() * 2
        rec.add("decode_gbps", moved / tm.median_s / 1e9, "GB/s", bound="device copy, measured "
                "here", bound_value=copy_rate / 1e9, timer=tm.timer, format=fmt,
                bytes=moved)
        print(f"{fmt}: " + "  ".join(f"{a} {flops / t_.median_s / 1e12:.1f}" for a, t_ in
                                      timed.items()) + f" TFLOP/s; decode "
              f"{moved / tm.median_s / 1e9:.0f} GB/s of copy {copy_rate / 1e9:.0f}",
              file=sys.stderr, flush=True)
        del experts, wg, wu, wd, out
        rec.flush()


def streamed(rec, shape, fmts_by_pack, prompts: list[int], smoke: bool) -> None:
    """Each pack built and pinned once, then read at every prompt length (an engine each)."""
    tps: dict = {T: {} for T in prompts}
    for name, fmts in fmts_by_pack.items():
        t0 = time.perf_counter()
        pack = MemoryPack(shape, fmts)
        host = HostExperts(pack.experts, [pl.blob_size for pl in pack.layers], progress=True)
        print(f"[{name}] {pack} built and {'pinned' if host.pinned else 'loaded'} in "
              f"{time.perf_counter() - t0:.1f} s", flush=True)
        h2d = h2d_rate(host)
        rates = Rates(shape)
        for T in prompts:
            _read(rec, shape, pack, host, name, T, h2d, rates, smoke, tps[T])
        del host, pack
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    for T in prompts:
        _speedups(rec, tps[T], T)


def _read(rec, shape, pack, host, name, T, h2d, rates, smoke, tps) -> None:
    cfg = EngineConfig(vram=2 * GIB if smoke else 12 * GIB, max_prompt=T,
                       cache=64 << 10 if smoke else None,
                       scan_max=256 if smoke else 32768,
                       # smoke: the ring borrows most of the cache, so most experts stream
                       chunk=16 if smoke else None, ring=2 if smoke else None,
                       ffn="auto" if torch.cuda.is_available() else "torch")
    try:
        eng = PrefillEngine(pack, cfg, host=host)
        eng.plan()
    except StrataError as e:   # the plan does not fit this budget: say so, go on
        rec.add("tokens_per_s", 0.0, "tok/s", bound=f"does not fit: {e}", pack=name, prompt=T)
        return
    tok = torch.randint(0, shape.vocab, (T,), generator=torch.Generator().manual_seed(T))
    with torch.inference_mode():
        eng.run(tok, logits="none")           # the first read of a shape compiles its tiles
        res = eng.run(tok, logits="none")
    st = res.stats
    pcie_tps = record_streamed(rec, res, T, shape, h2d, rates, pack=name, prompt=T,
                               layers=shape.n_layer, expert_bytes=pack.expert_bytes)
    pcie_s = T / pcie_tps if pcie_tps else 0.0
    tps[name] = (st.tokens_per_s, pcie_s / st.seconds if st.seconds else 0.0)
    print(f"[{name}] T={T}: {st.tokens_per_s:,.0f} tok/s, PCIe bound "
          f"{pcie_tps or 0:,.0f} tok/s ({st.bytes_streamed / 1e9:.1f} GB at "
          f"{h2d / 1e9:.1f} GB/s; {pcie_s / st.seconds:.2f} of the time), compute waited "
          f"{st.wait_s:.2f} s", flush=True)
    rec.flush()
    del eng
    torch.cuda.empty_cache() if torch.cuda.is_available() else None


def _speedups(rec, tps: dict, T: int) -> None:
    if "Q8_0" in tps and tps["Q8_0"][0] > 0:
        for name, (v, pcie_frac) in tps.items():
            if name != "Q8_0":
                rec.add("speedup_vs_Q8_0", v / tps["Q8_0"][0], "ratio",
                        bound=f"target >= {TARGET} where PCIe bounds the read", bound_value=TARGET,
                        pack=name, prompt=T, pcie_fraction=round(pcie_frac, 3),
                        pcie_fraction_q8=round(tps["Q8_0"][1], 3))


def main(argv=None) -> int:
    ap = bench.parser(__doc__, out=ROOT / "experiments" / "results", warmup=2, repeats=10)
    ap.add_argument("--smoke", action="store_true", help="demo shape on the CPU (checks the script)")
    ap.add_argument("--layers", type=int, default=None, help="first N layers (default all 48)")
    ap.add_argument("--prompts", default="32768",
                    help="prompt lengths, comma-separated (default 32768): each pack is read at "
                         "each, e.g. 2048,4096,8192 where PCIe bounds Q8_0")
    ap.add_argument("--no-gemm", action="store_true",
                    help="only the streamed reads (skip the GEMM and decode figures)")
    ap.add_argument("--gemm-tokens", type=int, default=8192, help="T of the GEMM figures")
    args = ap.parse_args(argv)
    tag = "smoke" if args.smoke else bench.gpu_name().replace(" ", "_")
    return bench.main(args, "formats_ab", measure, script=__file__, argv=argv,
                      stem=f"formats_ab-{tag}", summary=summary)


def summary(rows: list[dict]) -> None:
    for r in rows:
        if r["figure"] in ("tokens_per_s", "speedup_vs_Q8_0", "tflops", "decode_gbps"):
            c = r["config"]
            what = " ".join(f"{k}={c[k]}" for k in ("pack", "format", "arm") if k in c)
            print(f"{r['figure']} {what}: {r['value']:.4g} {r['unit']} (bound {r['bound']}: "
                  f"{r['bound_value']})")


if __name__ == "__main__":
    sys.exit(main())
