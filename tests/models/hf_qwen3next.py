"""Tiny seeded random Qwen3-Next and text-only Qwen3.5-MoE models built with transformers (no
downloads), scaled like trained ones.

Weights are BF16-exact (hf_archs._fill). The zero-centred RMSNorm weights (HF applies 1 + w)
are drawn around 0, the DeltaNet output norm (a plain weight) around 1, A_log as transformers
initialises it (log of U(1, 16)), dt_bias around 1, the conv sharper than 1/sqrt(K) so that the
carried conv state matters; the router is sharper, as a trained one.
"""
from __future__ import annotations

import torch

from strata.shapes import ModelShape, get_preset
from tests.models.hf_archs import _fill

QWEN3NEXT_TINY = get_preset("tiny-qwen3next")
QWEN35MOE_TINY = get_preset("tiny-qwen35moe")


def config_kwargs(shape: ModelShape) -> dict:
    lin = shape.linear
    kinds = [("linear_attention" if shape.layer_kind(l) == "linear" else "full_attention")
             for l in range(shape.n_layer)]
    return dict(
        vocab_size=shape.vocab, hidden_size=shape.d_model, num_hidden_layers=shape.n_layer,
        num_attention_heads=shape.n_head, num_key_value_heads=shape.n_kv_head,
        head_dim=shape.head_dim, num_experts=shape.n_expert, num_experts_per_tok=shape.top_k,
        moe_intermediate_size=shape.d_expert,
        shared_expert_intermediate_size=shape.n_shared * shape.d_expert,
        rms_norm_eps=shape.rms_eps, max_position_embeddings=shape.max_pos,
        linear_conv_kernel_dim=lin.conv_kernel, linear_num_key_heads=lin.n_k_head,
        linear_num_value_heads=lin.n_v_head, linear_key_head_dim=lin.k_head_dim,
        linear_value_head_dim=lin.v_head_dim, layer_types=kinds, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": shape.rope_theta,
                         "partial_rotary_factor": shape.rot_dim / shape.head_dim})


def _special(name, p, g):
    if name.endswith("layernorm.weight") or name.endswith("q_norm.weight") \
            or name.endswith("k_norm.weight") or name == "model.norm.weight":
        return 0.1 * torch.randn(p.shape, generator=g)        # HF multiplies by 1 + w
    if name.endswith("A_log"):
        return torch.empty(p.shape).uniform_(1, 16, generator=g).log()
    if name.endswith("dt_bias"):
        return 1.0 + 0.3 * torch.randn(p.shape, generator=g)
    if name.endswith("conv1d.weight"):
        return 2.0 * torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5
    if name.endswith("mlp.gate.weight"):
        return 4.0 * torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5
    return None


def make_hybrid(shape: ModelShape, seed: int = 0):
    """The tiny random transformers model of `shape` (qwen3next or qwen35moe), fp32, eval."""
    if shape.arch == "qwen3next":
        from transformers import Qwen3NextConfig as Config, Qwen3NextForCausalLM as Model
        extra = dict(norm_topk_prob=shape.norm_topk_prob)
    else:
        from transformers import Qwen3_5MoeForCausalLM as Model, Qwen3_5MoeTextConfig as Config
        extra = {}
    cfg = Config(**config_kwargs(shape), **extra)
    cfg._attn_implementation = "sdpa"
    model = Model(cfg).eval()
    _fill(model, seed, _special)
    return model
