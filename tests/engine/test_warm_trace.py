"""Warm start (PrefillEngine.warmup) and the lanes' timeline (strata.engine.trace.LaneTrace)."""
import json

import pytest
import torch

from strata.engine.observe import EngineObserver
from strata.engine.trace import LaneTrace
from strata.engine.warm import warm_layers
from strata.engine.prefill import EngineConfig, PrefillEngine
from strata.packs import Pack
from tests.engine.slab_helpers import CHUNK, TOKENS, make_pack, tiny_engine


def streaming_engine(pack, cache_blobs=6):
    """A cache of a few blobs: most experts stream through a 2-slot ring."""
    cfg = EngineConfig(vram=1 << 30, cache=cache_blobs * Pack.open(pack).max_blob, chunk=CHUNK,
                       ring=2, max_prompt=64, device="cpu", ffn="torch")
    return PrefillEngine(pack, cfg)


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    return make_pack(tmp_path_factory.mktemp("warm") / "t.pack")


class Count(EngineObserver):
    def __init__(self):
        self.n = 0

    def on_plan(self, plan, chunk, ring):
        self.n += 1


def test_warmup_reads_the_prompts_chunk_sizes_and_leaves_the_cache_whole(pack):
    eng = tiny_engine(pack, kernel=False)
    before = eng.cache.buffer.clone()
    index = dict(eng.cache.index)
    cold = eng.run(TOKENS, logits="all").logits
    seen = Count()
    eng.observers.append(seen)
    calls = []
    real = eng._run     # the read run() makes; the warm-up passes its own model, parts and KV
    eng._run = lambda tokens, **kw: (calls.append((tokens.numel(), kw["plan"].chunk)),
                                     real(tokens, **kw))[1]
    assert eng.warmup(TOKENS.numel()) > 0
    eng._run = real
    # 12 tokens in chunks of 8: the dry prompt is one full chunk and the partial 4 behind it
    assert calls == [(CHUNK + TOKENS.numel() % CHUNK, CHUNK)]
    assert eng.warmup_lengths(TOKENS.numel()) == (CHUNK, [CHUNK, TOKENS.numel() % CHUNK])
    assert seen.n == 0, "observers must not see the warm-up"
    assert eng.warmup(TOKENS.numel()) == 0.0, "already warm for this plan"
    assert torch.equal(eng.cache.buffer, before) and eng.cache.index == index
    assert torch.equal(eng.run(TOKENS, logits="all").logits, cold)


