"""The engine hands a DeepSeek-family layer its carve (strata.engine.session, strata.models.
mla_scratch, strata.planning.DENSE_FFN_BUF): the blocked attention's scratch (mla_k / mla_v /
mla_state / mla_c) lies in the prompt's loan at the plan's sizes; a bf16 read projects its query
into the carve's q, writes the attention's output into its attn and a leading dense layer's gate
and up products into dense_gu, instead of allocating them beside the plan, with the same bits."""
from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings, strategies as st

from strata.models.ffn import DenseFFN
from strata.models.mla_launch import pin_mla_launch


@pytest.mark.parametrize("kvd,backend", [("bf16", "efficient"), ("int8", "efficient"),
                                         ("bf16", "flash"), ("int8", "flash"),
                                         ("bf16", "triton"), ("int8", "triton")])
def test_the_engine_hands_its_carve_to_the_attention(kvd, backend, tmp_path, monkeypatch):
    """Every layer's attention gets an MLAScratch whose buffers lie in the prompt's loan (the
    expert cache's bytes), of the plan's sizes (mla_c only with int8 KV; flash's mla_v
    max(hd, Hv) values a head), the engine built and run under the launch."""
    from tests.models.hf_family import DS_TINY
    with pin_mla_launch(backend=backend):
        sizes = engine_carve(kvd, tmp_path, monkeypatch)
    hd, Hv = DS_TINY.head_dim, DS_TINY.mla.v_head_dim                  # 24 and 16
    assert sizes["mla_v"] * hd == sizes["mla_k"] * (hd if backend == "flash" else Hv)


def engine_carve(kvd, tmp_path, monkeypatch):
    import strata.models.mla as mla
    from strata.engine.prefill import EngineConfig, PrefillEngine
    from strata.packs import Pack
    from strata.packs.memory import MemoryPack
    from strata.packs.synth import ExpertFormats
    from tests.models.hf_family import DS_TINY
    mem = MemoryPack(DS_TINY, ExpertFormats.of("BF16"), distinct=2, variants=1, device="cpu")
    pack = Pack.open(mem.save(tmp_path / "m.pack", progress=False, tokenizer=False))
    eng = PrefillEngine(pack, EngineConfig(vram=1 << 30, cache=24 * pack.max_blob, max_prompt=64,
                                           device="cpu", ffn="ref", chunk=4, ring=2, kv=kvd))
    seen = []
    real = mla.mla_chunk_attention
    monkeypatch.setattr(mla, "mla_chunk_attention",
                        lambda *a, scratch=None, **kw: seen.append(scratch) or real(*a, **kw))
    res = eng.run(torch.arange(9) % DS_TINY.vocab)
    buf = eng.cache.buffer
    lo, hi = buf.data_ptr(), buf.data_ptr() + buf.numel() * buf.element_size()
    sizes = {p["name"]: p["nbytes"] for p in res.plan.participants[0].placements}
    assert len(seen) == DS_TINY.n_layer * 3                   # 3 chunks of 4, 4, 1
    for sc in seen:
        ts = {"mla_k": sc.k, "mla_v": sc.v, "mla_state": sc.state, "mla_c": sc.c}
        assert (sc.c is not None) == (kvd == "int8")
        for name, t in ts.items():
            if t is not None:
                assert lo <= t.data_ptr() and t.data_ptr() + t.numel() * t.element_size() <= hi
                assert t.numel() * t.element_size() == sizes[name]
    return sizes


