"""MLA with int8 KV (strata.models.mla.MLACache kv="int8"): the latent c and the rope key k_pe
each int8 with one fp32 scale per token (strata.kernels.attention.kv_int8's format, each one
"head").

- The cache's round trip keeps |x - x'| <= scale (1/2 + ROUNDTRIP_SLACK) per element, and a
  token takes mla_token_bytes(int8) = Lkv + R + 8 bytes in it (what the plan counts).
- The attention over int8 codes (blocked, in a NaN-poisoned scratch with its mla_c rows) equals
  the fp64 absorbed form and the fp32 expanded reference on the same codes (REL 1e-5, as
  tests/models/test_mla_blocks.py).
- Logits, int8 against bf16 KV, on a tiny DeepSeek model whose MoE layers route every token to
  every expert (a routed top-k flips an expert choice under a 1e-2 perturbation and the
  logits jump: 22% on tests/models/test_family.py's seed-3 model; that is routing, not the KV):
  INT8_LOGITS_REL = 2e-2 (max |a - b| / max |b|). Why: a per-token absmax int8 code is within
  1/254 (0.39%) of the token's largest entry; each of the 3 layers' attention reads K and V
  decompressed from such latents and adds its output to the residual, so the errors add to
  ~1.2% at worst through 3 layers; 2e-2 leaves room for the softmax's and the head's gain.
  Measured 3.7e-3 .. 7.0e-3 (3 prompts of 40 tokens; the test reads 2 of 24).
- The engine reads int8 MLA KV (all resident) into the same logits, bit for bit, as the
  model's own int8 cache; its plan counts the int8 KV and carves mla_c.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings, strategies as st

from strata.kernels.attention.kv_int8 import ROUNDTRIP_SLACK
from strata.models.mla import MLACache, mla_chunk_attention, mla_chunk_attention_absorbed
from strata.models.mla_scratch import MLAScratch, mla_scratch_rows
from strata.shapes import get_preset, mla_token_bytes
from tests.models.hf_family import DS_TINY
from tests.models.test_mla_blocks import draw, poisoned

REL = 1e-5
INT8_LOGITS_REL = 2e-2


def int8_cache_of(c, k_pe, chunks):
    """An int8 MLACache fed c, k_pe in `chunks` -> (codes c, codes k_pe, scales c, scales k_pe)."""
    cache = MLACache(1, c.shape[1], k_pe.shape[1], capacity=c.shape[0], kv="int8",
                     device=c.device)
    a = 0
    for n in chunks:
        got = cache.extend(0, c[a:a + n], k_pe[a:a + n])
        cache.commit(n)
        a += n
    return got


def test_the_cache_round_trip_and_its_bytes():
    g = torch.Generator().manual_seed(0)
    c, k_pe = torch.randn(13, 32, generator=g) * 3, torch.randn(13, 8, generator=g) * 0.01
    c[4] = 0.0                                              # an all-zero latent: scale 0, codes 0
    cq, kq, cs, ks = int8_cache_of(c, k_pe, [5, 1, 7])
    assert cq.dtype == kq.dtype == torch.int8 and cs.shape == ks.shape == (13, 1)
    for x, q, s in ((c, cq, cs), (k_pe, kq, ks)):
        assert ((q.float() * s - x).abs() <= s * (0.5 + ROUNDTRIP_SLACK)).all()
    assert float(cs[4]) == 0.0 and not cq[4].any()
    assert float(ks.max()) < float(cs[cs > 0].min())       # the rope key has its own scales
    per_token = sum(t.element_size() * t[0].numel() for t in (cq, kq, cs, ks))
    assert per_token == mla_token_bytes(DS_TINY.with_(**{"mla.kv_lora": 32, "mla.qk_rope": 8}),
                                        "int8") == 48
    assert mla_token_bytes(get_preset("deepseek-v3"), "int8") == 512 + 64 + 8 == 584


@settings(max_examples=30, deadline=None)
@given(H=st.integers(1, 3), T=st.integers(1, 9), P=st.integers(0, 25), N=st.integers(1, 5),
       R=st.sampled_from([2, 4]), Hv=st.integers(1, 5), L=st.integers(1, 9),
       block=st.integers(1, 30), seed=st.integers(0, 999))
@example(H=2, T=1, P=0, N=3, R=2, Hv=3, L=4, block=4, seed=0).via("one token, nothing cached")
@example(H=1, T=7, P=11, N=2, R=2, Hv=2, L=5, block=3, seed=1).via("odd lengths, many blocks")
def test_int8_attention_equals_the_references(H, T, P, N, R, Hv, L, block, seed):
    q_nope, q_pe, c, k_pe, wkvb = draw(H, T, P, N, R, Hv, L, seed)
    S = P + T
    cq, kq, cs, ks = int8_cache_of(c, k_pe, [P, T] if P else [T])
    kw = dict(v_head_dim=Hv, scale=(N + R) ** -0.5, block=block, c_scale=cs, k_pe_scale=ks)
    sc = poisoned(H, N + R, Hv, T, S, block)
    rows = mla_scratch_rows(T, S, block)[0]
    sc = MLAScratch(sc.k, sc.v, sc.state, torch.full(((L + R) * rows,), float("nan")))
    out = torch.full((T, H, Hv), float("nan"))
    got = mla_chunk_attention(q_nope, q_pe, cq, kq, wkvb, sdpa=True, scratch=sc, out=out, **kw)
    absorbed = mla_chunk_attention_absorbed(q_nope, q_pe, cq, kq, wkvb, **kw)
    expanded = mla_chunk_attention(q_nope, q_pe, cq, kq, wkvb, sdpa=False, **kw)
    assert torch.isfinite(got).all()
    for want in (absorbed, expanded):
        assert float((got - want).abs().max() / want.abs().max()) < REL


@pytest.fixture(scope="module")
def every_expert_model():
    """DS_TINY with 4 experts, all chosen (top-4, one group): no expert choice to flip."""
    from strata.engine.load import load_model, resident_provider
    from strata.models.moe import expert_ffn
    from strata.packs.memory import MemoryPack
    from strata.packs.synth import ExpertFormats
    shape = DS_TINY.with_(n_expert=4, top_k=4, **{"router.n_group": 1, "router.topk_group": 1})
    mem = MemoryPack(shape, ExpertFormats.of("BF16"), distinct=2, variants=1, device="cpu")
    return load_model(mem, ffn=expert_ffn("ref")), resident_provider(mem), shape


@pytest.mark.parametrize("seed", [0, 1])
def test_int8_logits_against_bf16(every_expert_model, seed):
    model, provider, shape = every_expert_model
    tok = torch.randint(0, shape.vocab, (24,), generator=torch.Generator().manual_seed(seed))
    a = model.prefill(tok, provider, chunk=7)
    b = model.prefill(tok, provider, chunk=7, cache=model.new_cache(capacity=24, kv="int8"))
    assert torch.isfinite(b).all() and not torch.equal(a, b)
    assert float((a - b).abs().max() / a.abs().max()) < INT8_LOGITS_REL


def test_the_engine_reads_int8_mla_kv(tmp_path):
    """PrefillEngine(kv="int8") on a DeepSeek pack: the model's own int8 cache (not PromptKV),
    the logits of the model's int8 prefill bit for bit; the plan counts Lkv + R + 8 bytes a
    token a layer and carves mla_c, not the GQA int8 expansion."""
    from strata.engine.prefill import EngineConfig, PrefillEngine
    from strata.engine.load import load_model, resident_provider
    from strata.models.moe import expert_ffn
    from strata.packs import Pack
    from strata.packs.memory import MemoryPack
    from strata.packs.synth import ExpertFormats
    mem = MemoryPack(DS_TINY, ExpertFormats.of("BF16"), distinct=2, variants=1, device="cpu")
    pack = Pack.open(mem.save(tmp_path / "m.pack", progress=False, tokenizer=False))
    eng = PrefillEngine(pack, EngineConfig(vram=1 << 30, cache=24 * pack.max_blob, max_prompt=64,
                                           device="cpu", ffn="ref", chunk=5, ring=2, kv="int8"))
    tok = torch.arange(11) * 7 % DS_TINY.vocab
    res = eng.run(tok)
    model = load_model(pack, ffn=expert_ffn("ref"))
    want = model.prefill(tok, resident_provider(pack), chunk=5,
                         cache=model.new_cache(capacity=11, kv="int8"))
    assert torch.equal(res.logits, want)
    m = DS_TINY.mla
    assert eng.sizes.kv_bytes(64, 1) == 64 * (m.kv_lora + m.qk_rope + 8)   # layer 1
    names = [p["name"] for p in res.plan.participants[0].placements]
    assert "mla_c" in names and not any(n.startswith("kv_expand") for n in names)


@pytest.mark.gpu
def test_int8_blocked_on_the_gpu_at_deepseek_widths():
    """CUDA, bf16 q, int8 latent codes (dequantized a block at a time into the scratch's c
    rows), H 8 of DeepSeek-V3's heads, against the fp64 absorbed form on the same codes;
    the bound of the bf16 path (tests/models/test_mla_blocks.py BF16_REL)."""
    H, N, R, Hv, L, T, P, block = 8, 128, 64, 128, 512, 300, 900, 256
    q_nope, q_pe, c, k_pe, wkvb = draw(H, T, P, N, R, Hv, L, 9, dtype=torch.bfloat16,
                                       device="cuda")
    cq, kq, cs, ks = int8_cache_of(c, k_pe, [P, T])
    kw = dict(v_head_dim=Hv, scale=(N + R) ** -0.5, block=block, c_scale=cs, k_pe_scale=ks)
    got = mla_chunk_attention(q_nope, q_pe, cq, kq, wkvb, **kw).float()
    want = mla_chunk_attention_absorbed(q_nope, q_pe, cq, kq, wkvb, **kw).float()
    assert torch.isfinite(got).all()
    assert float((got - want).abs().max() / want.abs().max()) < 2e-2
