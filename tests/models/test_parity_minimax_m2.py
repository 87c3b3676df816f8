"""MiniMax-M2 through the model seam: a tiny seeded random transformers model
(tests/models/hf_minimax_m2.py), packed from its HF folder and from a GGUF written in llama.cpp's
minimax-m2 layout, gives transformers' logits at every position, all-resident and streamed.

Tolerances as for the other architectures (tests/models/test_parity_archs.py): FP32_REL = 1e-5
with the fp32 reference expert FFN (identical weights on both sides, BF16-exact; for Q8_0 HF holds
the dequantized experts), fp32 arithmetic in another order only. MiniMax-M2's experts are the
plain SiLU FFN, whose Triton GEMM test_parity_packs holds to BF16_FFN_REL; what is new here is
the attention (whole-projection q/k norms, partial RoPE) and the router (sigmoid, correction
bias), both dense fp32 code. Streamed runs (uneven chunks, a ring smaller than a layer's
experts, STAGE) must equal the all-resident forward within FP32_REL.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from strata.cli import main
from strata.engine.load import load_model, resident_provider
from strata.models.moe import expert_ffn
from strata.shapes import get_preset
from tests.models.hf_archs import state
from tests.models.hf_minimax_m2 import MINIMAX_TINY, make_minimax_m2, write_minimax_m2_gguf
from tests.models.hf_tiny import requantize_experts
from tests.models.test_parity_archs import (BF16_FFN_REL, FP32_REL, TOKENS, _engine, _pack,
                                           _prefill, hf_logits, rel)


@pytest.fixture(scope="module")
def hf_pack(tmp_path_factory):
    """(HF model, its BF16 pack from the HF folder, HF logits)."""
    hf = make_minimax_m2(MINIMAX_TINY, seed=5)
    d = tmp_path_factory.mktemp("minimax-m2")
    hf.save_pretrained(d / "hf")
    pack = _pack([d / "hf", "--quant", "BF16"], d / "hf.pack")
    return hf, pack, hf_logits(hf)


def test_hf_folder_pack(hf_pack, tmp_path):
    hf, pack, ref = hf_pack
    got = _prefill(pack, tmp_path, "--device", "cpu", "--experts", "ref", "--chunk", "5")
    assert got.shape == (len(TOKENS), MINIMAX_TINY.vocab)
    assert rel(got, ref) < FP32_REL


def test_in_memory_layout_reads_alike(hf_pack, tmp_path):
    """transformers 5's in-memory names (mlp.gate, mlp.e_score_correction_bias, fused
    mlp.experts.gate_up_proj / down_proj) read as the release's layout does."""
    from safetensors.torch import save_file
    hf, _, ref = hf_pack
    d = tmp_path / "fused"
    hf.config.save_pretrained(d)
    sd = state(hf)
    assert "model.layers.0.mlp.experts.gate_up_proj" in sd
    save_file({k: v.contiguous() for k, v in sd.items()}, str(d / "model.safetensors"))
    pack = _pack([d, "--quant", "BF16"], tmp_path / "fused.pack")
    got = _prefill(pack, tmp_path, "--device", "cpu", "--experts", "ref", "--chunk", "13")
    assert rel(got, ref) < FP32_REL


@pytest.mark.parametrize("fmt", ["BF16", "Q8_0"])
def test_gguf_pack(tmp_path, fmt):
    hf = make_minimax_m2(MINIMAX_TINY, seed=6)
    if fmt != "BF16":   # HF holds exactly what the quantized blobs decode to
        requantize_experts(hf, fmt)
    g = write_minimax_m2_gguf(state(hf), MINIMAX_TINY, tmp_path / f"m-{fmt}.gguf", fmt)
    pack = _pack([g], tmp_path / f"m-{fmt}.pack")
    got = _prefill(pack, tmp_path, "--device", "cpu", "--experts", "ref", "--chunk", "4")
    assert rel(got, hf_logits(hf)) < FP32_REL


@pytest.mark.parametrize("mode", ["ring2-chunk5", "stage-chunk4"])
def test_streamed_equals_resident(hf_pack, mode, monkeypatch):
    """A 16-blob cache lending a 2-slot ring (< E = 8: several passes per layer), 13 tokens in
    chunks of 5 (the last one short); STAGE stages only the routed experts of each chunk."""
    hf, pack, ref = hf_pack
    model = load_model(pack, dtype=torch.float32, ffn=expert_ffn("ref"))
    resident = model.prefill(torch.tensor(TOKENS), resident_provider(pack), chunk=None)
    assert rel(resident.numpy(), ref) < FP32_REL
    if mode.startswith("stage"):
        monkeypatch.setenv("STRATA_STREAM_ALL_MIN", "1000")   # every chunk "small": STAGE
        res = _engine(pack, chunk=4).run(torch.tensor(TOKENS))
        assert res.ring == "STAGE"
    else:
        res = _engine(pack, chunk=5, ring=2).run(torch.tensor(TOKENS))
        assert res.ring == 2
    assert res.stats.bytes_streamed > 0
    assert rel(res.logits.numpy(), resident.numpy()) < FP32_REL


