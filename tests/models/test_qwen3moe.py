"""Qwen3-MoE forward: parity with Hugging Face transformers, chunked == unchunked, the provider
contract the streaming engine relies on.

Tolerances (normalized: max |a - b| / max |b| over all logits):
- FP32_REL = 1e-5: strata fp32 vs HF fp32 with IDENTICAL weights (the HF model's weights are
  BF16-exact, so a BF16 pack holds them losslessly; Q8_0 tests give HF the dequantized Q8_0
  weights). Only summation order differs: ~1e-7 per op; 2 layers of attention + MoE measured
  3.7e-7, so 1e-5 leaves 25x headroom and still catches any real bug (a wrong RoPE half, a
  missed renormalization, a lost chunk of KV each give > 1e-2).
- CHUNK_REL = 1e-5: the same model chunked vs unchunked differs only in SDPA's blocking.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings, strategies as st

from strata.errors import StrataError
from strata.experts import ExpertSet
from strata.archs.registry import get_arch
from strata.models import LayerWorkspace, Pass, ResidentProvider
from strata.models.moe import moe_ffn_ref
from strata.models.qwen3moe import Qwen3Moe, forward_torch
from tests.models.hf_tiny import (TINY, hf_state, make_hf_model, requantize_experts, to_strata,
                                  to_strata_quant)

FP32_REL = 1e-5
CHUNK_REL = 1e-5


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


@pytest.fixture(scope="module")
def hf_model():
    return make_hf_model(TINY, seed=0)


@pytest.fixture(scope="module")
def strata_bf16(hf_model):
    dense, blobs, lays = to_strata(hf_state(hf_model), TINY)
    model = Qwen3Moe.from_tensors(TINY, dense, ffn=moe_ffn_ref)
    return model, ResidentProvider(blobs, lays)


def prompt(n: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, TINY.vocab, (n,), generator=torch.Generator().manual_seed(seed))


def hf_logits(hf, tokens):
    with torch.no_grad():
        return hf(tokens[None]).logits[0].float()


def test_registry_has_qwen3moe():
    assert get_arch("qwen3moe").wiring is Qwen3Moe
    with pytest.raises(StrataError, match="not supported"):
        get_arch("llama")


@pytest.mark.parametrize("n_tokens", [1, 7, 37], ids=lambda n: f"T{n}")
def test_bf16_experts_match_transformers(hf_model, strata_bf16, n_tokens):
    model, prov = strata_bf16
    tok = prompt(n_tokens)
    ref = hf_logits(hf_model, tok)
    out = model.prefill(tok, prov)
    assert out.shape == (n_tokens, TINY.vocab) and out.dtype == torch.float32
    assert rel_err(out, ref) < FP32_REL


def test_routing_spreads_over_experts(hf_model, strata_bf16):
    """The parity tests mean something only if routing spreads over (nearly) every expert."""
    model, prov = strata_bf16
    seen = []

    class Spy(ResidentProvider):
        def passes(self, layer, topk_ids):
            seen.append(topk_ids.clone())
            return super().passes(layer, topk_ids)

    spy = Spy.__new__(Spy)
    spy.__dict__.update(prov.__dict__)
    model.prefill(prompt(37), spy)
    for ids in seen:
        assert torch.unique(ids).numel() >= TINY.n_expert - 1


def test_q8_0_experts_match_transformers():
    """Q8_0 blobs decode through gguf-py's reference; HF gets the same dequantized weights."""
    hf = make_hf_model(TINY, seed=2)
    requantize_experts(hf, "Q8_0")
    dense, blobs, lays = to_strata_quant(hf_state(hf), TINY, "Q8_0")
    model = Qwen3Moe.from_tensors(TINY, dense, ffn=moe_ffn_ref)
    tok = prompt(19, seed=3)
    assert rel_err(model.prefill(tok, ResidentProvider(blobs, lays)), hf_logits(hf, tok)) < FP32_REL


def test_reference_forward_matches(strata_bf16):
    model, prov = strata_bf16
    tok = prompt(23)
    assert rel_err(model.prefill(tok, prov, chunk=6), forward_torch(model, prov, tok)) < CHUNK_REL


def _chunked(model, prov, tok, sizes):
    cache = model.new_cache(capacity=tok.numel())
    outs, start = [], 0
    for n in sizes:
        prov.begin_chunk(cache.length, n)
        outs.append(model.forward_chunk(tok[start:start + n], cache, prov))
        prov.end_chunk()
        start += n
    return torch.cat(outs)