def test_trace_has_both_lanes_of_every_pass(pack, tmp_path):
    eng = streaming_engine(pack)
    tr = LaneTrace("tiny")
    eng.observers.append(tr)
    res = eng.run(TOKENS, logits="last")
    n_chunks = -(-TOKENS.numel() // CHUNK)
    lanes = {}
    for s in tr.spans:
        lanes.setdefault(s.lane, []).append(s)
    assert len(lanes["chunk"]) == n_chunks
    assert len(lanes["compute"]) == n_chunks * eng.shape.n_layer
    # one span per copy issued (a run of adjacent blobs is one), every blob in one of them
    assert len(lanes["copy"]) == sum(c.copy_ops for c in res.stats.chunks) > 0
    assert sum(s.args["blobs"] for s in lanes["copy"]) == sum(c.copies for c in res.stats.chunks)
    assert sum(s.args["bytes"] for s in lanes["copy"]) == res.stats.bytes_streamed
    assert lanes["passes"] and all(s.dur >= 0 for s in tr.spans)
    for s in lanes["passes"]:   # a pass lies inside its layer's compute span
        layer = next(l for l in lanes["compute"] if l.layer == s.layer and l.chunk == s.chunk)
        assert layer.start <= s.start and s.start + s.dur <= layer.start + layer.dur + 1e-6
    doc = json.loads(tr.write(tmp_path / "t.json").read_text())
    x = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(x) == len(tr.spans) - n_chunks and doc["metadata"]["clock"] == "perf_counter"
    png = tr.plot_chunk(tmp_path / "t.png")
    if png is not None:
        assert png.read_bytes()[:4] == b"\x89PNG"
    eng.run(TOKENS, logits="last")   # a second prompt adds its own spans after the first
    assert tr.prompts == 2 and max(s.args["prompt"] for s in tr.spans) == 1
    # the timed read of each prompt holds its lanes' events: what lies outside them is head
    # (before the first copy or compute) and tail (after the last), both >= 0, adding up
    reads = [s for s in tr.spans if s.lane == "read"]
    assert [s.args["prompt"] for s in reads] == [0, 1]
    summary = tr.read_summary()
    assert [r["prompt"] for r in summary] == [0, 1]
    for r in summary:
        assert r["head_s"] >= 0 and r["tail_s"] >= 0 and r["lanes_s"] > 0
        assert abs(r["head_s"] + r["lanes_s"] + r["tail_s"] - r["read_s"]) < 1e-9
        assert 0 < r["copy_busy_s"] <= r["read_s"]
    assert summary[0]["read_s"] <= res.stats.seconds   # inside the engine's own timer


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (runs on the GPU machine)")
def test_trace_on_cuda_uses_event_times_and_warmup_changes_nothing(pack, tmp_path):
    cfg = EngineConfig(vram=1 << 30, cache=6 * Pack.open(pack).max_blob, chunk=CHUNK, ring=2,
                       max_prompt=64, device="cuda", ffn="torch")   # deterministic: exact equality
    eng = PrefillEngine(pack, cfg)
    before = eng.cache.buffer.clone()
    cold = eng.run(TOKENS, logits="all").logits
    assert eng.warmup(TOKENS.numel()) > 0
    assert torch.equal(eng.cache.buffer, before)
    tr = LaneTrace("cuda")
    eng.observers.append(tr)
    warm = eng.run(TOKENS, logits="all").logits
    assert torch.equal(cold, warm)
    assert tr.clock == "cuda-events"
    copies = [s for s in tr.spans if s.lane == "copy"]
    assert copies and all(s.dur > 0 for s in copies)
    starts = [s.start for s in tr.spans if s.lane == "compute"]
    assert starts == sorted(starts), "layers run one after another on the compute lane"
    (r,) = tr.read_summary()       # on the device too, the read holds its lanes
    assert r["head_s"] >= 0 and r["tail_s"] >= 0 and 0 < r["lanes_s"] <= r["read_s"]
    assert json.loads(tr.write(tmp_path / "c.json").read_text())["metadata"]["clock"] == "cuda-events"


def test_warm_layers_takes_the_first_two_of_each_layout_per_participant():
    lay = ["q8", "q8", "q8", "q4", "q8", "q4", "q4", "q4"]
    assert warm_layers([range(8)], lay) == [0, 1, 3, 5]
    # two participants: each warms its own layers (its own cache and ring)
    assert warm_layers([range(0, 4), range(4, 8)], lay) == [0, 1, 3, 4, 5, 6]
    assert warm_layers([range(3)], lay, per=1) == [0]


ONE = TOKENS[:CHUNK]   # one chunk: the warm layers' tests read as little as they can


@pytest.fixture(scope="module")
def pack4(tmp_path_factory):
    """The tiny shape with 4 layers: two the warm-up reads, two it skips."""
    from strata.packs.synth import ExpertFormats, synth_pack
    from tests.engine.slab_helpers import SHAPE
    return synth_pack(tmp_path_factory.mktemp("warm4") / "t4.pack", SHAPE.with_(n_layer=4),
                      ExpertFormats("BF16", "BF16", "BF16"), progress=False)


def test_a_hybrid_warms_its_full_attention_layers_too(tmp_path):
    """Qwen3.5's layers share one blob layout, but its linear and full layers launch different
    kernels: the warm-up reads the first two of each kind (a layout alone chose two linear
    layers, and the first full layer compiled inside the timed read: 1.2-1.6 s on the H100)."""
    from strata.packs.synth import ExpertFormats, synth_pack
    from strata.shapes import get_preset
    shape = get_preset("tiny-qwen35moe")
    pack = synth_pack(tmp_path / "h.pack", shape, ExpertFormats.of("Q8_0"), progress=False)
    eng = streaming_engine(pack)
    kinds = eng.warm_kinds()
    full = [l for l in range(shape.n_layer) if shape.layer_kind(l) == "full"]
    linear = [l for l in range(shape.n_layer) if shape.layer_kind(l) == "linear"]
    assert full and linear and len({k[0] for k in kinds}) == 1
    assert warm_layers([range(shape.n_layer)], kinds) == sorted(full[:2] + linear[:2])
    eng.warmup(ONE.numel())
    assert eng.timings["warmup_layers"] == len(full[:2] + linear[:2])


def test_warmup_reads_only_the_warm_layers_through_the_same_run(pack4):
    eng = streaming_engine(pack4)   # most experts stream: the warm layers' copies are visible
    n_layer = eng.shape.n_layer
    before, index = eng.cache.buffer.clone(), dict(eng.cache.index)
    cold = eng.run(ONE, logits="last")
    seen = []
    real = eng._run     # the read run() makes, here of the warm-up's own model and parts

    def spy(tokens, **kw):
        res = real(tokens, **kw)
        rd = kw["rd"]
        seen.append((type(rd.model).__name__, [list(p.layers) for p in rd.parts], res))
        return res
    eng._run = spy
    eng.warmup(ONE.numel())
    eng._run = real
    (kind, layers, res), = seen
    assert kind == "LayerSubset" and layers == [[0, 1]]
    # STREAM mode queues every uncached expert of each read layer: two layers' worth, not all
    assert 0 < res.stats.bytes_streamed < cold.stats.bytes_streamed
    assert type(eng.model).__name__ != "LayerSubset" and list(eng.parts[0].layers) == list(
        range(n_layer)), "the warm-up leaves the engine's model and parts as they are"
    assert torch.equal(eng.cache.buffer, before) and eng.cache.index == index
    assert torch.equal(eng.run(ONE, logits="last").logits, cold.logits)
    assert eng.timings["warmup_layers"] == 2


def test_a_warmup_whose_kv_spills_to_the_host_reads_only_the_warm_layers(pack4):
    """PromptKV views every layer's stage: the warm-up hands the skipped layers their
    participant's buffer, so a spilling dry prompt reads two layers, not all four."""
    cfg = EngineConfig(vram=1 << 30, cache=6 * Pack.open(pack4).max_blob, chunk=CHUNK, ring=2,
                       max_prompt=64, device="cpu", ffn="torch", kv="int8", kv_resident=4)
    eng = PrefillEngine(pack4, cfg)
    before = eng.cache.buffer.clone()
    cold = eng.run(TOKENS, logits="last").logits
    assert eng.warmup(TOKENS.numel()) > 0 and eng.timings["warmup_layers"] == 2
    assert torch.equal(eng.cache.buffer, before)
    assert torch.equal(eng.run(TOKENS, logits="last").logits, cold)
