"""Tiny seeded random Mixtral and GPT-OSS models built with transformers (no downloads), and
GGUF files written from them with gguf-py in llama.cpp's layouts (convert_hf_to_gguf.py):
Mixtral as arch `llama` (q/k rows permuted for ggml's RoPE; experts 3-D `ffn_*_exps` or the
older per-expert 2-D `ffn_*.<e>.weight`), GPT-OSS as arch `gpt-oss` (gate/up de-interleaved,
expert biases `ffn_*_exps.bias`, `attn_sinks.weight`, `post_attention_norm`).

Weights are BF16-exact (a BF16 pack holds them losslessly) and scaled like a trained model
(≈ 1/sqrt(fan_in), a sharper router), as tests/models/hf_tiny.py does for Qwen3-MoE.
"""
from __future__ import annotations

import numpy as np
import torch

from strata.archs.mixtral import permute_rope
from strata.shapes import GptOssOptions, ModelShape, Window, Yarn
from tests.models.hf_tiny import quantize_roundtrip

# 2 layers, GQA 4/2, top-2 of 8, D 64, F 32, theta 1e6 (Mixtral's)
MIXTRAL_TINY = ModelShape("mixtral", n_layer=2, d_model=64, n_expert=8, top_k=2, d_expert=32,
                          n_head=4, n_kv_head=2, head_dim=16, vocab=256, rope_theta=1e6,
                          rms_eps=1e-5, max_pos=512)
# 3 layers (0 and 2 slide over a window of 5 tokens, 1 attends fully), top-2 of 8, D 96 and F 64
# (whole MXFP4 blocks, 2F != D), YaRN x32 over 4096 with GPT-OSS's truncate=false and theta;
# a SwiGLU limit of 2 (not 7) so that a good share of the pre-activations is clamped
GPT_OSS_TINY = ModelShape("gpt-oss", n_layer=3, d_model=96, n_expert=8, top_k=2, d_expert=64,
                          n_head=4, n_kv_head=2, head_dim=16, vocab=256, rope_theta=150000.0,
                          rms_eps=1e-5, max_pos=131072, opts=GptOssOptions(swiglu_limit=2.0),
                          window=Window(5), yarn=Yarn(32.0, 4096, truncate=False))


