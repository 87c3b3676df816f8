"""Hugging Face Qwen3-MoE folder -> pack: per-expert (save_pretrained) and fused expert storage."""
import json

import numpy as np
import pytest
import torch

from strata.errors import StrataError
from strata.packs import Pack, split_blobs
from strata.packs.from_hf import hf_to_pack

transformers = pytest.importorskip("transformers")


def _tiny_hf(tmp_path, tie=False):
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, tie_word_embeddings=tie,
        max_position_embeddings=256, rms_norm_eps=1e-6)
    torch.manual_seed(0)
    m = transformers.Qwen3MoeForCausalLM(cfg).to(torch.bfloat16)
    with torch.no_grad():  # HF inits norms to exactly 1; make every tensor distinct
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    d = tmp_path / "hf"
    m.save_pretrained(d)
    return m, d


def _experts(sd, i):
    """gate [E, F, D], up, down [E, D, F] from transformers 5's fused in-memory parameters."""
    gu = sd[f"model.layers.{i}.mlp.experts.gate_up_proj"]
    F = gu.shape[1] // 2
    return gu[:, :F], gu[:, F:], sd[f"model.layers.{i}.mlp.experts.down_proj"]


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_hf_bf16_pack_bit_exact(tmp_path, tie):
    m, d = _tiny_hf(tmp_path, tie)
    pk = Pack.open(hf_to_pack(d, tmp_path / "m.pack", progress=False), verify=True)
    s = pk.shape
    assert (s.n_layer, s.d_model, s.n_expert, s.top_k, s.d_expert, s.vocab) == (2, 64, 8, 2, 32, 128)
    assert s.norm_topk_prob and pk.tied == tie
    sd = m.state_dict()
    for i in range(2):
        parts = split_blobs(pk.layers[i].layout, pk.experts(i))
        for w, ref in zip(("gate", "up", "down"), _experts(sd, i)):
            got = torch.from_numpy(parts[w].copy()).view(torch.bfloat16)
            assert torch.equal(got, ref), (i, w)
        assert torch.equal(pk.dense(f"blk.{i}.ffn_gate_inp.weight"), sd[f"model.layers.{i}.mlp.gate.weight"])
        assert torch.equal(pk.dense(f"blk.{i}.attn_k_norm.weight"),
                           sd[f"model.layers.{i}.self_attn.k_norm.weight"])
        assert torch.equal(pk.dense(f"blk.{i}.ffn_norm.weight"),
                           sd[f"model.layers.{i}.post_attention_layernorm.weight"])
    assert torch.equal(pk.dense("output.weight"), sd["lm_head.weight"])


def test_hf_fused_experts_and_quant(tmp_path):
    """A folder holding transformers 5's fused gate_up_proj/down_proj packs like the per-expert one.
    D = 64 = 2F on purpose: [E, 2F, D] and its transpose look alike (a bug this caught)."""
    from safetensors.torch import save_file
    m, d = _tiny_hf(tmp_path)
    fused = tmp_path / "fused"
    fused.mkdir()
    (fused / "config.json").write_text((d / "config.json").read_text())
    save_file({k: v.contiguous() for k, v in m.state_dict().items()}, str(fused / "model.safetensors"))
    a = Pack.open(hf_to_pack(d, tmp_path / "a.pack", quant="Q8_0", quant_down="Q4_0", progress=False))
    b = Pack.open(hf_to_pack(fused, tmp_path / "b.pack", quant="Q8_0", quant_down="Q4_0", progress=False))
    assert a.layers[0].layout.down.fmt.name == "Q4_0" and a.layers[0].layout.gate.fmt.name == "Q8_0"
    for i in range(2):
        assert torch.equal(a.experts(i), b.experts(i))
    # quantized bytes decode back close to the weights
    import gguf
    from gguf.quants import dequantize
    g = split_blobs(a.layers[0].layout, a.experts(0))["gate"]
    w = dequantize(g, gguf.GGMLQuantizationType.Q8_0)
    ref = _experts(m.state_dict(), 0)[0].float().numpy()
    assert np.abs(w - ref).max() <= np.abs(ref).max() / 127 + 1e-6


def test_hf_refusals(tmp_path):
    m, d = _tiny_hf(tmp_path)
    with pytest.raises(StrataError, match="Q4_K row"):
        hf_to_pack(d, tmp_path / "x.pack", quant="Q4_K", progress=False)   # D=64 < 256-blocks
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = "llama"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(StrataError, match="qwen3_moe"):
        hf_to_pack(d, tmp_path / "x.pack", progress=False)
    with pytest.raises(StrataError, match="config.json"):
        hf_to_pack(tmp_path, tmp_path / "x.pack", progress=False)
