"""Expert hit fraction, and the routing-spread property of synthetic models."""
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from strata.errors import StrataError
from strata.engine.route_trace import expert_hit_fraction, route_trace
from strata.packs.synth import ExpertFormats, synth_gguf, synth_pack
from strata.shapes import PRESETS


@given(T=st.integers(0, 64), K=st.integers(1, 4), E=st.integers(4, 32), seed=st.integers(0, 2**16))
@example(T=0, K=1, E=4, seed=0)     # empty chunk: nothing hit
@example(T=64, K=4, E=4, seed=0)    # K = E: every expert hit by any token
@settings(max_examples=40, deadline=None)
def test_hit_fraction_counts_distinct_experts(T, K, E, seed):
    K = min(K, E)
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]) if T else \
        torch.empty(0, K, dtype=torch.long)
    f = expert_hit_fraction(ids, E)
    assert f == len(set(ids.flatten().tolist())) / E
    if T:
        per = expert_hit_fraction(ids, E, chunk=5)
        assert len(per) == -(-T // 5) and float(per.max()) <= f


def test_hit_fraction_refuses_bad_ids():
    with pytest.raises(StrataError):
        expert_hit_fraction(torch.tensor([[0, 8]]), 8)
    with pytest.raises(StrataError):
        expert_hit_fraction(torch.tensor([0, 1]), 8)


def test_all_to_one_expert():
    assert expert_hit_fraction(torch.zeros(100, 1, dtype=torch.long), 16) == 1 / 16


def test_synthetic_routing_spreads_and_stays_scaled(tmp_path):
    """E=64, K=8, 8 layers, T=256: a trained MoE hits ~every expert; so must the synthetic one
    (through every layer: the collapse this guards against set in only after several layers)."""
    s = PRESETS["small"].with_(n_layer=8, d_model=128, d_expert=32, n_expert=64, top_k=8, vocab=512)
    p = synth_pack(tmp_path / "m.pack", s, ExpertFormats.of("Q8_0"), seed=0, progress=False)
    ids = torch.randint(0, s.vocab, (256,), generator=torch.Generator().manual_seed(0))
    tr = route_trace(p, ids)
    fr = tr.hit_fractions(s.n_expert)
    assert min(fr) >= 0.95, fr
    for t in tr.topk:   # no expert takes a large share either
        load = torch.bincount(t.flatten(), minlength=s.n_expert).float()
        assert load.max() < 4 * load.mean(), load
    assert all(0.5 < r < 5 for r in tr.resid_rms), tr.resid_rms


def test_route_trace_same_through_gguf_and_pack(tmp_path):
    from strata.packs.from_gguf import gguf_to_pack
    s = PRESETS["tiny"]
    g = synth_gguf(tmp_path / "m.gguf", s, ExpertFormats.of("Q8_0"), seed=2, progress=False)
    p = gguf_to_pack(g, tmp_path / "m.pack", progress=False)
    ids = torch.randint(0, s.vocab, (32,), generator=torch.Generator().manual_seed(1))
    a, b = route_trace(g, ids), route_trace(p, ids)
    for x, y in zip(a.topk, b.topk):
        assert torch.equal(x, y)


def test_trace_is_what_the_moe_block_routed(tmp_path):
    """route_trace's observer (one chunk, one layer's experts at a time) records what the MoE block
    handed the provider: here recorded independently by a provider wrapper around the resident
    experts, with the prompt read in chunks of 16: the same expert sets per token, layer by
    layer, and a residual RMS for every layer."""
    from strata.engine.load import load_model, resident_provider
    from strata.models.moe import moe_ffn_ref
    s = PRESETS["small"].with_(n_layer=3, d_model=128, d_expert=32, n_expert=32, top_k=4, vocab=256)
    p = synth_pack(tmp_path / "m.pack", s, ExpertFormats.of("Q8_0"), seed=4, progress=False)
    ids = torch.randint(0, s.vocab, (64,), generator=torch.Generator().manual_seed(2))
    a = route_trace(p, ids)
    inner = resident_provider(p, "cpu")
    seen = [[] for _ in range(s.n_layer)]

    class Recording(type(inner)):
        def passes(self, layer, topk_ids):
            seen[layer].append(topk_ids.clone())
            return super().passes(layer, topk_ids)

    rec = Recording.__new__(Recording)
    rec.__dict__.update(inner.__dict__)
    load_model(p, device="cpu", ffn=moe_ffn_ref).prefill(ids, rec, chunk=16, logits="none")
    assert len(a.resid_rms) == s.n_layer and all(r > 0 for r in a.resid_rms)
    for x, y in zip(a.topk, seen):
        # same expert sets per token (ties could reorder within a row)
        assert torch.equal(x.sort(-1).values, torch.cat(y).sort(-1).values)
