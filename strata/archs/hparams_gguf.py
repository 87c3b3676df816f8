"""The GGUF half of the hparam tables (audited by strata.packs.hparams): per architecture
every key llama.cpp's loader reads (and its converter writes), and what strata does with it."""
from __future__ import annotations

from strata.archs.hparam_kinds import NONZERO, Hp, SameAs, Where, _head_dim, inert, refused, used

# ---- GGUF: what llama.cpp's load_hparams reads for every architecture ------------------------
# (each architecture's table below is held by its record, strata.archs.registry, under the
# GGUF general.architecture names it answers to)
_GGUF_COMMON: dict[str, Hp] = {
    "context_length": inert("bounds the positions a prompt may use (ModelShape.max_pos)",
                            "max_pos"),
    "embedding_length": used("d_model"),
    "embedding_length_out": refused(SameAs("embedding_length"),
                                    "an output width other than the hidden size is an embedding "
                                    "model's projection; strata reads a causal LM's logits"),
    "attention.causal": refused((True,), "strata's attention is causal"),
    "pooling_type": refused((0,), "a pooled model is an embedding model; strata reads a causal "
                                  "LM's logits"),
    "classifier.pooling_type": refused((-1,), "a classifier head; strata reads the LM head"),
    "classifier.output_labels": refused((), "a classifier head; strata reads the LM head",
                                        array=True),
    "block_count": used("n_layer"),
    "nextn_predict_layers": refused((0,), "NextN/MTP layers at the end of the stack; strata's "
                                          "reader for this architecture would run them as "
                                          "ordinary layers"),
    "expert_count": used("n_expert"),
    "expert_used_count": used("top_k"),
    "expert_group_count": refused((0, 1), "grouped expert selection (llama.cpp's build_moe_ffn "
                                          "applies it to any architecture); strata groups only "
                                          "the sigmoid router of DeepSeek / GLM-4.5"),
    "expert_group_used_count": refused((0, 1), "grouped expert selection (see expert_group_count)"),
    "expert_gating_func": refused((1,), "strata routes this architecture with softmax (as "
                                        "llama.cpp's graph does, whatever the key says)"),
    "feed_forward_length": inert("the dense FFN's width; this architecture has no dense FFN "
                                 "layer (every layer routes to experts)"),
    "attention.head_count": used("n_head"),
    "attention.head_count_kv": used("n_kv_head"),
    "rope.scaling.finetuned": inert("llama.cpp records it; no forward reads it"),
    "rope.scaling.original_context_length": inert(
        "read only by YaRN, which strata refuses for this architecture (rope.scaling.type)"),
    "rope.freq_base": used("rope_theta"),
    "rope.scaling.type": refused(("none", "linear"), "strata runs plain RoPE for this "
                                                     "architecture (linear only with factor 1)"),
    "rope.scaling.factor": refused((0.0, 1.0), "llama.cpp scales the positions by 1/factor "
                                               "(linear, the default type); strata does not"),
    "rope.scale_linear": refused((0.0, 1.0), "the old name of the linear factor; strata does "
                                             "not scale positions"),
    "rope.scaling.attn_factor": refused((1.0,), "it multiplies the rotary attention factor; "
                                                "strata's is 1"),
    "rope.scaling.alpha": inert("NTK alpha; no graph of this architecture reads it"),
    "attention.key_length": used("head_dim"),
    "attention.value_length": refused(SameAs("attention.key_length", _head_dim),
                                      "strata's attention has values as wide as keys"),
    "rope.dimension_count": refused(SameAs("attention.key_length", _head_dim),
                                    "strata rotates the whole head (partial RoPE: only GLM-4.5 "
                                    "and the MLA rope key)"),
    "attention.key_length_swa": refused(SameAs("attention.key_length", _head_dim),
                                        "sliding layers with their own head size"),
    "attention.value_length_swa": refused(SameAs("attention.key_length", _head_dim),
                                          "sliding layers with their own head size"),
    "rope.dimension_count_swa": refused(SameAs("attention.key_length", _head_dim),
                                        "sliding layers with their own rotary width"),
    "attention.layer_norm_rms_epsilon": used("rms_eps"),
    # written by convert_hf_to_gguf.py for some configs; no loader of these architectures reads
    "vocab_size": inert("the vocabulary is token_embd's rows; llama.cpp reads this only to "
                        "label the model's size"),
    "attention.layer_norm_epsilon": inert("LayerNorm's epsilon; these models norm with "
                                          "RMSNorm (attention.layer_norm_rms_epsilon)"),
    "rope.scaling.yarn_beta_fast": inert("read only by YaRN, which strata refuses for this "
                                         "architecture (rope.scaling.type)"),
    "rope.scaling.yarn_beta_slow": inert("read only by YaRN, which strata refuses for this "
                                         "architecture (rope.scaling.type)"),
    "rope.scaling.yarn_ext_factor": refused((1.0,), "YaRN's extrapolation mix; strata's is 1"),
    "rope.scaling.yarn_attn_factor": refused((), "an explicit YaRN attention factor; strata "
                                                 "derives it from the factor"),
}

