"""The Hugging Face half of the hparam tables (strata.packs.hparams): per model_type every
config.json field transformers' model reads, and what strata does with it."""
from __future__ import annotations

from dataclasses import replace

from strata.archs.hparam_kinds import (NO_DEFAULT, ROPE, TOKENIZER, Hp, SameAs, Where, inert,
                                       refused, used)

# ---- Hugging Face config.json ---------------------------------------------------------------
_HF_COMMON: dict[str, Hp] = {
    "model_type": used("arch"),
    "architectures": inert("the class names; model_type picks strata's reader"),
    "transformers_version": inert("the writer's version"),
    "_name_or_path": inert("a path"),
    "dtype": inert("the checkpoint's dtype; strata reads each tensor as stored"),
    "torch_dtype": inert("the old name of dtype"),
    "output_hidden_states": inert("what HF returns, not what it computes"),
    "output_attentions": inert("what HF returns, not what it computes"),
    "return_dict": inert("what HF returns, not what it computes"),
    "use_cache": inert("HF's KV cache between calls; a prefill's logits do not depend on it"),
    "chunk_size_feed_forward": inert("splits a feed-forward into chunks; the same values"),
    "is_encoder_decoder": refused((False,), "strata reads decoder-only models"),
    "id2label": inert("a classifier head's label names"),
    "label2id": inert("a classifier head's label names"),
    "problem_type": inert("a classifier head's loss"),
    "initializer_range": inert("the random init of training"),
    "attention_dropout": inert("dropout, off in inference"),
    "output_router_logits": inert("what HF returns (the aux loss's input)"),
    "router_aux_loss_coef": inert("the training loss's balance term"),
    "pad_token_id": inert(TOKENIZER),
    "bos_token_id": inert(TOKENIZER),
    "eos_token_id": inert(TOKENIZER),
    "tie_word_embeddings": inert("the LM head is what the checkpoint holds: lm_head.weight, or "
                                 "the embeddings when it has none (save_pretrained omits a tied "
                                 "head)"),
    "max_position_embeddings": inert("bounds the positions a prompt may use (ModelShape."
                                     "max_pos); YaRN's factor is read from the RoPE dict",
                                     "max_pos"),
    "hidden_act": refused(("silu",), "strata's experts and dense FFNs are SiLU-gated"),
    "quantization_config": refused((), "strata packs unquantized safetensors (bf16 / fp16 / "
                                       "fp32); dequantize the checkpoint or pack a GGUF of it"),
    "auto_map": inert("names remote code; strata implements the architecture itself"),
    "vocab_size": used("vocab"),
    "hidden_size": used("d_model"),
    "num_hidden_layers": used("n_layer"),
    "num_attention_heads": used("n_head"),
    "num_key_value_heads": used("n_kv_head"),
    "head_dim": used("head_dim"),
    "rms_norm_eps": used("rms_eps"),
    "num_experts_per_tok": used("top_k"),
    "rope_theta": used("rope_theta"),
    "partial_rotary_factor": refused((1.0,), "strata rotates the whole head for this "
                                             "architecture"),
    ROPE + "rope_type": refused(("default",), "strata runs plain RoPE for this architecture"),
    ROPE + "type": refused(("default",), "strata runs plain RoPE for this architecture"),
    ROPE + "rope_theta": used("rope_theta"),
    ROPE + "partial_rotary_factor": refused((1.0,), "strata rotates the whole head for this "
                                                    "architecture"),
}

_HF_YARN = {  # the RoPE dict of a family whose YaRN strata reads
    ROPE + "rope_type": used("yarn", ok=("default", "yarn"), default="default"),
    ROPE + "type": used("yarn", ok=("default", "yarn"), default="default"),
    ROPE + "factor": used("yarn.factor"),
    ROPE + "original_max_position_embeddings": used("yarn.orig_ctx"),
    ROPE + "beta_fast": used("yarn.beta_fast", default=32.0),
    ROPE + "beta_slow": used("yarn.beta_slow", default=1.0),
    ROPE + "attention_factor": refused((), "an explicit YaRN attention factor; strata derives "
                                           "it from the factor"),
}

_HF_FAMILY = {  # GLM-4.5, DeepSeek-V3 (strata.archs.family_hf)
    "intermediate_size": used("dense.d_ff"),
    "moe_intermediate_size": used("d_expert"),
    "n_routed_experts": used("n_expert"),
    "num_local_experts": used("n_expert"),
    "n_shared_experts": used("dense.shared"),
    "routed_scaling_factor": used("router.scale", default=1.0),
    "n_group": used("router.n_group", default=1),
    "topk_group": used("router.topk_group", default=1),
    "first_k_dense_replace": used("dense.lead"),
    "norm_topk_prob": used("norm_topk_prob", default=True),
    "num_nextn_predict_layers": inert("MTP layers: HF's model does not run them, strata does "
                                      "not read them"),
    "num_mtp_layers": inert("the new name of num_nextn_predict_layers"),
}


