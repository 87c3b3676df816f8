"""Layer split over the GPUs of one host: one GPU against two, each against its roofline.

qwen3-30b-a3b with Q8_0 experts (a full-size synthetic pack in pinned host memory, shared by the
participants), --vram 12GiB per GPU, a 32K prompt. With two GPUs each holds half the layers, its
own expert cache, loan and ring, and streams its layers' missing experts over its own PCIe link;
the hidden state moves GPU to GPU once per chunk.

    roofline of a chunk = max(max over GPUs of its bytes streamed / its measured H2D rate,
                              expert FLOPs / measured grouped-GEMM rate)

(the GPUs' copies run in parallel; the layers' compute runs one GPU after the other), from
strata.bench.roofline with one measured H2D rate per GPU's link.

    python experiments/split_ab.py                 # needs 2 GPUs (nvidia-h200-x2)
    python experiments/split_ab.py --smoke         # CPU: two simulated participants, tiny model
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from strata import bench
from strata.bench.roofline import Rates, h2d_rate, roofline
from strata.engine.host import HostExperts
from strata.engine.prefill import EngineConfig, PrefillEngine
from strata.packs.memory import MemoryPack
from strata.packs.synth import ExpertFormats
from strata.shapes import get_preset

ROOT = Path(__file__).resolve().parents[1]
GIB = 1 << 30


def main(argv=None) -> int:
    ap = bench.parser(__doc__, out=ROOT / "experiments" / "results")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--prompts", default="32768")
    args = ap.parse_args(argv)
    tag = "smoke" if args.smoke else bench.gpu_name().replace(" ", "_")
    return bench.main(args, "split_ab", measure, script=__file__, argv=argv,
                      stem=f"split_ab-{tag}", summary=lambda rows: None)


def measure(args, rec: bench.Recorder) -> None:
    cuda = torch.cuda.is_available()
    n_gpu = torch.cuda.device_count() if cuda else 2
    if args.smoke:
        shape, quant, vram, cache = get_preset("demo"), "Q8_0", 1 << 30, None
        prompts = [600]
    else:
        shape, quant, vram, cache = get_preset("qwen3-30b-a3b"), "Q8_0", 12 * GIB, None
        prompts = [int(p) for p in args.prompts.split(",")]
    pack = MemoryPack(shape, ExpertFormats.of(quant))
    t0 = time.perf_counter()
    host = HostExperts(pack.experts, [pl.blob_size for pl in pack.layers], progress=True)
    print(f"{pack} {'pinned' if host.pinned else 'loaded'} in {time.perf_counter() - t0:.1f} s",
          flush=True)
    if args.smoke:
        cache = int(pack.expert_bytes * 0.2)
    rates = Rates(shape)   # the GEMM rates by chunk size, shared by both runs
    for n in (1, 2):
        if cuda and n > n_gpu:
            print(f"{n} GPUs asked, {n_gpu} visible: skipped", flush=True)
            continue
        devices = [f"cuda:{i}" for i in range(n)] if cuda else ["cpu"] * n
        cfg = EngineConfig(vram=[vram] * n, cache=cache, devices=devices, max_prompt=max(prompts),
                           scan_max=1024 if args.smoke else 32768,
                           ffn="auto" if cuda else "torch")
        eng = PrefillEngine(pack, cfg, host=host)
        h2d = {}
        for part in eng.parts:   # each GPU's own link, blob by blob
            h2d[tuple(part.layers)] = h2d_rate(host, device=part.device)
        for T in prompts:
            tok = torch.randint(0, shape.vocab, (T,), generator=torch.Generator().manual_seed(T))
            with torch.inference_mode():
                eng.run(tok, logits="none")             # the first read compiles the tiles
                res = eng.run(tok, logits="none")
            st = res.stats
            roof = roofline(st.chunks, shape, h2d, rates)
            cfg_row = dict(model=f"{shape.n_layer}L-{quant}", gpus=n, prompt=T, chunk=res.chunk,
                           ring=res.ring, rule=res.plan.rule,
                           split=[len(p.layers) for p in eng.parts])
            rec.add("tokens_per_s", st.tokens_per_s, "tok/s", timer=bench.WALL_TIMER,
                    bound="roofline: max(per-GPU H2D, grouped_mm) per chunk",
                    bound_value=T / roof, **cfg_row)
            rec.add("roofline_fraction", roof / st.seconds, "fraction", bound="1.0", **cfg_row)
            rec.add("bytes_streamed", st.bytes_streamed, "bytes", **cfg_row)
            rec.add("wait_s", st.wait_s, "s", **cfg_row)
            for part, pp in zip(eng.parts, res.plan.participants):
                rec.add("participant_cache_bytes", pp.cache, "bytes", participant=part.name,
                        layers=f"{part.layers.start}-{part.layers.stop - 1}", loan=pp.loan,
                        ring_bytes=pp.ring_bytes, tail=pp.tail, **cfg_row)
            rec.flush()
            print(f"{n} GPU(s) T={T}: chunk {res.chunk} ring {res.ring} ({res.plan.rule}) "
                  f"{st.tokens_per_s:,.0f} tok/s; roofline {T / roof:,.0f} tok/s -> "
                  f"{roof / st.seconds:.2f} of it; streamed {st.bytes_streamed / 1e9:.1f} GB; "
                  f"compute waited {st.wait_s:.2f} s; split "
                  f"{[len(p.layers) for p in eng.parts]}", flush=True)
        del eng
        if cuda:
            torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