def _fill(model, seed: int, special) -> None:
    """Every parameter drawn and rounded to BF16; `special(name, p, g)` may draw it instead."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            w = special(name, p, g)
            if w is None:
                if p.ndim == 1:   # norm weights around 1
                    w = 1.0 + 0.1 * torch.randn(p.shape, generator=g)
                elif "embed_tokens" in name:
                    w = torch.randn(p.shape, generator=g)
                else:
                    w = torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5
            p.copy_(w.to(torch.bfloat16).float())


def make_mixtral(shape: ModelShape = MIXTRAL_TINY, seed: int = 0):
    from transformers import MixtralConfig, MixtralForCausalLM
    cfg = MixtralConfig(
        vocab_size=shape.vocab, hidden_size=shape.d_model, intermediate_size=shape.d_expert,
        num_hidden_layers=shape.n_layer, num_attention_heads=shape.n_head,
        num_key_value_heads=shape.n_kv_head, head_dim=shape.head_dim,
        num_local_experts=shape.n_expert, num_experts_per_tok=shape.top_k,
        rms_norm_eps=shape.rms_eps, max_position_embeddings=shape.max_pos,
        rope_parameters={"rope_type": "default", "rope_theta": shape.rope_theta},
        tie_word_embeddings=False, sliding_window=None)
    cfg._attn_implementation = "sdpa"
    model = MixtralForCausalLM(cfg).eval()

    def special(name, p, g):
        if name.endswith("mlp.gate.weight"):   # decisive routing, as a trained router
            return 4.0 * torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5
        if name.endswith("gate_up_proj") or name.endswith("down_proj"):   # [E, out, in]
            return torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5
        return None
    _fill(model, seed, special)
    return model


def make_gpt_oss(shape: ModelShape = GPT_OSS_TINY, seed: int = 0):
    from transformers import GptOssConfig, GptOssForCausalLM
    y = shape.yarn
    cfg = GptOssConfig(
        vocab_size=shape.vocab, hidden_size=shape.d_model, intermediate_size=shape.d_expert,
        num_hidden_layers=shape.n_layer, num_attention_heads=shape.n_head,
        num_key_value_heads=shape.n_kv_head, head_dim=shape.head_dim,
        num_local_experts=shape.n_expert, num_experts_per_tok=shape.top_k,
        rms_norm_eps=shape.rms_eps, max_position_embeddings=shape.max_pos,
        sliding_window=shape.window.size, swiglu_alpha=shape.opts.swiglu_alpha,
        swiglu_limit=shape.opts.swiglu_limit, tie_word_embeddings=False,
        rope_parameters={"rope_type": "yarn", "rope_theta": shape.rope_theta,
                         "factor": y.factor, "beta_fast": y.beta_fast,
                         "beta_slow": y.beta_slow, "truncate": y.truncate,
                         "original_max_position_embeddings": y.orig_ctx})
    cfg._attn_implementation = "eager"   # the sinks' path
    model = GptOssForCausalLM(cfg).eval()

    def special(name, p, g):
        if name.endswith("sinks"):              # O(1) sink logits: they take a visible share
            return torch.randn(p.shape, generator=g)
        if name.endswith("bias"):               # projection, router and expert biases
            return 0.3 * torch.randn(p.shape, generator=g)
        if name.endswith("router.weight"):
            return 4.0 * torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5
        if name.endswith("gate_up_proj"):       # [E, D, 2F]: fan-in D; a larger scale so the
            return 3.0 * torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5  # clamp acts
        if name.endswith("down_proj"):          # [E, F, D]: fan-in F
            return torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5
        return None
    _fill(model, seed, special)
    return model


def requantize_gpt_oss(model, fmt: str) -> None:
    """Replace every expert matrix by dequant(quant(w)) in `fmt` along its output rows, in
    place: HF then holds exactly what a GGUF of that type decodes to."""
    with torch.no_grad():
        for layer in model.model.layers:
            ex = layer.mlp.experts
            for e in range(ex.gate_up_proj.shape[0]):
                gu = ex.gate_up_proj[e]                                  # [D, 2F]
                for j in (0, 1):
                    gu[:, j::2] = quantize_roundtrip(gu[:, j::2].t().contiguous(), fmt).t()
                ex.down_proj[e] = quantize_roundtrip(ex.down_proj[e].t().contiguous(), fmt).t()


def state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach() for k, v in model.state_dict().items()}


def _writer(path, arch: str, shape: ModelShape, ffn_len: int):
    import gguf
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(shape.n_layer)
    w.add_context_length(shape.max_pos)
    w.add_embedding_length(shape.d_model)
    w.add_feed_forward_length(ffn_len)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_kv_head)
    w.add_key_length(shape.head_dim)
    w.add_value_length(shape.head_dim)
    w.add_rope_freq_base(shape.rope_theta)
    w.add_layer_norm_rms_eps(shape.rms_eps)
    w.add_expert_count(shape.n_expert)
    w.add_expert_used_count(shape.top_k)
    w.add_vocab_size(shape.vocab)
    return w


def _quant(t: torch.Tensor, fmt: str):
    import gguf
    q = gguf.GGMLQuantizationType[fmt]
    return gguf.quants.quantize(np.ascontiguousarray(t.float().numpy()), q), q


def _finish(w, path):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_mixtral_gguf(sd, shape: ModelShape, path, expert_fmt: str = "BF16",
                       per_expert: bool = False):
    """A llama-arch GGUF of a Mixtral state dict (in-memory names: mlp.experts.gate_up_proj
    [E, 2F, D], down_proj [E, D, F]); `per_expert`: the older 2-D ffn_*.<e>.weight tensors."""
    w = _writer(path, "llama", shape, shape.d_expert)
    w.add_rope_dimension_count(shape.head_dim)

    def f32(name, t):
        w.add_tensor(name, t.float().contiguous().numpy())
    f32("token_embd.weight", sd["model.embed_tokens.weight"])
    f32("output_norm.weight", sd["model.norm.weight"])
    f32("output.weight", sd["lm_head.weight"])
    F = shape.d_expert
    for l in range(shape.n_layer):
        p, b = f"model.layers.{l}.", f"blk.{l}."
        f32(b + "attn_norm.weight", sd[p + "input_layernorm.weight"])
        f32(b + "attn_q.weight", permute_rope(sd[p + "self_attn.q_proj.weight"], shape.n_head))
        f32(b + "attn_k.weight", permute_rope(sd[p + "self_attn.k_proj.weight"],
                                              shape.n_kv_head))
        f32(b + "attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        f32(b + "attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        f32(b + "ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        f32(b + "ffn_gate_inp.weight", sd[p + "mlp.gate.weight"])
        gu, dn = sd[p + "mlp.experts.gate_up_proj"], sd[p + "mlp.experts.down_proj"]
        for name, m in (("gate", gu[:, :F]), ("up", gu[:, F:]), ("down", dn)):
            if per_expert:
                for e in range(shape.n_expert):
                    q, qt = _quant(m[e], expert_fmt)
                    w.add_tensor(f"{b}ffn_{name}.{e}.weight", q, raw_dtype=qt)
            else:
                q, qt = _quant(m, expert_fmt)
                w.add_tensor(f"{b}ffn_{name}_exps.weight", q, raw_dtype=qt)
    return _finish(w, path)


def write_gpt_oss_gguf(sd, shape: ModelShape, path, expert_fmt: str = "BF16"):
    """A gpt-oss GGUF of a GptOss state dict, as convert_hf_to_gguf.py lays it out."""
    import gguf
    w = _writer(path, "gpt-oss", shape, shape.d_expert)
    w.add_expert_feed_forward_length(shape.d_expert)
    w.add_sliding_window(shape.window.size)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(shape.yarn.factor)
    w.add_rope_scaling_orig_ctx_len(shape.yarn.orig_ctx)
    if shape.opts.swiglu_limit != 7.0:   # llama.cpp's fixed limit otherwise (strata.archs.gpt_oss)
        w.add_swiglu_clamp_exp([shape.opts.swiglu_limit] * shape.n_layer)

    def f32(name, t):
        w.add_tensor(name, t.float().contiguous().numpy())
    f32("token_embd.weight", sd["model.embed_tokens.weight"])
    f32("output_norm.weight", sd["model.norm.weight"])
    f32("output.weight", sd["lm_head.weight"])
    for l in range(shape.n_layer):
        p, b = f"model.layers.{l}.", f"blk.{l}."
        f32(b + "attn_norm.weight", sd[p + "input_layernorm.weight"])
        f32(b + "post_attention_norm.weight", sd[p + "post_attention_layernorm.weight"])
        for g, h in (("q", "q"), ("k", "k"), ("v", "v"), ("output", "o")):
            for k in ("weight", "bias"):
                f32(f"{b}attn_{g}.{k}", sd[f"{p}self_attn.{h}_proj.{k}"])
        f32(b + "attn_sinks.weight", sd[p + "self_attn.sinks"])
        f32(b + "ffn_gate_inp.weight", sd[p + "mlp.router.weight"])
        f32(b + "ffn_gate_inp.bias", sd[p + "mlp.router.bias"])
        ex = p + "mlp.experts."
        gu, gub = sd[ex + "gate_up_proj"], sd[ex + "gate_up_proj_bias"]      # [E, D, 2F]
        mats = {"gate": gu[..., 0::2].transpose(1, 2), "up": gu[..., 1::2].transpose(1, 2),
                "down": sd[ex + "down_proj"].transpose(1, 2)}                   # [E, out, in]
        bias = {"gate": gub[:, 0::2], "up": gub[:, 1::2], "down": sd[ex + "down_proj_bias"]}
        for name in ("gate", "up", "down"):
            q, qt = _quant(mats[name].contiguous(), expert_fmt)
            w.add_tensor(f"{b}ffn_{name}_exps.weight", q, raw_dtype=qt)
            f32(f"{b}ffn_{name}_exps.bias", bias[name])
    return _finish(w, path)