_ALIAS_EXPERTS = refused(SameAs("num_local_experts"), "transformers' alias of "
                                                     "num_local_experts, which strata reads")


def _hf_missing(field: str, hf: str, strata: str) -> str:
    return (f"transformers reads its absence as {hf}, strata's reader as {strata}; write "
            f"{field} into config.json")


QWEN3_MOE: dict[str, Hp] = _HF_COMMON | {
    "intermediate_size": inert("the dense MLP's width; every layer routes to experts "
                               "(mlp_only_layers / decoder_sparse_step are refused)"),
    "moe_intermediate_size": used("d_expert"),
    "num_experts": used("n_expert"),
    "num_local_experts": used("n_expert"),
    "norm_topk_prob": used("norm_topk_prob", default=False),
    "attention_bias": refused((False,), "q/k/v/o biases; strata's qwen3moe has none"),
    "use_sliding_window": refused((False,), "sliding-window attention; strata's qwen3moe "
                                            "attends fully"),
    "sliding_window": inert("read only with use_sliding_window (refused unless false)"),
    "max_window_layers": inert("read only with use_sliding_window (refused unless false)"),
    "decoder_sparse_step": refused((1,), "dense MLP layers between the MoE ones"),
    "mlp_only_layers": refused(([], None), "dense MLP layers between the MoE ones"),
}

MIXTRAL: dict[str, Hp] = _HF_COMMON | {
    "intermediate_size": used("d_expert"),
    "num_local_experts": used("n_expert"),
    "num_experts": _ALIAS_EXPERTS,
    "sliding_window": refused((None,), "sliding-window attention on every layer; strata's "
                                       "mixtral attends fully"),
    "router_jitter_noise": inert("noise on the router in training only"),
}

GPT_OSS: dict[str, Hp] = _HF_COMMON | _HF_YARN | {
    "intermediate_size": used("d_expert"),
    "num_local_experts": used("n_expert"),
    "num_experts": _ALIAS_EXPERTS,
    "sliding_window": used("window.size", default=128),
    "layer_types": used("window.pattern", default=None),
    "swiglu_alpha": used("opts.swiglu_alpha", default=1.702),
    "swiglu_limit": used("opts.swiglu_limit", default=7.0),
    "attention_bias": refused((True,), "strata's gpt-oss has q/k/v/o biases"),
    "hidden_act": inert("GptOss's experts use their own clamped SwiGLU (swiglu_alpha, "
                        "swiglu_limit); transformers does not read it"),
    "quantization_config": refused((), (
        "the experts are MXFP4 blocks (OpenAI's release format); convert the checkpoint "
        "with llama.cpp's convert_hf_to_gguf.py and pack the GGUF (its MXFP4 experts are "
        "kept byte for byte)")),
    "experts_per_token": inert("OpenAI's duplicate of num_experts_per_tok; transformers "
                               "does not read it"),
    "initial_context_length": inert("OpenAI's note of the pretraining context; "
                                    "transformers does not read it"),
    ROPE + "truncate": used("yarn.truncate", default=True),
    ROPE + "mscale": refused((), "YaRN's mscale changes the attention factor; strata's "
                                 "gpt-oss derives it from the factor alone"),
    ROPE + "mscale_all_dim": refused((), "see mscale"),
}

DEEPSEEK_V3: dict[str, Hp] = _HF_COMMON | _HF_FAMILY | _HF_YARN | {
    "num_key_value_heads": refused(SameAs("num_attention_heads"),
                                   "MLA: each head has its own key and value"),
    "head_dim": inert("transformers sets it to qk_rope_head_dim (the rotary width)"),
    "qk_head_dim": inert("derived: qk_nope_head_dim + qk_rope_head_dim"),
    "qk_nope_head_dim": used("head_dim"),
    "qk_rope_head_dim": used("head_dim", "mla.qk_rope"),
    "v_head_dim": used("mla.v_head_dim"),
    "q_lora_rank": used("mla.q_lora"),
    "kv_lora_rank": used("mla.kv_lora"),
    "rope_interleave": refused((True,), "strata's deepseek2 rotates interleaved pairs (as "
                                        "llama.cpp)"),
    "attention_bias": refused((False,), "projection biases; strata's MLA has none"),
    "pretraining_tp": inert("the training run's tensor-parallel degree"),
    # the release's remote-code config.json
    "scoring_func": refused(("sigmoid",), "strata routes DeepSeek-V3 with the sigmoid gate"),
    "topk_method": refused(("noaux_tc",), "strata routes with the bias-corrected group "
                                          "top-k (noaux_tc)"),
    "moe_layer_freq": refused((1,), "dense layers between the MoE ones"),
    "aux_loss_alpha": inert("the training loss's balance term"),
    "seq_aux": inert("the training loss's balance term"),
    "ep_size": inert("the training run's expert-parallel degree"),
    # DeepSeek's YaRN (strata.archs.family_hf.hf_yarn_ds): cos/sin and the softmax scale
    ROPE + "truncate": used("yarn.truncate", default=True),
    ROPE + "mscale": used("yarn.attn"),
    ROPE + "mscale_all_dim": used("yarn.attn", "yarn.kq"),
    ROPE + "attention_factor": used("yarn.attn"),
}