_YARN_GGUF = {  # a model family whose YaRN strata reads: the rope.scaling.* keys it uses
    "rope.scaling.type": used("yarn", ok=("none", "yarn"), default="none"),
    "rope.scaling.factor": used("yarn.factor"),
    "rope.scaling.original_context_length": used("yarn.orig_ctx"),
    "rope.scaling.yarn_beta_fast": used("yarn.beta_fast", default=32.0),
    "rope.scaling.yarn_beta_slow": used("yarn.beta_slow", default=1.0),
}

_FAMILY = {  # DeepSeek / GLM-4.5 (strata.archs.family_gguf)
    "nextn_predict_layers": used("n_layer", default=0),
    "expert_group_count": used("router.n_group", default=0),
    "expert_group_used_count": used("router.topk_group", default=0),
    "feed_forward_length": used("dense.d_ff"),
    "leading_dense_block_count": used("dense.lead", default=0),
    "expert_feed_forward_length": used("d_expert"),
    "expert_shared_count": used("dense.shared"),
    "expert_weights_scale": used("router.scale", ok=NONZERO, default=1.0,
                                 why="llama.cpp reads 0 as no scale, strata's reader would "
                                     "scale the routed experts by 0"),
    "expert_weights_norm": used("norm_topk_prob", missing=(
        "llama.cpp reads its absence as false (no top-k renormalisation), strata's reader as "
        "true; write it with gguf-py's gguf_new_metadata.py or re-convert the model")),
    "expert_gating_func": refused((2,), "strata routes this family with the sigmoid gate (2)"),
}

QWEN3MOE: dict[str, Hp] = _GGUF_COMMON | {
    "expert_feed_forward_length": used("d_expert"),
    "expert_shared_feed_forward_length": refused(
        (0,), "shared experts; strata's qwen3moe has none"),
}

# Mixtral: llama.cpp arch `llama` with experts (strata.archs.mixtral)
LLAMA: dict[str, Hp] = _GGUF_COMMON | {
    "feed_forward_length": used("d_expert"),
    "expert_feed_forward_length": used("d_expert"),
    "rope.dimension_count": refused(SameAs("attention.key_length", _head_dim),
                                    "llama.cpp refuses a llama model whose rotary width is "
                                    "not its head size"),
}

GPT_OSS: dict[str, Hp] = _GGUF_COMMON | _YARN_GGUF | {
    "expert_feed_forward_length": used("d_expert"),
    "attention.sliding_window": used("window.size", missing=(
        "llama.cpp requires it for gpt-oss (the sliding layers' window); re-convert the "
        "model")),
    "attention.sliding_window_pattern": used("window.pattern", default=2, array=True),
    "rope.freq_base_swa": refused(SameAs("rope.freq_base"),
                                  "strata's sliding layers rotate with rope.freq_base"),
    "swiglu_clamp_exp": used("opts.swiglu_limit", array=True),
    "expert_gating_func": refused((3,), "gpt-oss routes top-k, then a softmax over the "
                                        "chosen (llama.cpp's SOFTMAX_WEIGHT)"),
}

DEEPSEEK2: dict[str, Hp] = _GGUF_COMMON | _FAMILY | _YARN_GGUF | {
    "expert_gating_func": refused((2,), "strata routes DeepSeek with the sigmoid gate (2)",
                                  missing=(
        "llama.cpp reads its absence as softmax (DeepSeek-V2's router), strata routes this "
        "family with the sigmoid gate (2); write it or re-convert the model")),
    "attention.head_count_kv": inert("MLA's layout marker (1: attn_k_b / attn_v_b, H: "
                                     "attn_kv_b); strata's n_kv_head is head_count"),
    "attention.key_length": used("head_dim"),   # the older MLA layout (no key_length_mla)
    "attention.value_length": used("mla.v_head_dim"),
    "attention.key_length_mla": used("head_dim"),
    "attention.value_length_mla": used("mla.v_head_dim"),
    "attention.q_lora_rank": used("mla.q_lora", default=0),
    "attention.kv_lora_rank": used("mla.kv_lora"),
    "rope.dimension_count": used("mla.qk_rope"),
    # DeepSeek's YaRN (strata.archs.family_gguf.gguf_yarn_ds): the softmax scale's mscale
    "rope.scaling.type": used("yarn", ok=("none", "linear", "yarn"), default="none"),
    "rope.scaling.yarn_log_multiplier": used("yarn.kq"),
    "rope.scaling.attn_factor": used("yarn.attn", "yarn.kq", default=1.0),
    "attention.temperature_scale": refused((0.0,), "Llama-4 style attention temperature "
                                                   "(Mistral-Large 3)"),
    "attention.temperature_length": inert("read only with attention.temperature_scale "
                                          "(refused unless 0)"),
}

