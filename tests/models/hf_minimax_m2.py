"""A tiny seeded random MiniMax-M2 built with transformers (no downloads), and a GGUF written from
it with gguf-py in llama.cpp's `minimax-m2` layout (convert_hf_to_gguf.py's MiniMaxM2Model:
experts stacked into 3-D `ffn_{gate,up,down}_exps`, the correction bias `exp_probs_b.bias`, q/k
norms `attn_{q,k}_norm` over the whole projection, nothing permuted).

Weights are BF16-exact and scaled like a trained model (hf_archs._fill: ≈ 1/sqrt(fan_in), a
sharper router); the correction bias (a buffer, not a parameter) is drawn at the sigmoid
scores' scale so that it moves some choices.
"""
from __future__ import annotations

import gguf
import torch

from strata.shapes import ModelShape, get_preset
from tests.models.hf_archs import _fill, _finish, _quant, _writer

# the tiny preset: 2 layers, GQA 4/2 of 16 with RoPE on 8 dims, top-2 of 8, D 64, F 32
MINIMAX_TINY = get_preset("tiny-minimax-m2")


def make_minimax_m2(shape: ModelShape = MINIMAX_TINY, seed: int = 0):
    from transformers import MiniMaxM2Config, MiniMaxM2ForCausalLM
    cfg = MiniMaxM2Config(
        vocab_size=shape.vocab, hidden_size=shape.d_model, intermediate_size=shape.d_expert,
        num_hidden_layers=shape.n_layer, num_attention_heads=shape.n_head,
        num_key_value_heads=shape.n_kv_head, head_dim=shape.head_dim,
        num_local_experts=shape.n_expert, num_experts_per_tok=shape.top_k,
        rms_norm_eps=shape.rms_eps, max_position_embeddings=shape.max_pos,
        rotary_dim=shape.rot_dim, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": shape.rope_theta,
                         "partial_rotary_factor": shape.rot_dim / shape.head_dim})
    cfg._attn_implementation = "sdpa"
    model = MiniMaxM2ForCausalLM(cfg).eval()

    def special(name, p, g):
        if name.endswith("mlp.gate.weight"):   # decisive routing, as a trained router
            return 4.0 * torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5
        if name.endswith("gate_up_proj") or name.endswith("down_proj"):   # [E, out, in]
            return torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5
        return None
    _fill(model, seed, special)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for layer in model.model.layers:
            b = layer.mlp.e_score_correction_bias
            b.copy_((0.1 * torch.randn(b.shape, generator=g)).to(torch.bfloat16).float())
    return model


def write_minimax_m2_gguf(sd, shape: ModelShape, path, expert_fmt: str = "BF16"):
    """A minimax-m2 GGUF of a MiniMaxM2 state dict (in-memory names: mlp.gate.weight,
    mlp.e_score_correction_bias, mlp.experts.gate_up_proj [E, 2F, D], down_proj [E, D, F])."""
    w = _writer(path, "minimax-m2", shape, shape.d_expert)
    w.add_expert_feed_forward_length(shape.d_expert)
    w.add_rope_dimension_count(shape.rot_dim)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)

    def f32(name, t):
        w.add_tensor(name, t.float().contiguous().numpy())
    f32("token_embd.weight", sd["model.embed_tokens.weight"])
    f32("output_norm.weight", sd["model.norm.weight"])
    f32("output.weight", sd["lm_head.weight"])
    F = shape.d_expert
    for l in range(shape.n_layer):
        p, b = f"model.layers.{l}.", f"blk.{l}."
        f32(b + "attn_norm.weight", sd[p + "input_layernorm.weight"])
        for g, h in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("output", "o_proj"),
                     ("q_norm", "q_norm"), ("k_norm", "k_norm")):
            f32(f"{b}attn_{g}.weight", sd[f"{p}self_attn.{h}.weight"])
        f32(b + "ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        f32(b + "ffn_gate_inp.weight", sd[p + "mlp.gate.weight"])
        f32(b + "exp_probs_b.bias", sd[p + "mlp.e_score_correction_bias"])
        gu, dn = sd[p + "mlp.experts.gate_up_proj"], sd[p + "mlp.experts.down_proj"]
        for name, m in (("gate", gu[:, :F]), ("up", gu[:, F:]), ("down", dn)):
            q, qt = _quant(m, expert_fmt)
            w.add_tensor(f"{b}ffn_{name}_exps.weight", q, raw_dtype=qt)
    return _finish(w, path)
