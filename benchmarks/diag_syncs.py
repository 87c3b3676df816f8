"""Every CUDA sync inside a streamed chunk, by strata source line (diagnostic, not a test):
test_syncs' GPU configurations with torch.cuda.set_sync_debug_mode("warn") instead of "error",
so one run lists them all.

    PYTHONPATH=. python3 benchmarks/diag_syncs.py                              # stream mode
    STRATA_STREAM_ALL_MIN=1000 PYTHONPATH=. python3 benchmarks/diag_syncs.py   # stage mode
"""
import collections, tempfile, traceback, warnings
from pathlib import Path
import torch
from strata import config
from strata.errors import StrataError
from strata.engine.prefill import EngineConfig, PrefillEngine
from strata.engine.provider import StreamingProvider
from strata.packs import Pack
from strata.packs.synth import ExpertFormats, synth_pack
from strata.shapes import get_preset
small = get_preset("small")
d = Path(tempfile.mkdtemp())
pk = synth_pack(d / "small.pack", small, ExpertFormats.of("Q8_0", down="Q4_0"), progress=False)
blob = Pack.open(pk).max_blob
sites = collections.Counter()
begin, end = StreamingProvider.begin_chunk, StreamingProvider.end_chunk
state = {"on": False}
orig_warn = warnings.showwarning


def show(message, category, filename, lineno, file=None, line=None):
    if state["on"] and "synchroniz" in str(message):
        st = [f for f in traceback.extract_stack()[:-1] if "/strata/" in f.filename]
        where = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in st[-3:][::-1])
        sites[where] += 1


warnings.showwarning = show


def b(self, s, n):
    state["on"] = True
    torch.cuda.set_sync_debug_mode("warn")
    begin(self, s, n)


def e(self):
    end(self)
    torch.cuda.set_sync_debug_mode(0)
    state["on"] = False


StreamingProvider.begin_chunk, StreamingProvider.end_chunk = b, e
mode = "stage" if config.stream_all_min_override() else "stream"
for ffn in ("kernel", "decoded", "auto"):
    for kv in ({}, {"kv": "int8", "kv_resident": 96}):
        sites.clear()
        eng = PrefillEngine(pk, EngineConfig(vram=1 << 30, cache=32 * blob,
                                             ring=6 if mode == "stream" else None, chunk=96,
                                             max_prompt=300, ffn=ffn, **kv))
        tok = torch.randint(0, small.vocab, (300,), generator=torch.Generator().manual_seed(1))
        try:
            eng.warmup(300)
        except StrataError as err:   # e.g. the decoded FFN's buffer in stage mode at this cache
            print(f"syncs ffn={ffn} mode={mode} kv={kv or 'bf16 all'}: {err}", flush=True)
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = show
            res = eng.run(tok, logits="last")
        print(f"syncs ffn={ffn} mode={mode} kv={kv or 'bf16 all'} chunks="
              f"{[c.mode for c in res.stats.chunks]}: {sum(sites.values())}", flush=True)
        for where, n in sites.most_common():
            print(f"    {n:4d}  {where}", flush=True)
