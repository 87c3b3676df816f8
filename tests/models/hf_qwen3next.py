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
        shared_expert_intermediate_size=shape.dense.shared * shape.d_expert,
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


def tiled(x: torch.Tensor, dim: int, h_k: int, r: int, width: int) -> torch.Tensor:
    """The value heads of `x` along `dim` (`width` each) from HF's grouped order to llama.cpp's
    tiled one (conversion/qwen.py _LinearAttentionVReorderBase._reorder_v_heads)."""
    shape = list(x.shape)
    t = x.reshape(*shape[:dim], h_k, r, width, *shape[dim + 1:])
    return t.transpose(dim, dim + 1).reshape(shape)


def write_hybrid_gguf(sd, shape: ModelShape, path, expert_fmt: str = "F32"):
    """A qwen3next / qwen35moe GGUF of a transformers state dict, as llama.cpp's converter writes
    it (conversion/qwen.py Qwen3NextModel, Qwen3_5MoeTextModel): norms + 1 but the DeltaNet's
    output norm, ssm_a = -exp(A_log), in_proj_qkvz split into attn_qkv / attn_gate, the conv
    squeezed, Qwen3.5's value heads tiled, the experts stacked into 3-D ffn_*_exps."""
    from tests.models.hf_archs import _finish, _quant, _writer
    arch, lin = shape.arch, shape.linear
    Hk, Hv, dk, dv = lin.n_k_head, lin.n_v_head, lin.k_head_dim, lin.v_head_dim
    r, F, D = Hv // Hk, shape.d_expert, shape.d_model
    w = _writer(path, arch, shape, 4 * D)
    for k, v in (("expert_feed_forward_length", F),
                 ("expert_shared_feed_forward_length", shape.dense.shared * F),
                 ("rope.dimension_count", shape.rot_dim), ("ssm.conv_kernel", lin.conv_kernel),
                 ("ssm.state_size", dk), ("ssm.group_count", Hk), ("ssm.time_step_rank", Hv),
                 ("ssm.inner_size", Hv * dv), ("full_attention_interval", lin.full_interval)):
        w.add_uint32(f"{arch}.{k}", v)
    w.add_array(f"{arch}.attention.recurrent_layers",
                [shape.layer_kind(l) == "linear" for l in range(shape.n_layer)])
    if arch == "qwen35moe":
        t = shape.rot_dim // 2
        w.add_array(f"{arch}.rope.dimension_sections", [(t + 2) // 3, (t + 1) // 3, t // 3, 0])

    def f32(name, t):
        w.add_tensor(name, t.float().contiguous().numpy())

    def tile(t, dim=0, width=dv):
        return tiled(t, dim, Hk, r, width) if arch == "qwen35moe" else t
    f32("token_embd.weight", sd["model.embed_tokens.weight"])
    f32("output_norm.weight", sd["model.norm.weight"] + 1)
    f32("output.weight", sd["lm_head.weight"])
    for l in range(shape.n_layer):
        p, b = f"model.layers.{l}.", f"blk.{l}."
        f32(b + "attn_norm.weight", sd[p + "input_layernorm.weight"] + 1)
        f32(b + "post_attention_norm.weight", sd[p + "post_attention_layernorm.weight"] + 1)
        if shape.layer_kind(l) == "linear":
            a = p + "linear_attn."
            if arch == "qwen3next":
                g = sd[a + "in_proj_qkvz.weight"].view(Hk, 2 * dk + 2 * r * dv, D)
                q, k, v, z = torch.split(g, [dk, dk, r * dv, r * dv], dim=1)
                qkv = torch.cat([x.reshape(-1, D) for x in (q, k, v)])
                f32(b + "attn_qkv.weight", qkv)
                f32(b + "attn_gate.weight", z.reshape(-1, D))
                f32(b + "ssm_ba.weight", sd[a + "in_proj_ba.weight"])
            else:
                qkv = sd[a + "in_proj_qkv.weight"]
                f32(b + "attn_qkv.weight", torch.cat([qkv[:2 * Hk * dk], tile(qkv[2 * Hk * dk:])]))
                f32(b + "attn_gate.weight", tile(sd[a + "in_proj_z.weight"]))
                f32(b + "ssm_beta.weight", tile(sd[a + "in_proj_b.weight"], width=1))
                f32(b + "ssm_alpha.weight", tile(sd[a + "in_proj_a.weight"], width=1))
            conv = sd[a + "conv1d.weight"].squeeze(1)
            f32(b + "ssm_conv1d.weight", torch.cat([conv[:2 * Hk * dk], tile(conv[2 * Hk * dk:])]))
            f32(b + "ssm_dt.bias", tile(sd[a + "dt_bias"], width=1))
            f32(b + "ssm_a", tile(-sd[a + "A_log"].float().exp(), width=1))
            f32(b + "ssm_norm.weight", sd[a + "norm.weight"])
            f32(b + "ssm_out.weight", tile(sd[a + "out_proj.weight"], dim=1))
        else:
            for g, h in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("output", "o_proj")):
                f32(f"{b}attn_{g}.weight", sd[f"{p}self_attn.{h}.weight"])
            f32(b + "attn_q_norm.weight", sd[p + "self_attn.q_norm.weight"] + 1)
            f32(b + "attn_k_norm.weight", sd[p + "self_attn.k_norm.weight"] + 1)
        f32(b + "ffn_gate_inp.weight", sd[p + "mlp.gate.weight"])
        f32(b + "ffn_gate_inp_shexp.weight", sd[p + "mlp.shared_expert_gate.weight"])
        for n in ("gate", "up", "down"):
            f32(f"{b}ffn_{n}_shexp.weight", sd[f"{p}mlp.shared_expert.{n}_proj.weight"])
        gu, dn = sd[p + "mlp.experts.gate_up_proj"], sd[p + "mlp.experts.down_proj"]
        for name, m in (("gate", gu[:, :F]), ("up", gu[:, F:]), ("down", dn)):
            q, qt = _quant(m, expert_fmt)
            w.add_tensor(f"{b}ffn_{name}_exps.weight", q, raw_dtype=qt)
    return _finish(w, path)