def test_router_is_transformers_and_the_bias_steers(hf_pack):
    """strata's router on the same hidden states picks transformers' experts with its weights,
    and the correction bias changes some choices (so the parity above exercises it)."""
    hf, pack, _ = hf_pack
    model = load_model(pack, dtype=torch.float32, ffn=expert_ffn("ref"))
    h = torch.randn(64, MINIMAX_TINY.d_model, generator=torch.Generator().manual_seed(1))
    moved = 0
    for l, layer in enumerate(hf.model.layers):
        moe = layer.mlp
        with torch.no_grad():
            _, w_hf, ids_hf = moe.gate(h, moe.e_score_correction_bias)
        ids, w = model.router(model.layers[l])(h)
        ids_hf, order = ids_hf.sort(-1)
        ids, mine = ids.sort(-1)
        assert torch.equal(ids, ids_hf)
        torch.testing.assert_close(w.gather(1, mine), w_hf.gather(1, order), rtol=1e-6,
                                   atol=1e-7)
        plain = torch.sigmoid(h @ moe.gate.weight.t()).topk(MINIMAX_TINY.top_k).indices.sort(-1)
        moved += int((plain.values != ids).any(-1).sum())
    assert moved > 0


def test_preset_and_plan():
    """The published shape: per layer 3 x 3072 x 1536 expert weights, q/k norms as wide as the
    projections; `strata plan` prices it."""
    from strata.archs.registry import get_arch
    s = get_preset("minimax-m2")
    assert (s.n_layer, s.d_model, s.n_expert, s.top_k, s.d_expert, s.vocab) == (
        62, 3072, 256, 8, 1536, 200064)
    assert (s.n_head, s.n_kv_head, s.head_dim, s.rot_dim, s.rope_theta) == (
        48, 8, 128, 64, 5e6)
    specs = get_arch("minimax-m2").layer_specs(s, 0)
    assert specs["blk.0.attn_q_norm.weight"] == (48 * 128,)
    assert specs["blk.0.attn_k_norm.weight"] == (8 * 128,)
    assert specs["blk.0.exp_probs_b.bias"] == (256,)
    # ~ 229B parameters in all, ~ 10B of them active per token
    experts = s.n_layer * s.n_expert * s.expert_params
    assert 225e9 < experts + sum(int(torch.tensor(v).prod()) for v in
                                 get_arch("minimax-m2").dense_specs(s).values()) < 232e9
    assert main(["plan", "--preset", "minimax-m2", "--quant", "Q4_K", "--vram", "24GiB",
                 "--prompt-tokens", "8192"]) == 0
    assert main(["plan", "--preset", "tiny-minimax-m2", "--vram", "2GiB"]) == 0


@pytest.mark.gpu
def test_gpu_resident_prefill(hf_pack):
    """On the GPU, as test_parity_archs' GPU case: fp32 dense + the Triton expert GEMM within
    BF16_FFN_REL of the CPU's fp32 reference read; bf16 dense (the whole-projection q/k norms
    through the fused rms_norm, chunk_attention over the cache) agrees on the top token at
    >= 90% of positions with a median error under 2 BF16_FFN_REL."""
    hf, pack, _ = hf_pack
    tok = torch.tensor(TOKENS)
    cpu = load_model(pack, device="cpu", dtype=torch.float32, ffn=expert_ffn("ref"))
    ref = cpu.prefill(tok, resident_provider(pack, "cpu"), chunk=5).numpy()
    model = load_model(pack, device="cuda", dtype=torch.float32, ffn=expert_ffn("kernel"))
    prov = resident_provider(pack, "cuda")
    assert rel(model.prefill(tok, prov, chunk=5).cpu().numpy(), ref) < BF16_FFN_REL
    bf = load_model(pack, device="cuda", dtype=torch.bfloat16, ffn=expert_ffn("kernel"))
    got = bf.prefill(tok, prov, chunk=5).cpu().numpy()
    per_pos = np.abs(got - ref).max(-1) / np.abs(ref).max()
    assert np.median(per_pos) < 2 * BF16_FFN_REL
    assert (got.argmax(-1) == ref.argmax(-1)).mean() >= 0.9
