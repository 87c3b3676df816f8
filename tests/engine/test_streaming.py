"""The streaming prefill engine reads a prompt exactly as the all-resident forward does.

Cases and why each exists:
- chunk 16 over 37 tokens: chunks split the prompt unevenly (the last one is short);
- ring 3 < E = 8: a layer's experts do not fit the ring, so a layer runs in several batches and
  copies wait for the compute that frees their slots;
- ring 1: every expert waits for the one before it (the tightest pipeline);
- STAGE: chunks below stream_all_min stage only their routed experts;
- two participants: the layers split over two caches, each with its own loan and ring.
Every run also checks the cache's bytes are identical before and after the prompt.
"""
import json

import pytest
import torch

from strata.engine.prefill import EngineConfig, PrefillEngine
from strata.errors import AllocationError, StrataError
from strata.engine.load import load_model, resident_provider
from strata.models.moe import expert_ffn
from strata.packs.synth import ExpertFormats, synth_pack
from strata.shapes import get_preset

FP32_REL = 1e-5   # streamed vs resident, fp32 dense math: only the order of fp32 sums differs

SHAPE = get_preset("tiny")     # L=2, D=64, E=8, K=2, F=32


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    # mixed formats per layer: the ring slot (max_blob) is bigger than layer 0's blob
    fmts = [ExpertFormats.of("Q8_0"), ExpertFormats.of("Q4_0", down="Q8_0")]
    return synth_pack(tmp_path_factory.mktemp("p") / "tiny.pack", SHAPE, fmts, progress=False)


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, SHAPE.vocab, (37,), generator=torch.Generator().manual_seed(7))


@pytest.fixture(scope="module")
def reference(pack, tokens):
    model = load_model(pack, dtype=torch.float32, ffn=expert_ffn("ref"))
    return model.prefill(tokens, resident_provider(pack), chunk=None)


def blob_bytes(pack, n):
    from strata.packs import Pack
    return n * Pack.open(pack).max_blob


def engine(pack, *, cache_blobs=16, vram=1 << 30, **kw):
    kw.setdefault("chunk", 16)
    kw.setdefault("ffn", "ref")
    cfg = EngineConfig(vram=vram, cache=blob_bytes(pack, cache_blobs), max_prompt=64,
                       device="cpu", **kw)
    return PrefillEngine(pack, cfg)


def rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


def snapshot(eng):
    return [p.cache.buffer.clone() for p in eng.parts]


def assert_restored(eng, snap):
    for p, s in zip(eng.parts, snap):
        assert torch.equal(p.cache.buffer, s), f"{p.name}'s cache bytes changed"


@pytest.mark.parametrize("ring,chunk", [(3, 16), (1, 16), (4, 30), (8, 10)],
                         ids=["R3-C16", "R1-C16", "R4-C30", "R8-C10"])
def test_streamed_equals_resident(pack, tokens, reference, ring, chunk):
    eng = engine(pack, ring=ring, chunk=chunk)
    snap = snapshot(eng)
    res = eng.run(tokens)
    assert rel(res.logits, reference) < FP32_REL
    assert res.ring == ring and res.chunk == chunk
    assert res.stats.bytes_streamed > 0
    assert_restored(eng, snap)


def test_env_ring_is_the_ring_flag(pack, tokens, reference, monkeypatch):
    monkeypatch.setenv("STRATA_PREFILL_RING", "2")
    eng = engine(pack)
    res = eng.run(tokens)
    assert res.ring == 2 and rel(res.logits, reference) < FP32_REL


def test_ring_flag_wins_over_env(pack, tokens, monkeypatch):
    """--ring N is passed to the planner explicitly; it wins over STRATA_PREFILL_RING and leaves
    the environment untouched."""
    monkeypatch.setenv("STRATA_PREFILL_RING", "5")
    res = engine(pack, ring=2).run(tokens)
    assert res.ring == 2 and res.plan.ring == 2
    import os
    assert os.environ["STRATA_PREFILL_RING"] == "5"


def test_stage_mode(pack, tokens, reference, monkeypatch):
    monkeypatch.setenv("STRATA_STREAM_ALL_MIN", "1000")   # every chunk is "small": STAGE
    eng = engine(pack, chunk=8)
    snap = snapshot(eng)
    res = eng.run(tokens)
    assert res.ring == "STAGE"
    assert {c.mode for c in res.stats.chunks} == {"stage"}
    assert rel(res.logits, reference) < FP32_REL
    # STAGE copies only routed experts the cache lacks: never more than stream-all would
    full = engine(pack, ring=8, chunk=8).run(tokens).stats.bytes_streamed
    assert res.stats.bytes_streamed <= full
    assert_restored(eng, snap)