@settings(max_examples=12)  # each example is 2-3 forwards of the tiny model (~0.7 s on CI)
@given(sizes=st.lists(st.integers(1, 13), min_size=1, max_size=6))
@example(sizes=[1] * 5).via("one token per chunk: every query attends only to the cache + itself")
@example(sizes=[29, 1]).via("a last chunk of one token after a long first chunk")
@example(sizes=[3, 17, 2, 8]).via("uneven chunks")
def test_chunked_equals_unchunked(strata_bf16, sizes):
    model, prov = strata_bf16
    tok = prompt(sum(sizes), seed=len(sizes))
    whole = model.prefill(tok, prov)
    assert rel_err(_chunked(model, prov, tok, sizes), whole) < CHUNK_REL


@pytest.mark.parametrize("chunk", [1, 4, 10, 64], ids=lambda c: f"chunk{c}")
def test_prefill_chunk_option(strata_bf16, chunk):
    model, prov = strata_bf16
    tok = prompt(21)
    assert rel_err(model.prefill(tok, prov, chunk=chunk), model.prefill(tok, prov)) < CHUNK_REL


class RoutedOnlyProvider:
    """What the streaming engine's STAGE mode does: each layer's one pass is a FRESH arena holding
    only the experts routed in this chunk, at shuffled slots, every other expert absent (-1).
    Records the call sequence so the test can check the contract."""

    def __init__(self, resident: ResidentProvider, seed: int = 0):
        self.res, self.n_layer, self.calls = resident, resident.n_layer, []
        self.g = torch.Generator().manual_seed(seed)

    def begin_prompt(self, n_tokens, chunk):
        self.calls.append(("begin_prompt", n_tokens, chunk))

    def end_prompt(self, ok):
        self.calls.append(("end_prompt", ok))

    def stats(self):
        return {}

    def begin_chunk(self, start, n_tokens):
        self.calls.append(("begin_chunk", start, n_tokens))

    def begin_layer(self, layer):
        self.calls.append(("begin_layer", layer))

    def workspace(self, layer):
        return LayerWorkspace(accumulate=False)

    def passes(self, layer, topk_ids):
        yield Pass(self.experts(layer, topk_ids), topk_ids)

    def experts(self, layer, topk_ids):
        self.calls.append(("passes", layer, tuple(topk_ids.shape)))
        full = self.res.sets[layer]
        size = full.layout.size
        ids = torch.unique(topk_ids).tolist()
        order = torch.randperm(len(ids), generator=self.g).tolist()
        arena = torch.zeros(len(ids) * size, dtype=torch.uint8)
        offs = torch.full((full.n_expert,), -1, dtype=torch.int64)
        for slot, e in zip(order, ids):
            src = int(full.slot_offset[e])
            arena[slot * size:(slot + 1) * size] = full.arena[src:src + size]
            offs[e] = slot * size
        return ExpertSet(arena, offs, full.layout)

    def end_layer(self, layer):
        self.calls.append(("end_layer", layer))

    def end_chunk(self):
        self.calls.append(("end_chunk",))


def test_provider_contract_routed_experts_only(strata_bf16):
    model, prov = strata_bf16
    tok = prompt(11)
    staged = RoutedOnlyProvider(prov)
    out = model.prefill(tok, staged, chunk=4)
    assert rel_err(out, model.prefill(tok, prov)) < CHUNK_REL
    L = TINY.n_layer
    per_chunk = lambda start, n: ([("begin_chunk", start, n)]
                                  + [c for l in range(L) for c in (("begin_layer", l),
                                     ("passes", l, (n, TINY.top_k)), ("end_layer", l))]
                                  + [("end_chunk",)])
    assert staged.calls == ([("begin_prompt", 11, 4)] + per_chunk(0, 4) + per_chunk(4, 4)
                            + per_chunk(8, 3) + [("end_prompt", True)])


def test_failure_mid_prompt_ends_the_prompt(strata_bf16):
    """An error inside a chunk (the engine's failed allocation) reaches the caller, the provider
    hears end_prompt(ok=False), and the next prompt through the same provider succeeds."""
    model, prov = strata_bf16

    class FailOnce(RoutedOnlyProvider):
        armed = True

        def experts(self, layer, topk_ids):
            if self.armed and self.calls.count(("begin_chunk", 4, 4)) and layer == 1:
                self.armed = False
                raise StrataError("injected: ring allocation failed")
            return super().experts(layer, topk_ids)

    p = FailOnce(prov)
    tok = prompt(11)
    with pytest.raises(StrataError, match="injected"):
        model.prefill(tok, p, chunk=4)
    assert p.calls[-1] == ("end_prompt", False) and ("end_chunk",) not in p.calls[-3:]
    assert rel_err(model.prefill(tok, p, chunk=4), model.prefill(tok, prov)) < CHUNK_REL
    assert p.calls[-1] == ("end_prompt", True)


