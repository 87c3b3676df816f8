"""DeepSeek-V3 streamed: a full-width deepseek-v3-shaped synthetic pack with as many layers as
host memory holds, read at 8K and 32K through the streaming engine, tokens/s against the PCIe
bound of the same run.

The pack (strata.packs.MemoryPack, pinned host memory): DeepSeek-V3's widths exactly (hidden
7168, 256 experts of width 2048 top-8 from 4 of 8 groups, one shared expert, MLA with 128 heads,
q_lora 1536, kv_lora 512 + rope 64), its 3 leading dense layers (FFN 18432), then as many MoE
layers as fit: n_moe = (MemAvailable - the dense weights' host copy - HEADROOM) // (E x blob),
at most DeepSeek-V3's 58. At Q4_K a MoE layer is 256 x 24,772,608 B = 6.34 GB, so a 128 GiB
host holds ~16 of them (the CSV's `layers` / `moe_layers` say what this run held; the full
model's 58 would be 368 GB). Dense weights (bf16, ~0.37 GB of MLA per layer, 0.79 GB per dense
FFN, 1.85 GB each for embeddings and head) stay resident on the GPU beside the expert cache.

Per prompt (`--prompts`, default 8192,32768): one warm read (compiles the tiles), then one timed
read, logits "none". Figures: tokens_per_s (bound: PCIe = bytes streamed / the pinned H2D rate
measured blob by blob in this run), bytes_streamed, h2d_gbps, wait_s, chunk and ring of the
plan. The attention is MLA's expanded form through torch's fused SDPA (strata.models.mla); its
transient K/V (2.7 GB at 32K) is outside the planned carve, inside the reserve's slack.

    python experiments/deepseek_stream.py              # GPU: 8K and 32K, --vram 64GiB, Q4_K
    python experiments/deepseek_stream.py --smoke      # CPU: a tiny deepseek2 shape, seconds
    python experiments/deepseek_stream.py --moe-layers 2 --prompts 65536 --kv-resident all,16384
        # the latent KV beyond 16K tokens a layer in pinned host memory, against all resident

`--kv-resident` arms share the pinned pack; their KV bytes streamed are in the PCIe bound.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from strata import bench
from strata.bench.roofline import h2d_rate
from strata.budget import host_available
from strata.engine.host import HostExperts
from strata.engine.prefill import EngineConfig, PrefillEngine
from strata.errors import StrataError
from strata.packs.memory import MemoryPack
from strata.packs.synth import ExpertFormats
from strata.planning import DENSE_BYTES, layer_dense_bytes
from strata.shapes import DenseFfn, Mla, ModelShape, Router, get_preset

ROOT = Path(__file__).resolve().parents[1]
GIB = 1 << 30
HEADROOM = 12 * GIB          # Python, torch, the CUDA context's host side, the KV of one prompt
SMOKE = ModelShape("deepseek2", 4, 64, 16, 4, 32, 4, 4, 24, 256, rope_theta=10000.0,
                   dense=DenseFfn(1, 96, 1), router=Router("sigmoid", 4, 2, 2.5),
                   mla=Mla(32, 32, 8, 16))


def layers_that_fit(full: ModelShape, fmts: ExpertFormats, avail: int) -> int:
    """MoE layers whose pinned experts fit beside the dense weights' host copy and HEADROOM."""
    blob = fmts.layout(full).size
    per_moe = blob * full.n_expert
    dense = sum(layer_dense_bytes(full, l) for l in range(full.dense.lead + 1)) + \
        2 * full.vocab * full.d_model * DENSE_BYTES
    n = (avail - dense - HEADROOM) // (per_moe + layer_dense_bytes(full, full.n_layer - 1))
    return int(max(0, min(full.n_layer - full.dense.lead, n)))


