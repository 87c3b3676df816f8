"""A/B of two strata trees on the 8K streamed read (diagnostic), run from each tree's root:

    (cd OLD_TREE && PYTHONPATH=. python3 ../benchmarks/ab_stream8k.py old)
    PYTHONPATH=. python3 benchmarks/ab_stream8k.py new
"""
import sys, time, torch
from strata.engine.host import HostExperts
from strata.engine.prefill import EngineConfig, PrefillEngine
from strata.packs.memory import MemoryPack
from strata.packs.synth import ExpertFormats
from strata.shapes import get_preset
tag = sys.argv[1]
T = int(sys.argv[2]) if len(sys.argv) > 2 else 8192
shape = get_preset("qwen3-30b-a3b")
t0 = time.perf_counter()
pack = MemoryPack(shape, ExpertFormats.of("Q8_0"))
host = HostExperts(pack.experts, [pl.blob_size for pl in pack.layers])
print(f"ab {tag}: pinned in {time.perf_counter() - t0:.1f} s", flush=True)
tok = torch.randint(0, shape.vocab, (T,), generator=torch.Generator().manual_seed(T))
for ffn, vram in (("auto", 12), ("kernel", 12), ("auto", 80)):
    cfg = EngineConfig(vram=vram << 30, max_prompt=T, scan_max=32768, ffn=ffn)
    eng = PrefillEngine(pack, cfg, host=host)
    with torch.inference_mode():
        eng.run(tok, logits="none")
        rs = [eng.run(tok, logits="none") for _ in range(2)]
    st = rs[-1].stats
    print(f"ab {tag} T={T} ffn={ffn} vram={vram}GiB: {[round(r.stats.tokens_per_s) for r in rs]} tok/s, "
          f"chunk {rs[-1].chunk} ring {rs[-1].ring}, {st.bytes_streamed / 1e9:.1f} GB at "
          f"{st.h2d_gbps:.1f} GB/s, wait {st.wait_s:.3f} s, {st.seconds:.3f} s", flush=True)
    del eng
    torch.cuda.empty_cache()