GLM4_MOE: dict[str, Hp] = _HF_COMMON | _HF_FAMILY | {
    "attention_bias": used("attn.bias", default=False),
    "use_qk_norm": used("attn.qk_norm", default=False),
    "partial_rotary_factor": used("attn.rope_dim", missing=_hf_missing(
        "partial_rotary_factor", "0.5", "1.0"), also=(ROPE + "partial_rotary_factor",)),
    ROPE + "partial_rotary_factor": used("attn.rope_dim"),
}
_MTP = "MTP modules: transformers' model does not run them, strata does not read them"
_RELEASE = "the release's remote-code config; transformers' minimax_m2 does not read it"

MINIMAX_M2: dict[str, Hp] = _HF_COMMON | {
    "intermediate_size": used("d_expert"),
    "num_local_experts": used("n_expert"),
    "num_experts": _ALIAS_EXPERTS,
    "router_jitter_noise": inert("noise on the router in training only"),
    "rotary_dim": used("attn.rope_dim", why="the release's rotary width; transformers reads it as "
                                       "partial_rotary_factor = rotary_dim / head_dim when "
                                       "neither factor is given"),
    "partial_rotary_factor": used("attn.rope_dim"),
    ROPE + "partial_rotary_factor": used("attn.rope_dim"),
    # fields of the release's config.json (its remote code) that transformers' class lacks
    "attn_type_list": refused(Where(lambda v: all(int(t) == 1 for t in v),
                                    "every layer 1 (softmax attention)"),
                              "0 marks MiniMax-01's lightning (linear) attention layers; "
                              "MiniMax-M2 and strata attend with softmax in every layer"),
    "use_qk_norm": refused((True,), "strata's minimax-m2 norms q and k"),
    "qk_norm_type": refused(("per_layer",), "one q/k norm over the whole projection "
                                            "(per_layer); a per-head norm is another layout"),
    "use_routing_bias": refused((True,), "the choice is steered by e_score_correction_bias, "
                                         "which transformers always adds"),
    "scoring_func": refused(("sigmoid",), "strata routes MiniMax-M2 with the sigmoid gate"),
    "use_grouped_topk": inert("read only with num_expert_group (refused above 1)"),
    "num_expert_group": refused((None, 1), "grouped expert choice; MiniMax-M2 picks from all "
                                           "experts"),
    "topk_group": refused((None, 1), "grouped expert choice (see num_expert_group)"),
    "routed_scaling_factor": refused((1.0,), "a routed-weight scale; MiniMax-M2's router "
                                             "(and transformers') has none"),
    "layernorm_full_attention_beta": refused((1.0,), "MiniMax-01's DeepNorm residual scale; 1 "
                                                     "is the plain residual"),
    "layernorm_linear_attention_beta": refused((1.0,), "MiniMax-01's DeepNorm residual scale "
                                                       "of linear-attention layers"),
    "layernorm_mlp_beta": refused((1.0,), "MiniMax-01's DeepNorm residual scale; 1 is the "
                                          "plain residual"),
    "shared_intermediate_size": refused((0,), "a shared expert; MiniMax-M2 has none"),
    "shared_moe_mode": inert("read only with a shared expert (shared_intermediate_size, "
                             "refused unless 0)"),
    "mlp_intermediate_size": inert("a dense MLP's width; every layer routes to experts"),
    "use_mtp": inert(_MTP),
    "num_mtp_modules": inert(_MTP),
    "mtp_transformer_layers": inert(_MTP),
    "attn_window_size": refused((None,), "sliding-window attention; MiniMax-M2 attends fully"),
    "sliding_window": refused((None,), "sliding-window attention; MiniMax-M2 attends fully"),
    "swa_rope_theta": inert("the sliding layers' RoPE base; no layer slides "
                            "(attn_window_size / sliding_window refused)"),
    "max_model_len": inert(_RELEASE + " (a serving limit)"),
}

