"""Every expert provider satisfies the one declared protocol (strata.models.provider).

Each provider is driven through the whole call sequence the model makes, with fresh random
routing, and checked against what the protocol promises: every routed assignment is served by
exactly one pass, at a slot that holds that expert's blob byte for byte, and a workspace that
does not accumulate comes with exactly one pass. The streaming providers (one participant,
two participants behind SplitProvider, STREAM and STAGE) are the engine's own, caught where the
engine hands them to the model.
"""
import pytest
import torch

from strata.engine.prefill import EngineConfig, PrefillEngine
from strata.models import ExpertProvider, LayerWorkspace, Pass, ResidentProvider
from strata.engine.load import resident_provider
from strata.models.provider import OnDemandProvider
from strata.packs import Pack
from strata.packs.synth import ExpertFormats, synth_pack
from strata.shapes import get_preset

SHAPE = get_preset("tiny")     # L=2, D=64, E=8, K=2, F=32
T = 8


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    fmts = [ExpertFormats.of("Q8_0"), ExpertFormats.of("Q4_0", down="Q8_0")]
    path = synth_pack(tmp_path_factory.mktemp("p") / "tiny.pack", SHAPE, fmts, progress=False)
    return Pack.open(path)


def routing(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(SHAPE.n_expert, generator=g)[:SHAPE.top_k]
                        for _ in range(T)])                                   # [T, K]


def conform(provider, pack, seed: int = 0) -> list[int]:
    """Drive `provider` through one prompt of one chunk; returns the passes per layer."""
    assert isinstance(provider, ExpertProvider)
    n_passes = []
    provider.begin_prompt(T, T)
    provider.begin_chunk(0, T)
    for layer in range(provider.n_layer):
        topk = routing(seed + layer)
        provider.begin_layer(layer)
        ws = provider.workspace(layer)
        assert isinstance(ws, LayerWorkspace)
        served = torch.zeros_like(topk)
        n = 0
        size = pack.layers[layer].blob_size
        for p in provider.passes(layer, topk):
            assert isinstance(p, Pass) and p.topk_ids.shape == topk.shape
            inside = p.topk_ids >= 0
            assert torch.equal(p.topk_ids[inside], topk[inside])
            for e in torch.unique(p.topk_ids[inside]).tolist():
                off = int(p.experts.slot_offset[e])
                assert off >= 0, f"layer {layer} expert {e} routed but absent"
                assert torch.equal(p.experts.arena[off:off + size].cpu(), pack.experts(layer)[e])
            served += inside
            n += 1
        assert bool((served == 1).all()), "an assignment served twice or never"
        assert ws.accumulate or n == 1
        if ws.accumulator is not None:
            assert ws.accumulator.dtype == torch.float32 and ws.accumulator.shape[0] >= T
        provider.end_layer(layer)
        n_passes.append(n)
    provider.end_chunk()
    assert isinstance(provider.stats(), dict)
    provider.end_prompt(True)
    return n_passes


def test_resident_provider(pack):
    assert conform(resident_provider(pack), pack) == [1] * SHAPE.n_layer


def test_on_demand_provider(pack):
    p = OnDemandProvider(pack)
    assert conform(p, pack) == [1] * SHAPE.n_layer
    per_layer = [pl.blob_size * SHAPE.n_expert for pl in pack.layers]
    assert p.stats()["expert_bytes_read"] == sum(per_layer)


def _engine_provider(pack, monkeypatch, *, stage=False, cache_blobs=16, **kw):
    """Run `conform` on the provider the engine builds for a prompt (instead of the model)."""
    if stage:
        monkeypatch.setenv("STRATA_STREAM_ALL_MIN", "1000")   # every chunk is "small": STAGE
    cfg = EngineConfig(cache=cache_blobs * pack.max_blob, max_prompt=64, device="cpu", chunk=T,
                       ffn="ref", **kw)
    eng = PrefillEngine(pack, cfg)
    seen = {}

    def prefill(tokens, provider, **_):
        seen["type"] = type(provider).__name__
        seen["passes"] = conform(provider, pack)
    monkeypatch.setattr(eng.model, "prefill", prefill)
    res = eng.run(torch.zeros(T, dtype=torch.int64), logits="none")
    return seen, res


def test_streaming_provider(pack, monkeypatch):
    seen, res = _engine_provider(pack, monkeypatch, vram=1 << 30, ring=2)
    assert seen["type"] == "StreamingProvider" and res.ring == 2
    assert max(seen["passes"]) > 1          # ring 2 < the routed experts: several passes


def test_streaming_provider_stage(pack, monkeypatch):
    seen, res = _engine_provider(pack, monkeypatch, stage=True, vram=1 << 30)
    assert seen["type"] == "StreamingProvider" and res.ring == "STAGE"
    assert {c.mode for c in res.stats.chunks} == {"stage"}


def test_split_provider(pack, monkeypatch):
    seen, _ = _engine_provider(pack, monkeypatch, cache_blobs=8, vram=[1 << 30, 1 << 30], ring=2)
    assert seen["type"] == "SplitProvider" and len(seen["passes"]) == SHAPE.n_layer


def test_an_incomplete_provider_is_not_one():
    """The protocol check can fail: the old shape (experts() instead of passes/workspace) is not
    an ExpertProvider."""
    class Old:
        n_layer = 1

        def begin_prompt(self, n_tokens, chunk): ...
        def end_prompt(self, ok): ...
        def begin_chunk(self, start, n_tokens): ...
        def begin_layer(self, layer): ...
        def experts(self, layer, topk_ids): ...
        def end_layer(self, layer): ...
        def end_chunk(self): ...
        def stats(self): ...

    assert not isinstance(Old(), ExpertProvider)
    assert isinstance(ResidentProvider([], []), ExpertProvider)