GLM4MOE: dict[str, Hp] = _GGUF_COMMON | _FAMILY | {
    "nextn_predict_layers": used("n_layer", default=0),
    "rope.dimension_count": used("attn.rope_dim"),
    "rope.dimension_sections": refused(Where(lambda v: not any(v), "absent or all 0"),
                                       "multi-axis RoPE sections (a vision model's)",
                                       array=True),
}

# MiniMax-M2 (strata.archs.minimax_m2): llama.cpp's minimax-m2 loader reads
# expert_feed_forward_length and expert_gating_func; its expert tensors are sized by
# feed_forward_length (n_ff), so a file it loads has the two widths equal
MINIMAX_M2: dict[str, Hp] = _GGUF_COMMON | {
    "expert_feed_forward_length": used("d_expert"),
    "feed_forward_length": refused(SameAs("expert_feed_forward_length"),
                                   "llama.cpp's minimax-m2 sizes its expert tensors by "
                                   "feed_forward_length, strata by expert_feed_forward_length"),
    "expert_gating_func": refused((2,), "strata routes MiniMax-M2 with the sigmoid gate (2)",
                                  missing=(
        "llama.cpp's minimax-m2 graph has no gating function without it and stops, strata "
        "routes with the sigmoid gate (2); re-convert the model from a config.json with "
        "scoring_func sigmoid")),
    "rope.dimension_count": used("attn.rope_dim"),
}

# Qwen3-Next / Qwen3.5-MoE (strata.archs.qwen3next, qwen35moe): llama.cpp's hybrid loaders read
# the shared expert's width, the Gated DeltaNet's ssm.* sizes and which layers are recurrent
# (attention.recurrent_layers, else every layer but each full_attention_interval-th)
QWEN3NEXT: dict[str, Hp] = _GGUF_COMMON | {
    "expert_feed_forward_length": used("d_expert"),
    "expert_shared_feed_forward_length": used("dense.shared", why="dense.shared = its width / "
                                                                   "expert_feed_forward_length"),
    "feed_forward_length": inert("the dense MLP's width; every layer routes to experts"),
    "rope.dimension_count": used("attn.rope_dim"),
    "ssm.conv_kernel": used("linear.conv_kernel"),
    "ssm.state_size": used("linear.k_head_dim"),
    "ssm.group_count": used("linear.n_k_head"),
    "ssm.time_step_rank": used("linear.n_v_head"),
    "ssm.inner_size": used("linear.v_head_dim", why="v_head_dim = inner_size / "
                                                     "time_step_rank"),
    "attention.recurrent_layers": used("linear.layer_types", array=True),
    "full_attention_interval": used("linear.full_interval", default=4),
}
QWEN35MOE: dict[str, Hp] = QWEN3NEXT | {
    "rope.dimension_sections": inert("interleaved MRoPE's sections: over text every axis holds "
                                     "the token's position, so transformers turns plain partial "
                                     "RoPE whatever the sections (llama.cpp turns a pair its "
                                     "sections leave out by position 0)", array=True),
}

GGUF_GLOBAL: dict[str, Hp] = {
    "general.architecture": used("arch"),
    "general.type": refused(("model",), "an adapter (LoRA) or other file kind, not a model"),
    "general.name": inert("a name"),
    "general.file_type": inert("a label; each tensor's own type is read and checked"),
    "general.quantization_version": inert("the ggml block layouts; each expert tensor's bytes "
                                          "are checked against its type's size"),
    "general.alignment": inert("where the tensor data starts; gguf-py's reader applies it"),
    "general.tensor_extra.name": inert("llama.cpp's activation-precision hint; strata computes "
                                       "activations in bf16/fp32", array=True),
    "general.tensor_extra.prec_a4": inert("see general.tensor_extra.name", array=True),
    "split.count": refused((0, 1), "strata reads one GGUF file; merge the shards with "
                                   "llama-gguf-split --merge"),
    "split.no": inert("the shard's index (split.count is refused above 1)"),
    "split.tensors.count": inert("the shards' tensor count (split.count is refused above 1)"),
}
GLOBAL_PREFIXES = ("general.", "split.")   # other general.* keys: descriptive (author, license)