def test_two_participants(pack, tokens, reference):
    eng = engine(pack, cache_blobs=8, vram=[1 << 30, 1 << 30], ring=2, chunk=8)
    assert [list(p.layers) for p in eng.parts] == [[0], [1]]
    snap = snapshot(eng)
    res = eng.run(tokens)
    assert rel(res.logits, reference) < FP32_REL
    assert len(res.plan.participants) == 2
    assert_restored(eng, snap)


def test_a_chunk_under_stream_all_min_stages_its_routed_experts(pack, tokens):
    """33 tokens in chunks of 16: the last chunk's one token routes K experts a layer, fewer
    than stream_all_min (E / K = 4) tokens, so it stages them where the plan's stream mode
    would copy every expert the cache lacks (a decode step after a long prompt is such a
    chunk); the logits are still the resident read's."""
    eng = engine(pack, ring=3)
    snap = snapshot(eng)
    res = eng.run(tokens[:33])
    st = res.stats
    assert [c.mode for c in st.chunks] == ["stream", "stream", "stage"]
    assert st.chunks[2].copies <= SHAPE.top_k * SHAPE.n_layer < st.chunks[0].copies
    model = load_model(pack, dtype=torch.float32, ffn=expert_ffn("ref"))
    assert rel(res.logits, model.prefill(tokens[:33], resident_provider(pack))) < FP32_REL
    assert_restored(eng, snap)


def test_explicit_layer_split_is_checked(pack):
    with pytest.raises(StrataError, match="add up to the model's 2 layers"):
        engine(pack, vram=[1 << 30, 1 << 30], layer_split=[2, 1])


def test_stats_add_up(pack, tokens):
    eng = engine(pack, ring=3)
    res = eng.run(tokens)
    st = res.stats
    assert st.tokens == 37 and len(st.chunks) == 3            # 16 + 16 + 5
    assert st.routed >= st.cache_hits > 0
    for c in st.chunks:
        assert len(c.hit_fraction) == SHAPE.n_layer
        assert all(0 < f <= 1 for f in c.hit_fraction)
    # stream-all: every chunk copies the same experts (all that the loan left the cache without)
    assert len({(c.copies, c.bytes_streamed) for c in st.chunks}) == 1
    assert st.bytes_streamed == sum(c.bytes_streamed for c in st.chunks)
    # every slot the loan evicted is an expert the cache lacks during the prompt: streamed once
    # per chunk (a spare region above the slots is lent first and evicts nothing)
    assert st.chunks[0].copies == res.plan.participants[0].loan_slots > 0


def test_failure_mid_prompt_leaves_cache_whole(pack, tokens, reference):
    eng = engine(pack, ring=3)
    snap = snapshot(eng)
    with pytest.raises(AllocationError, match="the request failed and the cache was refilled"):
        eng.run(tokens, fail_after_layers=3)
    assert_restored(eng, snap)
    res = eng.run(tokens)                       # the engine stays usable
    assert rel(res.logits, reference) < FP32_REL
    assert_restored(eng, snap)