def test_a_bf16_read_computes_q_o_and_the_dense_ffn_in_its_carve(tmp_path, monkeypatch):
    """A bf16 read (the GPU's dense dtype) projects each layer's query into the carve's q and
    writes the attention's output into its attn, inside the loan, and reads the bits it reads
    with both allocated beside the plan (MLAScratch.query / output answering None)."""
    import strata.models.mla as mla
    from strata.models.mla_scratch import MLAScratch
    from tests.models.hf_family import DS_TINY
    seen = []
    real = mla.mla_chunk_attention

    def spy(qn, qp, *a, out=None, **kw):
        seen.append((qn.data_ptr(), None if out is None else out.data_ptr()))
        return real(qn, qp, *a, out=out, **kw)
    monkeypatch.setattr(mla, "mla_chunk_attention", spy)
    dense = []
    real_ffn = DenseFFN.__call__

    def dense_spy(self, x, buf=None, into=None):
        dense.append(None if buf is None else buf.data_ptr())
        return real_ffn(self, x, buf, into)
    monkeypatch.setattr(DenseFFN, "__call__", dense_spy)
    eng, tok = _bf16_engine(tmp_path)
    res = eng.run(tok, logits="all")
    buf = eng.cache.buffer
    place = {p["name"]: p["offset"] for p in res.plan.participants[0].placements}
    assert len(seen) == DS_TINY.n_layer * 3 and len(set(seen)) == 1   # 3 chunks; one q, one o
    (qp, op), = set(seen)
    assert buf.data_ptr() <= qp < op < buf.data_ptr() + buf.numel()
    assert op - qp == place["attn"] - place["q"]             # the carve's q and attn
    # the leading dense layer, one call a chunk, into the carve's dense_gu; the shared
    # experts (the same DenseFFN beside the routed ones, in their phase) into the experts'
    # spare h (LayerWorkspace.spare)
    base = qp - place["q"]
    assert dense.count(base + place["dense_gu"]) == DS_TINY.dense.lead * 3
    assert dense.count(base + place["h"]) == (DS_TINY.n_layer - DS_TINY.dense.lead) * 3
    assert len(dense) == DS_TINY.n_layer * 3
    monkeypatch.setattr(MLAScratch, "query", lambda self, *a: None)
    monkeypatch.setattr(MLAScratch, "output", lambda self, *a: None)
    monkeypatch.setattr(DenseFFN, "__call__", lambda self, x, buf=None, into=None:
                        real_ffn(self, x))
    eng2, _ = _bf16_engine(tmp_path / "b")
    assert torch.equal(eng2.run(tok, logits="all").logits, res.logits)


def test_the_latent_projections_lie_in_the_carve(tmp_path, monkeypatch):
    """A bf16 read: each MLA layer's compressed query and its norm lie in the carve's attn
    (before the attention's output lands there), x Wkva^T in its k (its rope key rotated where
    it lies) and the normed latent c in its v, the carve's buffers MLA's attention leaves
    alone; the read's bits are those with each allocated beside the plan."""
    import strata.models.mla as mla
    from strata.models.mla_scratch import MLAScratch
    from tests.models.hf_family import DS_TINY
    m = DS_TINY.mla
    norms, ropes = [], []
    real_norm, real_rope = mla.rms_norm, mla.rope_pairs_in_place

    def norm_spy(x, w, eps, out=None):
        y = real_norm(x, w, eps, out)
        norms.append((x.shape[0], x.data_ptr(), y.data_ptr()))
        return y

    def rope_spy(x, cos, sin):
        ropes.append((x.shape[0], x.data_ptr()))
        return real_rope(x, cos, sin)
    monkeypatch.setattr(mla, "rms_norm", norm_spy)
    monkeypatch.setattr(mla, "rope_pairs_in_place", rope_spy)
    eng, tok = _bf16_engine(tmp_path)
    res = eng.run(tok, logits="all")
    place = {p["name"]: p["offset"] for p in res.plan.participants[0].placements}
    buf = eng.cache.buffer
    two = 2                                                       # bf16 bytes
    kv_ropes = [(G, p) for G, p in ropes if G == 1]    # the k_pe's ([1, T, R]; q_pe's [H, T, R])
    assert len(kv_ropes) == DS_TINY.n_layer * 3 and len(norms) == 2 * DS_TINY.n_layer * 3
    base = kv_ropes[0][1] - place["k"] - m.kv_lora * two
    assert buf.data_ptr() <= base + place["k"] < buf.data_ptr() + buf.numel()
    assert {p for _, p in kv_ropes} == {base + place["k"] + m.kv_lora * two}
    for i in range(0, len(norms), 2):   # a layer's two: the query's, then the latent's
        (T, qa, qn), (_, kv, c) = norms[i], norms[i + 1]
        assert (qa, qn) == (base + place["attn"], base + place["attn"] + T * m.q_lora * two)
        assert (kv, c) == (base + place["k"], base + place["v"])
    for name in ("q_a", "kv_proj", "c_out"):
        monkeypatch.setattr(MLAScratch, name, (lambda self, *a: (None, None)) if name == "q_a"
                            else (lambda self, *a: None))
    eng2, _ = _bf16_engine(tmp_path / "b")
    assert torch.equal(eng2.run(tok, logits="all").logits, res.logits)