def test_absent_routed_expert_is_an_error(strata_bf16):
    model, prov = strata_bf16

    class Empty(RoutedOnlyProvider):
        def experts(self, layer, topk_ids):
            es = super().experts(layer, topk_ids)
            return ExpertSet(es.arena, torch.full_like(es.slot_offset, -1), es.layout)

    with pytest.raises(StrataError, match="not resident"):
        model.prefill(prompt(3), Empty(prov))


@pytest.mark.parametrize("bad", [[-1], [TINY.vocab], [0, 5, 9999]], ids=["neg", "V", "big"])
def test_out_of_vocab_tokens_refused(strata_bf16, bad):
    model, prov = strata_bf16
    with pytest.raises(StrataError, match="outside the vocabulary"):
        model.prefill(torch.tensor(bad), prov)


def test_empty_prompt_and_bad_chunk_refused(strata_bf16):
    model, prov = strata_bf16
    with pytest.raises(StrataError, match="non-empty"):
        model.prefill(torch.tensor([], dtype=torch.int64), prov)
    with pytest.raises(StrataError, match="chunk"):
        model.prefill(prompt(3), prov, chunk=0)


def test_kv_cache_capacity(strata_bf16):
    model, prov = strata_bf16
    cache = model.new_cache(capacity=4)
    model.forward_chunk(prompt(3), cache, prov)
    with pytest.raises(StrataError, match="KV cache holds 4"):
        model.forward_chunk(prompt(2), cache, prov)


def test_dense_shape_mismatch_refused(hf_model):
    """The record checks the tensors against its name map before the wiring reads them."""
    dense, _, _ = to_strata(hf_state(hf_model), TINY)
    dense["blk.1.attn_k.weight"] = dense["blk.1.attn_k.weight"][:, :8]
    with pytest.raises(StrataError, match=r"blk.1.attn_k.weight is \[32, 8\], expected \[32, 64\]"):
        get_arch("qwen3moe").build(TINY, dense)
    del dense["blk.0.attn_q.weight"]
    with pytest.raises(StrataError, match="missing blk.0.attn_q.weight"):
        get_arch("qwen3moe").build(TINY, dense)


def test_tied_embeddings(hf_model):
    dense, blobs, lays = to_strata(hf_state(hf_model), TINY)
    del dense["output.weight"]
    model = Qwen3Moe.from_tensors(TINY, dense, ffn=moe_ffn_ref)
    assert model.lm_head is model.tok_embd


BF16_FFN_REL = 1e-2  # Triton GEMM's bf16 x/h contract; derivation in test_parity_packs


def test_triton_expert_gemm_matches_transformers(hf_model, strata_bf16):
    """The model through the Triton moe_ffn (interpreter on CPU), unevenly chunked, fp32 dense."""
    from strata.models.moe import expert_ffn
    model, prov = strata_bf16
    tok = prompt(13, seed=4)
    out = model.with_ffn(expert_ffn("kernel")).prefill(tok, prov, chunk=5)
    assert rel_err(out, hf_logits(hf_model, tok)) < BF16_FFN_REL


def test_later_chunks_attend_lower_right(strata_bf16):
    """Chunks after the first use the bottom-right causal bias: single-token chunks (query at
    the last key) and uneven splits give the whole prompt's logits."""
    model, prov = strata_bf16
    tok = prompt(20, seed=9)
    whole = model.prefill(tok, prov)
    assert rel_err(_chunked(model, prov, tok, [4, 1, 1, 9, 5]), whole) < CHUNK_REL


@pytest.mark.parametrize("chunk", [None, 6], ids=["one-chunk", "chunk6"])
def test_last_logits_only(strata_bf16, chunk):
    model, prov = strata_bf16
    tok = prompt(17)
    last = model.prefill(tok, prov, chunk=chunk, logits="last")
    assert last.shape == (1, TINY.vocab)
    assert rel_err(last, model.prefill(tok, prov)[-1:]) < CHUNK_REL
