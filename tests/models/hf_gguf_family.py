"""Write a tiny HF GLM-4.5 / DeepSeek-V3 checkpoint as llama.cpp's `glm4moe` / `deepseek2` GGUF
(gguf-py's writer; the keys and tensor names convert_hf_to_gguf.py writes): leading dense
layers' ffn_{gate,up,down}, shared experts' *_shexp, the correction bias exp_probs_b.bias,
routed experts stacked per layer; deepseek2 in the newer MLA layout (head_count_kv 1,
key/value_length_mla, attn_kv_b split into attn_k_b / attn_v_b) or the older one (kv_b kept)."""
from __future__ import annotations

import numpy as np
import torch

from strata.archs.family_hf import _DENSE
from strata.archs.names import dense_specs
from strata.shapes import Mla, ModelShape


def write_family_gguf(sd: dict[str, torch.Tensor], shape: ModelShape, path,
                      expert_fmt: str = "BF16", split_kv_b: bool = True,
                      rope: dict | None = None):
    """`rope`: a DeepSeek rope scaling dict (hf_family.DS_YARN), written as llama.cpp's
    converter writes it (conversion/base.py and deepseek.py): type, factor, original context,
    the betas, and yarn_log_multiplier = 0.1 mscale_all_dim."""
    import gguf
    a = shape.arch
    w = gguf.GGUFWriter(str(path), a)
    if rope:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        w.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
        w.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
        w.add_rope_scaling_yarn_log_mul(0.1 * rope["mscale_all_dim"])
    w.add_block_count(shape.n_layer)
    w.add_context_length(shape.max_pos)
    w.add_embedding_length(shape.d_model)
    w.add_feed_forward_length(shape.dense.d_ff)
    w.add_head_count(shape.n_head)
    w.add_rope_freq_base(shape.rope_theta)
    w.add_layer_norm_rms_eps(shape.rms_eps)
    w.add_expert_count(shape.n_expert)
    w.add_expert_used_count(shape.top_k)
    w.add_expert_feed_forward_length(shape.d_expert)
    w.add_expert_shared_count(shape.dense.shared)
    w.add_leading_dense_block_count(shape.dense.lead)
    w.add_expert_weights_scale(shape.router.scale)
    w.add_expert_weights_norm(shape.norm_topk_prob)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_expert_group_count(shape.router.n_group)
    w.add_expert_group_used_count(shape.router.topk_group)
    w.add_vocab_size(shape.vocab)
    w.add_rope_dimension_count(shape.rot_dim)
    if a == "glm4moe":
        w.add_head_count_kv(shape.n_kv_head)
        w.add_key_length(shape.head_dim)
        w.add_value_length(shape.head_dim)
        w.add_nextn_predict_layers(0)
    else:
        m = shape.mla
        w.add_q_lora_rank(m.q_lora)
        w.add_kv_lora_rank(m.kv_lora)
        if split_kv_b:
            w.add_head_count_kv(1)
            w.add_key_length(m.kv_lora + m.qk_rope)
            w.add_value_length(m.kv_lora)
            w.add_key_length_mla(shape.head_dim)
            w.add_value_length_mla(m.v_head_dim)
        else:
            w.add_head_count_kv(shape.n_head)
            w.add_key_length(shape.head_dim)
            w.add_value_length(m.v_head_dim)

    def f32(name, t):
        w.add_tensor(name, t.float().contiguous().numpy())

    f32("token_embd.weight", sd["model.embed_tokens.weight"])
    f32("output_norm.weight", sd["model.norm.weight"])
    f32("output.weight", sd["lm_head.weight"])
    qtype = gguf.GGMLQuantizationType[expert_fmt]
    m = shape.mla or Mla()   # GLM: no MLA (its sizes unused)
    H, R, L = shape.n_head, m.qk_rope, m.kv_lora
    N, Hv = shape.head_dim - R, m.v_head_dim
    for l in range(shape.n_layer):
        pre = f"model.layers.{l}."
        for name in dense_specs(shape):
            if not name.startswith(f"blk.{l}."):
                continue
            rest = name.split(".", 2)[2]
            t = sd[pre + _DENSE[rest]]
            if rest == "attn_kv_b.weight" and split_kv_b:
                kv = t.view(H, N + Hv, L)
                f32(f"blk.{l}.attn_k_b.weight", kv[:, :N].transpose(1, 2))   # [H, Lkv, N]
                f32(f"blk.{l}.attn_v_b.weight", kv[:, N:])                   # [H, Hv, Lkv]
                continue
            f32(name, t)
        if not shape.is_moe_layer(l):
            continue
        for hf, gg in (("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"),
                       ("down_proj", "ffn_down_exps")):
            stack = torch.stack([sd[f"{pre}mlp.experts.{e}.{hf}.weight"]
                                 for e in range(shape.n_expert)]).float().numpy()
            q = gguf.quants.quantize(np.ascontiguousarray(stack), qtype)
            w.add_tensor(f"blk.{l}.{gg}.weight", q, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
