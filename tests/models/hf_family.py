"""Tiny random GLM-4.5 and DeepSeek-V3 models built with transformers (no downloads): first-k
dense layers, a shared expert, grouped sigmoid routing with a correction bias and a routed
scale switched on; weights BF16-exact and scaled like a trained model (hf_tiny's recipe)."""
from __future__ import annotations

import torch

from strata.shapes import Attn, DenseFfn, Mla, ModelShape, Router

# 3 layers (the first dense), 16 experts in 4 groups (2 kept), top-4, one shared expert,
# GQA 4/2 with qkv bias, partial RoPE (half of hd 16), no q/k norm (GLM-4.5's use_qk_norm off).
GLM_TINY = ModelShape("glm4moe", n_layer=3, d_model=64, n_expert=16, top_k=4, d_expert=32,
                      n_head=4, n_kv_head=2, head_dim=16, vocab=256, rope_theta=10000.0,
                      dense=DenseFfn(1, 96, 1), router=Router("sigmoid", 4, 2, 2.5),
                      attn=Attn(qk_norm=False, bias=True, rope_dim=8))

# 3 layers (the first dense), 16 experts in 4 groups (2 kept), top-4, shared expert; MLA with
# q_lora 32, kv_lora 32, heads of 16 no-rope + 8 rope dims, values of 16.
DS_TINY = ModelShape("deepseek2", n_layer=3, d_model=64, n_expert=16, top_k=4, d_expert=32,
                     n_head=4, n_kv_head=4, head_dim=24, vocab=256, rope_theta=10000.0,
                     dense=DenseFfn(1, 96, 1), router=Router("sigmoid", 4, 2, 2.5),
                     mla=Mla(32, 32, 8, 16))


# DeepSeek-V3's own YaRN (config.json of the release: factor 40 over a 4096-token pretraining
# context, betas 32 / 1, mscale = mscale_all_dim = 1), with the original context shrunk to 32 so
# the correction ramp falls inside the tiny model's 8 rope dims (at 4096 every one of them would
# keep its original frequency) and the positions of a 17-token prompt turn the fast dims more
# than once.
DS_YARN = {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 32,
           "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}


def _config(shape: ModelShape, rope: dict | None = None):
    d, r = shape.dense, shape.router
    common = dict(
        vocab_size=shape.vocab, hidden_size=shape.d_model, intermediate_size=d.d_ff,
        moe_intermediate_size=shape.d_expert, num_hidden_layers=shape.n_layer,
        num_attention_heads=shape.n_head, num_key_value_heads=shape.n_kv_head,
        n_routed_experts=shape.n_expert, num_experts_per_tok=shape.top_k,
        n_shared_experts=d.shared, first_k_dense_replace=d.lead,
        n_group=r.n_group, topk_group=r.topk_group,
        routed_scaling_factor=r.scale, norm_topk_prob=shape.norm_topk_prob,
        rms_norm_eps=shape.rms_eps, max_position_embeddings=512, tie_word_embeddings=False)
    if shape.arch == "glm4moe":
        from transformers import Glm4MoeConfig
        return Glm4MoeConfig(head_dim=shape.head_dim, attention_bias=shape.attn.bias,
                             use_qk_norm=shape.attn.qk_norm,
                             rope_parameters={"rope_type": "default", "rope_theta": shape.rope_theta,
                                              "partial_rotary_factor":
                                                  shape.attn.rope_dim / shape.head_dim}, **common)
    from transformers import DeepseekV3Config
    m = shape.mla
    return DeepseekV3Config(q_lora_rank=m.q_lora or None, kv_lora_rank=m.kv_lora,
                            qk_nope_head_dim=shape.head_dim - m.qk_rope,
                            qk_rope_head_dim=m.qk_rope, v_head_dim=m.v_head_dim,
                            rope_interleave=True,
                            rope_parameters={"rope_type": "default", "rope_theta": shape.rope_theta,
                                             **(rope or {})},
                            **common)


def make_hf_family(shape: ModelShape, seed: int = 0, rope: dict | None = None):
    """A Glm4MoeForCausalLM / DeepseekV3ForCausalLM in fp32, weights exactly BF16. `rope`:
    DeepSeek's rope scaling parameters (DS_YARN), on top of plain RoPE at shape.rope_theta."""
    from transformers import DeepseekV3ForCausalLM, Glm4MoeForCausalLM
    cfg = _config(shape, rope)
    cfg._attn_implementation = "eager"
    cls = Glm4MoeForCausalLM if shape.arch == "glm4moe" else DeepseekV3ForCausalLM
    g = torch.Generator().manual_seed(seed)
    model = cls(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                w = 0.1 * torch.randn(p.shape, generator=g)
            elif p.ndim == 1:
                w = 1.0 + 0.1 * torch.randn(p.shape, generator=g)
            elif "embed_tokens" in name:
                w = torch.randn(p.shape, generator=g)
            else:
                w = torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5
                if name.endswith("mlp.gate.weight"):
                    w = w * 4.0
            p.copy_(w.to(torch.bfloat16).float())
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):   # steers the choice: make it matter
                b.copy_((0.3 * torch.randn(b.shape, generator=g)).to(torch.bfloat16).float())
    return model