# Qwen3-Next / Qwen3.5-MoE's text model (strata.archs.qwen3next, qwen35moe)
_HF_HYBRID: dict[str, Hp] = _HF_COMMON | {
    "intermediate_size": inert("the dense MLP's width; every layer routes to experts "
                               "(mlp_only_layers / decoder_sparse_step are refused)"),
    "moe_intermediate_size": used("d_expert"),
    "shared_expert_intermediate_size": used("dense.shared", why="dense.shared = its width / "
                                                                 "moe_intermediate_size"),
    "num_experts": used("n_expert"),
    "attention_bias": refused((False,), "q/k/v/o biases; these models have none"),
    "partial_rotary_factor": used("attn.rope_dim"),
    ROPE + "partial_rotary_factor": used("attn.rope_dim"),
    "linear_conv_kernel_dim": used("linear.conv_kernel"),
    "linear_key_head_dim": used("linear.k_head_dim"),
    "linear_value_head_dim": used("linear.v_head_dim"),
    "linear_num_key_heads": used("linear.n_k_head"),
    "linear_num_value_heads": used("linear.n_v_head"),
    "layer_types": used("linear.layer_types"),
    "full_attention_interval": used("linear.full_interval", why="read only without "
                                                                "layer_types"),
}
QWEN3_NEXT: dict[str, Hp] = _HF_HYBRID | {
    "norm_topk_prob": used("norm_topk_prob", default=True),
    "decoder_sparse_step": refused((1,), "dense MLP layers between the MoE ones"),
    "mlp_only_layers": refused(([], None), "dense MLP layers between the MoE ones"),
}
_MTP_35 = "MTP layers: transformers' model does not run them, strata does not read them"
QWEN3_5_MOE: dict[str, Hp] = _HF_HYBRID | {
    ROPE + "mrope_section": inert("interleaved MRoPE's sections: over text every axis holds the "
                                  "token's position, so the rotation is plain partial RoPE"),
    ROPE + "mrope_interleaved": inert("see mrope_section"),
    # fields of the release's text_config that transformers' class does not read
    "attn_output_gate": refused((True,), "the full attention's sigmoid output gate, which "
                                         "strata's qwen35moe always applies"),
    "mamba_ssm_dtype": inert("the dtype other runtimes keep the recurrent state in; strata "
                             "keeps S in fp32 (as transformers' fp32 forward)"),
    "mtp_num_hidden_layers": inert(_MTP_35),
    "mtp_use_dedicated_embeddings": inert(_MTP_35),
}

_VISION = "the vision tower's; strata reads the text model (image and video tokens never reach it)"
# Qwen3.5-MoE's release folder (Qwen3_5MoeForConditionalGeneration): the text model's config under
# text_config, audited against QWEN3_5_MOE (strata.packs.hparams.audit_hf)
QWEN3_5_MOE_VL: dict[str, Hp] = {
    k: _HF_COMMON[k] for k in (
        "model_type", "architectures", "transformers_version", "_name_or_path", "dtype",
        "torch_dtype", "output_hidden_states", "output_attentions", "return_dict",
        "chunk_size_feed_forward", "is_encoder_decoder", "id2label", "label2id", "problem_type",
        "tie_word_embeddings")} | {
    "text_config": used("n_layer", "d_model", "n_expert", "d_expert", "vocab", "linear.n_v_head",
                        why="the text model's config, read (and audited) as qwen3_5_moe_text's"),
    "vision_config": inert(_VISION),
    "image_token_id": inert(_VISION), "video_token_id": inert(_VISION),
    "vision_start_token_id": inert(_VISION), "vision_end_token_id": inert(_VISION),
}

for _f, _hf, _st in (("routed_scaling_factor", "2.5", "1.0"), ("n_shared_experts", "1", "0"),
                     ("first_k_dense_replace", "3", "0"), ("n_group", "8", "1"),
                     ("topk_group", "4", "1"), ("q_lora_rank", "1536", "0 (a full Wq)")):
    DEEPSEEK_V3[_f] = replace(DEEPSEEK_V3[_f], missing=_hf_missing(_f, _hf, _st),
                              default=NO_DEFAULT)
for _f, _hf, _st in (("n_shared_experts", "1", "0"), ("first_k_dense_replace", "1", "0")):
    GLM4_MOE[_f] = replace(GLM4_MOE[_f], missing=_hf_missing(_f, _hf, _st))