def measure(args, rec: bench.Recorder) -> None:
    fmts = ExpertFormats.of("Q8_0" if args.smoke else args.quant)   # tiny rows: 32-blocks
    if args.smoke:
        shape, prompts = SMOKE, [40, 64]
    else:
        full = get_preset("deepseek-v3")
        avail = host_available() or 0
        n_moe = args.moe_layers if args.moe_layers is not None else layers_that_fit(full, fmts,
                                                                                    avail)
        if n_moe < 1:
            rec.add("tokens_per_s", 0.0, "tok/s", bound=f"does not fit: {avail / GIB:.0f} GiB of "
                    f"host memory holds no MoE layer of {fmts.layout(full).size * full.n_expert / 1e9:.1f} GB")
            return
        shape = full.with_(n_layer=full.dense.lead + n_moe)
        prompts = [int(p) for p in args.prompts.split(",")]
        print(f"deepseek-v3 x {shape.n_layer} layers ({n_moe} MoE) of host "
              f"{avail / GIB:.0f} GiB available", flush=True)
    t0 = time.perf_counter()
    pack = MemoryPack(shape, fmts, distinct=2 if args.smoke else 8)
    host = HostExperts(pack.experts, [pl.blob_size for pl in pack.layers], progress=True)
    print(f"{pack} built and {'pinned' if host.pinned else 'loaded'} in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    h2d = h2d_rate(host)
    for resident in args.kv_resident:
        cfg = EngineConfig(vram=2 * GIB if args.smoke else args.vram * GIB,
                           max_prompt=max(prompts), cache=160 << 10 if args.smoke else None,
                           scan_max=256 if args.smoke else 32768,
                           chunk=32 if args.smoke else None, ring=8 if args.smoke else None,
                           ffn="auto" if torch.cuda.is_available() else "torch", kv=args.kv,
                           kv_resident=resident)
        try:
            eng = PrefillEngine(pack, cfg, host=host)
            eng.plan()
        except StrataError as e:
            rec.add("tokens_per_s", 0.0, "tok/s", bound=f"does not fit: {e}",
                    layers=shape.n_layer, kv=args.kv, kv_resident=resident)
            continue
        read_prompts(args, rec, eng, pack, shape, prompts, h2d, cfg)
        del eng


def read_prompts(args, rec, eng, pack, shape, prompts, h2d, cfg) -> None:
    """One warm and one timed read of each prompt; a host-held latent window's KV bytes streamed
    beside the experts' (both on the copy lane, so both in the PCIe bound)."""
    for T in prompts:
        tok = torch.randint(0, shape.vocab, (T,), generator=torch.Generator().manual_seed(T))
        with torch.inference_mode():
            eng.run(tok, logits="none")
            res = eng.run(tok, logits="none")
        st = res.stats
        pcie_s = (st.bytes_streamed + res.kv_streamed) / h2d
        common = dict(prompt=T, chunk=res.chunk, ring=res.ring, layers=shape.n_layer,
                      moe_layers=len(shape.moe_layers), quant=args.quant,
                      expert_bytes=pack.expert_bytes, vram_gib=sum(cfg.vram) / GIB, kv=cfg.kv,
                      kv_resident=cfg.kv_resident)
        rec.add("tokens_per_s", st.tokens_per_s, "tok/s", timer=bench.WALL_TIMER,
                bound="PCIe: bytes streamed / pinned H2D measured",
                bound_value=T / pcie_s if pcie_s else None, **common)
        rec.add("bytes_streamed", st.bytes_streamed, "bytes", **common)
        rec.add("kv_bytes_streamed", res.kv_streamed, "bytes", **common)
        rec.add("h2d_gbps", st.h2d_gbps, "GB/s", bound="pinned H2D blob by blob",
                bound_value=h2d / 1e9, **common)
        rec.add("wait_s", st.wait_s, "s", **common)
        print(f"T={T} kv {cfg.kv} resident {cfg.kv_resident or 'all'}: {st.tokens_per_s:,.0f} "
              f"tok/s, PCIe bound {(T / pcie_s if pcie_s else 0):,.0f} tok/s "
              f"({st.bytes_streamed / 1e9:.1f} GB of experts + {res.kv_streamed / 1e9:.2f} GB of "
              f"KV at {h2d / 1e9:.1f} GB/s), chunk {res.chunk}, ring {res.ring}, compute waited "
              f"{st.wait_s:.2f} s", flush=True)
        rec.flush()


def main(argv=None) -> int:
    ap = bench.parser(__doc__, out=ROOT / "experiments" / "results", warmup=0, repeats=1)
    ap.add_argument("--smoke", action="store_true", help="a tiny deepseek2 on the CPU")
    ap.add_argument("--prompts", default="8192,32768", help="prompt lengths (default 8192,32768)")
    ap.add_argument("--quant", default="Q4_K", help="expert block format (default Q4_K)")
    ap.add_argument("--vram", type=int, default=64, help="GiB of VRAM for the engine (default 64)")
    ap.add_argument("--moe-layers", type=int, default=None,
                    help="MoE layers (default: as many as host memory holds)")
    ap.add_argument("--kv", default="bf16", choices=["bf16", "int8"], help="MLA KV dtype")
    ap.add_argument("--kv-resident", default="all", type=_windows, metavar="N[,N...]",
                    help="tokens of latent KV a layer keeps in VRAM, one arm each ('all': every "
                         "token; default all); the rest streams back from pinned host memory")
    args = ap.parse_args(argv)
    tag = "smoke" if args.smoke else bench.gpu_name().replace(" ", "_")
    return bench.main(args, "deepseek_stream", measure, script=__file__, argv=argv,
                      stem=f"deepseek_stream-{tag}", summary=summary)


def _windows(text: str) -> list[int | None]:
    import argparse
    try:
        out = [None if w == "all" else int(w) for w in text.split(",")]
    except ValueError:
        out = [0]
    if any(w is not None and w < 1 for w in out):
        raise argparse.ArgumentTypeError(f"--kv-resident takes 'all' or whole numbers >= 1, "
                                         f"comma-separated; got {text!r}")
    return out


def summary(rows: list[dict]) -> None:
    for r in rows:
        if r["figure"] == "tokens_per_s":
            c = r["config"]
            print(f"T={c.get('prompt')} layers={c.get('layers')} kv_resident="
                  f"{c.get('kv_resident') or 'all'}: {r['value']:.4g} tok/s "
                  f"(bound {r['bound']}: {r['bound_value']})")


if __name__ == "__main__":
    sys.exit(main())
