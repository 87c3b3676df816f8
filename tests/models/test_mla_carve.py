"""The engine hands a DeepSeek-family layer its carve (strata.engine.session, strata.models.
mla_scratch, strata.planning.DENSE_FFN_BUF): the blocked attention's scratch (mla_k / mla_v /
mla_state / mla_c) lies in the prompt's loan at the plan's sizes; a bf16 read projects its query
into the carve's q, writes the attention's output into its attn and a leading dense layer's gate
and up products into dense_gu, instead of allocating them beside the plan, with the same bits."""
from __future__ import annotations

import pytest
import torch

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

    def dense_spy(self, x, buf=None):
        dense.append(None if buf is None else buf.data_ptr())
        return real_ffn(self, x, buf)
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
    # experts (the same DenseFFN beside the routed ones, in their phase) allocate theirs
    into = [p for p in dense if p is not None]
    assert len(into) == DS_TINY.dense.lead * 3 and dense.count(None) == (DS_TINY.n_layer - 1) * 3
    assert set(into) == {qp - place["q"] + place["dense_gu"]}
    monkeypatch.setattr(MLAScratch, "query", lambda self, *a: None)
    monkeypatch.setattr(MLAScratch, "output", lambda self, *a: None)
    monkeypatch.setattr(DenseFFN, "__call__", lambda self, x, buf=None: real_ffn(self, x))
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
    whole 8K chunk and of 16K at 32K (a block of 32K would cost bytes: the ring shrinks), with
    not one byte more than at the launch's block; a pinned launch runs at its own."""
    import json
    from strata.cli import main
    from strata.models.mla_launch import MLA_BLOCK

    def plan(T):
        assert main(["plan", "--preset", "deepseek-v3", "--quant", "Q4_K_M", "--layers", "10",
                     "--vram", "24GiB", "--prompt-tokens", str(T), "--json"]) == 0
        (p,) = json.loads(capsys.readouterr().out)["participants"]
        return p
    for T, want in ((8192, 8192), (32768, 16384)):
        grown = plan(T)
        with pin_mla_launch(block=MLA_BLOCK):
            pinned = plan(T)
        assert grown["grown"]["MB"] == want and pinned["grown"] == {}
        assert (grown["bytes_needed"], grown["ring"]) == (pinned["bytes_needed"], pinned["ring"])
    with pin_mla_launch(block=32768):
        assert plan(32768)["ring"] < grown["ring"]


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