def _bf16_engine(tmp_path):
    from strata.engine.prefill import EngineConfig, PrefillEngine
    from strata.packs import Pack
    from strata.packs.memory import MemoryPack
    from strata.packs.synth import ExpertFormats
    from tests.models.hf_family import DS_TINY
    tmp_path.mkdir(parents=True, exist_ok=True)
    mem = MemoryPack(DS_TINY, ExpertFormats.of("BF16"), distinct=2, variants=1, device="cpu")
    pack = Pack.open(mem.save(tmp_path / "m.pack", progress=False, tokenizer=False))
    eng = PrefillEngine(pack, EngineConfig(vram=1 << 30, cache=24 * pack.max_blob, max_prompt=64,
                                           device="cpu", ffn="ref", chunk=4, ring=2,
                                           dtype=torch.bfloat16))
    return eng, torch.arange(9) % DS_TINY.vocab


def test_the_dense_ffn_in_a_buffer_is_the_dense_ffn():
    """DenseFFN given a buffer computes the same bits in it; one too small or of another dtype
    is passed over (the products allocated, as without one)."""
    g = torch.Generator().manual_seed(5)
    T, D, Fw = 7, 16, 24
    ffn = DenseFFN(*(torch.randn(*s, generator=g).bfloat16() for s in ((Fw, D), (Fw, D), (D, Fw))))
    x = torch.randn(T, D, generator=g).bfloat16()
    want = ffn(x)
    buf = torch.full((2 * T * Fw + 3,), float("nan"), dtype=torch.bfloat16)
    assert torch.equal(ffn(x, buf), want) and not buf[:2 * T * Fw].isnan().any()
    for bad in (torch.empty(2 * T * Fw - 1, dtype=torch.bfloat16), torch.empty(2 * T * Fw)):
        assert torch.equal(ffn(x, bad), want)


def test_the_plan_grows_the_attention_block_where_it_is_free(capsys):
    """DeepSeek-V3's first 10 layers under 24 GiB (`strata plan`): the feed-forward phase is the
    longer at a chunk of 8K and 32K tokens, so the carve runs MLA's attention in blocks of the
    whole chunk at both (the attention phase's k and v are the latent projection's widths,
    [T, Lkv + R], not per-head keys: with those a block of 32K cost bytes), with not one byte
    more than at the launch's block; a pinned launch runs at its own."""
    import json
    from strata.cli import main
    from strata.models.mla_launch import MLA_BLOCK

    def plan(T):
        assert main(["plan", "--preset", "deepseek-v3", "--quant", "Q4_K_M", "--layers", "10",
                     "--vram", "24GiB", "--prompt-tokens", str(T), "--json"]) == 0
        (p,) = json.loads(capsys.readouterr().out)["participants"]
        return p
    for T, want in ((8192, 8192), (32768, 32768)):
        grown = plan(T)
        with pin_mla_launch(block=MLA_BLOCK):
            pinned = plan(T)
        assert grown["grown"]["MB"] == want and pinned["grown"] == {}
        assert (grown["bytes_needed"], grown["ring"]) == (pinned["bytes_needed"], pinned["ring"])