def test_device_oom_mid_prompt_is_a_clear_error(pack, tokens, reference, monkeypatch):
    eng = engine(pack, ring=3)
    snap = snapshot(eng)
    calls = {"n": 0}
    real = eng.model.ffn

    def flaky(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 4:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")
        return real(*a, **kw)
    monkeypatch.setattr(eng.model, "ffn", flaky)
    with pytest.raises(AllocationError, match="allocation failed mid-prompt"):
        eng.run(tokens)
    assert_restored(eng, snap)
    monkeypatch.setattr(eng.model, "ffn", real)
    assert rel(eng.run(tokens).logits, reference) < FP32_REL


def test_bad_prompt_leaves_cache_whole(pack):
    eng = engine(pack, ring=3)
    snap = snapshot(eng)
    with pytest.raises(StrataError, match="outside the vocabulary"):
        eng.run(torch.tensor([1, 2, SHAPE.vocab + 5]))
    with pytest.raises(StrataError, match="reserved KV for 64"):
        eng.run(torch.zeros(65, dtype=torch.int64))
    assert_restored(eng, snap)


def test_cli_json(pack, capsys):
    from strata.cli import main
    rc = main(["prefill", str(pack), "--prompt-tokens", "37", "--cache",
               str(blob_bytes(pack, 16)), "--chunk", "16", "--ring", "3", "--device", "cpu",
               "--experts", "ref", "--json"])
    assert rc == 0
    r = json.loads(capsys.readouterr().out)
    assert r["prefill_chunk"] == 16 and r["prefill_ring"] == 3
    assert r["bytes_streamed"] > 0 and r["plan"]["rule"] == "forced"
    for key in ("tokens_per_s", "h2d_gbps", "cache_hits", "wait_s", "hit_fraction_mean"):
        assert key in r


def test_cli_stage_reads_STAGE(pack, capsys, monkeypatch):
    from strata.cli import main
    monkeypatch.setenv("STRATA_STREAM_ALL_MIN", "1000")
    rc = main(["prefill", str(pack), "--prompt-tokens", "20", "--cache",
               str(blob_bytes(pack, 16)), "--chunk", "8", "--device", "cpu", "--experts", "ref",
               "--json"])
    assert rc == 0 and json.loads(capsys.readouterr().out)["prefill_ring"] == "STAGE"


def test_cli_dump_logits(pack, tmp_path, reference, capsys):
    import numpy as np
    from strata.cli import main
    out = tmp_path / "logits.npy"
    g = torch.Generator().manual_seed(0)
    toks = torch.randint(0, SHAPE.vocab, (37,), generator=g)
    rc = main(["prefill", str(pack), "--tokens", ",".join(map(str, toks.tolist())), "--cache",
               str(blob_bytes(pack, 16)), "--chunk", "16", "--ring", "3", "--device", "cpu",
               "--experts", "ref", "--dump-logits", str(out)])
    assert rc == 0
    got = torch.from_numpy(np.load(out))
    want = load_model(pack, dtype=torch.float32, ffn=expert_ffn("ref")).prefill(
        toks, resident_provider(pack), chunk=None)
    assert got.shape == (37, SHAPE.vocab) and rel(got, want) < FP32_REL


@pytest.mark.parametrize("ffn", ["decoded", "kernel"])
def test_streamed_triton_ffns_match_resident(pack, tokens, ffn):
    """The Triton FFNs (fused, and decode-once-then-BF16 with its per-pass buffer carved from the
    loan) through the streaming engine: ring 3 < E, so layers run in passes; compared with the
    resident forward through the same FFN (see BF16_Y_REL for what differs). 12 tokens: a
    chunk of 8 and a short one (both sides' launches run in the interpreter, chunk by chunk)."""
    eng = engine(pack, ring=3, ffn=ffn, chunk=8)
    assert ("wdec" in eng.layout.spec.names()) == (ffn == "decoded")
    snap = snapshot(eng)
    res = eng.run(tokens[:12])
    model = load_model(pack, dtype=torch.float32, ffn=expert_ffn(ffn))
    want = model.prefill(tokens[:12], resident_provider(pack), chunk=8)
    assert rel(res.logits, want) < BF16_Y_REL
    assert_restored(eng, snap)


# The resident forward rounds each layer's y to bf16 once (2**-9 relative); the streamed passes
# add into an fp32 accumulator instead. Measured ~1.2e-3 on this model.
BF16_Y_REL = 1e-2


def test_a_card_that_holds_the_model_streams_nothing(pack, tokens, reference):
    """Cache budget above the model's experts: the loan takes the spare region, evicts nothing,
    and the prompt streams no byte."""
    eng = engine(pack, cache_blobs=40, ring=3)
    res = eng.run(tokens)
    assert res.stats.bytes_streamed == 0 and res.plan.participants[0].loan_slots == 0
    assert rel(res.logits, reference) < FP32_REL


# 64 experts, top-4: stream_all_min = 16, so a 15-token prompt stages up to 60 routed experts.
SHAPE64 = SHAPE.with_(n_layer=4, n_expert=64, top_k=4)


@pytest.fixture(scope="module")
def pack64(tmp_path_factory):
    return synth_pack(tmp_path_factory.mktemp("p") / "e64.pack", SHAPE64, ExpertFormats.of("Q8_0"),
                      progress=False)


def test_a_short_prompt_carves_no_more_ring_than_its_plan(pack64, monkeypatch):
    """A prompt under stream_all_min (STAGE) on a cache so tight the plan falls back to a ring
    of about 24 slots: the engine carves that ring (STAGE staging in ring-sized batches), not
    one slot per routed expert (60), and borrows the slots the plan names."""
    from strata.engine import session as engine_session
    from strata.memory import Loan, PromptLayout
    blob = blob_bytes(pack64, 1)
    probe = PrefillEngine(pack64, EngineConfig(vram=1 << 30, cache=blob * 256, max_prompt=64,
                                               device="cpu", ffn="ref"))
    need = probe.layout.bytes_needed(256, 24)       # the smallest chunk beside 24 slots
    cache = (-(-need // blob) + 1) * blob * 10 // 9 + blob
    carved, lent = [], []
    real_carve = PromptLayout.carve

    def watch_carve(self, carve, T, ring, batch=None):
        if not carve.is_dry:
            carved.append((T, ring))
        return real_carve(self, carve, T, ring, batch)

    class WatchedLoan(Loan):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            lent.append(self.n_slots)

    monkeypatch.setattr(PromptLayout, "carve", watch_carve)
    monkeypatch.setattr(engine_session, "Loan", WatchedLoan)
    eng = PrefillEngine(pack64, EngineConfig(vram=1 << 30, cache=cache, max_prompt=64,
                                             device="cpu", ffn="ref", scan_max=256))
    tokens = torch.randint(0, SHAPE64.vocab, (15,), generator=torch.Generator().manual_seed(3))
    snap = snapshot(eng)
    res = eng.run(tokens)
    (pp,) = res.plan.participants
    assert res.plan.rule == "fallback" and res.ring == "STAGE"
    assert len(carved) == 1 and carved[0][0] == 15 and carved[0][1] < 15 * SHAPE64.top_k
    assert carved[0][1] <= pp.ring_slots and lent == [pp.loan_slots]
    want = load_model(pack64, dtype=torch.float32, ffn=expert_ffn("ref")).prefill(
        tokens, resident_provider(pack64), chunk=None)
    assert rel(res.logits, want) < FP32_REL
    assert_restored(eng, snap)


def test_the_collector_pauses_for_a_prompt_and_comes_back(pack, tokens, monkeypatch):
    """PrefillEngine.run turns Python's cyclic GC off for the prompt and on again after it,
    also when the prompt fails; STRATA_GC_PAUSE=0 leaves it alone; a caller's own gc.disable()
    is kept."""
    import gc

    from strata.engine.observe import EngineObserver

    class Seen(EngineObserver):
        def __init__(self):
            self.during = []

        def on_plan(self, plan, chunk, ring):
            self.during.append(gc.isenabled())

    eng = engine(pack, ring=2)
    seen = Seen()
    eng.observers.append(seen)
    assert gc.isenabled()
    eng.run(tokens)
    assert seen.during == [False] and gc.isenabled()
    with pytest.raises(StrataError):   # a failed prompt gives the collector back too
        eng.run(tokens, fail_after_layers=1)
    assert gc.isenabled()
    monkeypatch.setenv("STRATA_GC_PAUSE", "0")
    eng.run(tokens)
    assert seen.during[-1] is True
    monkeypatch.delenv("STRATA_GC_PAUSE")
    gc.disable()
    try:
        eng.run(tokens)
        assert seen.during[-1] is False and not gc.isenabled()   # the caller's choice stands
    finally:
        gc.enable()


def test_the_first_copy_goes_out_before_the_later_layers_are_queued(pack, tokens, monkeypatch):
    """Stream mode queues every layer at a chunk's start; the copy lane gets its first blobs as
    soon as the first layer is queued, not after the host has built every layer's tables."""
    from strata.engine.observe import EngineObserver
    from strata.engine.provider import StreamingProvider
    events = []
    queue_layer = StreamingProvider._queue_layer

    def spy(self, layer, experts):
        events.append(("queue", layer))
        return queue_layer(self, layer, experts)

    class Copies(EngineObserver):
        def on_chunk(self, part, start, n_tokens, mark):
            events.append(("chunk", start))

        def on_copy(self, part, layer, expert, nbytes, start, done, count=1):
            events.append(("copy", layer))

    monkeypatch.setattr(StreamingProvider, "_queue_layer", spy)
    eng = engine(pack, ring=3, chunk=16)
    eng.observers.append(Copies())
    res = eng.run(tokens, logits="none")
    assert res.stats.bytes_streamed > 0
    starts = [i for i, e in enumerate(events) if e[0] == "chunk"]
    assert len(starts) == len(res.stats.chunks) > 1
    for a, b in zip(starts, starts[1:] + [len(events)]):
        chunk = events[a + 1:b]
        queued = [l for kind, l in chunk if kind == "queue"]
        assert len(queued) == SHAPE.n_layer > 1
        first_copy = next(i for i, e in enumerate(chunk) if e[0] == "copy")
        assert chunk[:first_copy] == [("queue", queued[0])], chunk