def test_the_engine_attends_at_the_block_its_carve_grew(tmp_path, monkeypatch):
    """With a launch of blocks of 2 (unpinned) the engine's carve grows the block for free, each
    layer's scratch carries it, the attention runs at it, and the read is the read pinned at that
    block, bit for bit."""
    import strata.models.mla as mla
    import strata.models.mla_launch as ml
    monkeypatch.setattr(ml, "DEFAULT", ml.MLALaunch(block=2))
    seen, real = [], mla.mla_chunk_attention

    def spy(*a, scratch=None, **kw):
        seen.append(scratch.block)
        return real(*a, scratch=scratch, **kw)
    monkeypatch.setattr(mla, "mla_chunk_attention", spy)
    eng, tok = _bf16_engine(tmp_path)
    got = eng.run(tok, logits="all").logits
    (block,) = set(seen)
    assert block > 2 and block & (block - 1) == 0
    monkeypatch.setattr(mla, "mla_chunk_attention", real)
    with pin_mla_launch(block=block):
        eng2, _ = _bf16_engine(tmp_path / "b")
        assert torch.equal(eng2.run(tok, logits="all").logits, got)


@settings(max_examples=40, deadline=None)
@given(H=st.integers(1, 64), N=st.integers(1, 64), R=st.sampled_from([2, 4, 8]),
       Hv=st.integers(1, 64), D=st.integers(8, 256), F=st.integers(8, 256), E=st.integers(2, 64),
       K=st.integers(1, 8), block=st.sampled_from([2, 4, 16]), T=st.integers(1, 300),
       prompt=st.integers(0, 900), kv=st.sampled_from(["bf16", "int8"]))
@example(H=4, N=16, R=8, Hv=16, D=64, F=32, E=16, K=4, block=4, T=64, prompt=0, kv="bf16")
@example(H=64, N=64, R=8, Hv=64, D=16, F=8, E=4, K=1, block=2, T=64, prompt=512,
         kv="bf16").via("the attention phase the longer: the block stays short of the chunk")
def test_the_mla_plan_grows_its_block_for_free(H, N, R, Hv, D, F, E, K, block, T, prompt, kv):
    """For MLA shapes, KV dtypes and prompt lengths (the key rows follow the longest prompt):
    the plan's layout (strata.planning.model_sizes / layout_spec) under an unpinned launch of
    `block` grows it by doublings, stopping once it reaches the chunk; its bytes are those of
    the launch's block pinned; where it stopped short of the chunk the next doubling costs
    bytes; the carve's mla_k holds the grown block's key rows (strata.planning.mla_dims)."""
    import strata.models.mla_launch as ml
    from strata.memory import Carve
    from strata.planning import KVPolicy, layout_spec, mla_dims, model_sizes
    from strata.memory.layout import PromptLayout
    from strata.shapes import Mla, ModelShape
    shape = ModelShape("deepseek2", n_layer=2, d_model=D, n_expert=E, top_k=min(K, E),
                       d_expert=F, n_head=H, n_kv_head=H, head_dim=N + R,
                       mla=Mla(0, 16, R, Hv))
    pol = KVPolicy(kv, None, max(prompt, T))
    lay = PromptLayout(model_sizes(shape, kv=pol), 512, layout_spec(kv=pol, shape=shape))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ml, "DEFAULT", ml.MLALaunch(block=block))
        out = lay.carve(Carve.dry(), T, 0)
        with ml.pin_mla_launch(block=block):
            pinned = lay.bytes_needed(T, 0)
    B = out.dims["MB"]
    assert B % block == 0 and (B // block) & (B // block - 1) == 0       # block · 2^k
    assert B == block or B < 2 * T
    assert pinned == out.stop
    if B < T:
        with ml.pin_mla_launch(block=2 * B):
            assert lay.bytes_needed(T, 0) > out.stop
    mk = next(p.nbytes for p in out.placements if p.name == "mla_k")
    assert mk == mla_dims(T, pol, B)["MR"] * H * (N + R) * 2
