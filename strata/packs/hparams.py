"""Every hyperparameter a model file carries, per architecture, and what strata does with it;
the audit that refuses a file carrying one strata would otherwise drop.

    GGUF[arch][suffix]     GGUF key "{arch}.{suffix}" (llama.cpp's LLM_KV names, llama-arch.cpp)
    GGUF_GLOBAL[key]       the general.* / split.* keys llama.cpp's loader reads (whole names)
    HF[model_type][name]   a config.json field; "rope_parameters.<sub>" a field of its RoPE dict
                           (transformers 5's rope_parameters, or the legacy rope_scaling)

Legend (Hp.kind):
    used      the reader sets ModelShape field(s) `fields` from it; `ok`, when given, bounds the
              values strata implements (another value is refused)
    refused   strata implements only the values `ok` (usually the source's own default); a file
              carrying another one is refused in one line (StrataError: the CLI exits 2)
    inert     it cannot change a prefill's logits; `why` says why
  and on any kind:
    missing   a refusal for when the key is absent: the source reads its absence as a value
              strata's reader would not (`also`: other names of the same value)
    default   the value the source assumes when the key is absent (tests: absent reads as it)
    array     it may be a per-layer array (any other key given as an array is refused: the
              readers take one value for every layer)

Sources: llama.cpp 0c1e57098 (vendored by llama-cpp-python 0.3.36): src/llama-model.cpp
load_hparams (every architecture), src/models/<arch>.cpp load_arch_hparams, src/llama-arch.cpp
(key names), src/llama-hparams.h (defaults), conversion/*.py (the keys convert_hf_to_gguf.py
writes). transformers 5.24: the Qwen3Moe/Mixtral/GptOss/DeepseekV3/Glm4Moe config classes and
modeling_rope_utils (the RoPE dict's fields), plus the legacy fields released config.json files
carry. A key under "{arch}." or a config.json field that the table does not list is refused: strata
cannot know whether it changes the logits (tests/packs/test_hparams_audit.py walks the table
against llama.cpp's loader keys and transformers' config fields).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from strata.errors import StrataError

USED, REFUSED, INERT = "used", "refused", "inert"
NO_DEFAULT = "<no default>"
ROPE_DICTS = ("rope_parameters", "rope_scaling")   # config.json's RoPE dicts (audited by field)
ROPE = "rope_parameters."


@dataclass(frozen=True)
class OneOf:
    """The values strata implements; () means none: the key must be absent."""
    values: tuple

    def holds(self, v, get) -> bool:
        return any(v == x and isinstance(v, bool) == isinstance(x, bool) for x in self.values)

    def __str__(self) -> str:
        return " or ".join(_show(x) for x in self.values) if self.values else "none (absent)"


@dataclass(frozen=True)
class SameAs:
    """Equal to another key's value (`key`, else `fallback(get)` when that key is absent)."""
    key: str
    fallback: Callable | None = None

    def holds(self, v, get) -> bool:
        want = get(self.key)
        if want is None and self.fallback is not None:
            want = self.fallback(get)
        return want is None or v == want

    def __str__(self) -> str:
        return f"the value of {self.key}"


@dataclass(frozen=True)
class Where:
    """A predicate with its words."""
    test: Callable
    text: str

    def holds(self, v, get) -> bool:
        try:
            return bool(self.test(v))
        except (TypeError, ValueError):
            return False

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class Hp:
    kind: str
    fields: tuple[str, ...] = ()
    ok: OneOf | SameAs | Where | None = None
    why: str = ""
    missing: str = ""
    default: Any = NO_DEFAULT
    array: bool = False
    also: tuple[str, ...] = ()


def _ok(ok):
    return OneOf(tuple(ok)) if isinstance(ok, (tuple, list)) else ok


def used(*fields: str, ok=None, why: str = "", **kw) -> Hp:
    return Hp(USED, fields, _ok(ok), why, **kw)


def refused(ok, why: str, **kw) -> Hp:
    return Hp(REFUSED, (), _ok(ok), why, **kw)


def inert(why: str, *fields: str, **kw) -> Hp:
    return Hp(INERT, fields, None, why, **kw)


def _head_dim(get):   # llama.cpp's fallback head size: n_embd / n_head
    try:
        return int(get("embedding_length")) // int(get("attention.head_count"))
    except (TypeError, ValueError, ZeroDivisionError):
        return None


NONZERO = Where(lambda v: float(v) != 0.0, "a nonzero value")
TOKENIZER = "the tokenizer: strata.tokenize carries it into the pack; token ids, not logits"

# ---- GGUF: what llama.cpp's load_hparams reads for every architecture ------------------------
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
    "rope.scaling.type": used("rope_scaling", ok=("none", "yarn"), default="none"),
    "rope.scaling.factor": used("rope_factor"),
    "rope.scaling.original_context_length": used("rope_orig_ctx"),
    "rope.scaling.yarn_beta_fast": used("yarn_beta_fast", default=32.0),
    "rope.scaling.yarn_beta_slow": used("yarn_beta_slow", default=1.0),
}

_FAMILY = {  # DeepSeek / GLM-4.5 (strata.packs.from_gguf_ds)
    "nextn_predict_layers": used("n_layer", default=0),
    "expert_group_count": used("n_group", default=0),
    "expert_group_used_count": used("topk_group", default=0),
    "feed_forward_length": used("d_ff"),
    "leading_dense_block_count": used("n_dense_lead", default=0),
    "expert_feed_forward_length": used("d_expert"),
    "expert_shared_count": used("n_shared"),
    "expert_weights_scale": used("routed_scale", ok=NONZERO, default=1.0,
                                 why="llama.cpp reads 0 as no scale, strata's reader would "
                                     "scale the routed experts by 0"),
    "expert_weights_norm": used("norm_topk_prob", missing=(
        "llama.cpp reads its absence as false (no top-k renormalisation), strata's reader as "
        "true; write it with gguf-py's gguf_new_metadata.py or re-convert the model")),
    "expert_gating_func": refused((2,), "strata routes this family with the sigmoid gate (2)"),
}

GGUF: dict[str, dict[str, Hp]] = {
    "qwen3moe": _GGUF_COMMON | {
        "expert_feed_forward_length": used("d_expert"),
        "expert_shared_feed_forward_length": refused(
            (0,), "shared experts; strata's qwen3moe has none"),
    },
    # Mixtral: llama.cpp arch `llama` with experts (strata.packs.names_mixtral)
    "llama": _GGUF_COMMON | {
        "feed_forward_length": used("d_expert"),
        "expert_feed_forward_length": used("d_expert"),
        "rope.dimension_count": refused(SameAs("attention.key_length", _head_dim),
                                        "llama.cpp refuses a llama model whose rotary width is "
                                        "not its head size"),
    },
    "gpt-oss": _GGUF_COMMON | _YARN_GGUF | {
        "expert_feed_forward_length": used("d_expert"),
        "attention.sliding_window": used("sliding_window", missing=(
            "llama.cpp requires it for gpt-oss (the sliding layers' window); re-convert the "
            "model")),
        "attention.sliding_window_pattern": used("sliding_pattern", default=2, array=True),
        "rope.freq_base_swa": refused(SameAs("rope.freq_base"),
                                      "strata's sliding layers rotate with rope.freq_base"),
        "swiglu_clamp_exp": used("swiglu_limit", array=True),
        "expert_gating_func": refused((3,), "gpt-oss routes top-k, then a softmax over the "
                                            "chosen (llama.cpp's SOFTMAX_WEIGHT)"),
    },
    "deepseek2": _GGUF_COMMON | _FAMILY | _YARN_GGUF | {
        "expert_gating_func": refused((2,), "strata routes DeepSeek with the sigmoid gate (2)",
                                      missing=(
            "llama.cpp reads its absence as softmax (DeepSeek-V2's router), strata routes this "
            "family with the sigmoid gate (2); write it or re-convert the model")),
        "attention.head_count_kv": inert("MLA's layout marker (1: attn_k_b / attn_v_b, H: "
                                         "attn_kv_b); strata's n_kv_head is head_count"),
        "attention.key_length": used("head_dim"),   # the older MLA layout (no key_length_mla)
        "attention.value_length": used("v_head_dim"),
        "attention.key_length_mla": used("head_dim"),
        "attention.value_length_mla": used("v_head_dim"),
        "attention.q_lora_rank": used("q_lora", default=0),
        "attention.kv_lora_rank": used("kv_lora"),
        "rope.dimension_count": used("qk_rope"),
        # DeepSeek's YaRN (strata.packs.from_gguf_ds.gguf_yarn_ds): the softmax scale's mscale
        "rope.scaling.type": used("rope_scaling", ok=("none", "linear", "yarn"), default="none"),
        "rope.scaling.yarn_log_multiplier": used("yarn_kq"),
        "rope.scaling.attn_factor": used("yarn_attn", "yarn_kq", default=1.0),
        "attention.temperature_scale": refused((0.0,), "Llama-4 style attention temperature "
                                                       "(Mistral-Large 3)"),
        "attention.temperature_length": inert("read only with attention.temperature_scale "
                                              "(refused unless 0)"),
    },
    "glm4moe": _GGUF_COMMON | _FAMILY | {
        "nextn_predict_layers": used("n_layer", default=0),
        "rope.dimension_count": used("rope_dim"),
        "rope.dimension_sections": refused(Where(lambda v: not any(v), "absent or all 0"),
                                           "multi-axis RoPE sections (a vision model's)",
                                           array=True),
    },
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
    ROPE + "rope_type": used("rope_scaling", ok=("default", "yarn"), default="default"),
    ROPE + "type": used("rope_scaling", ok=("default", "yarn"), default="default"),
    ROPE + "factor": used("rope_factor"),
    ROPE + "original_max_position_embeddings": used("rope_orig_ctx"),
    ROPE + "beta_fast": used("yarn_beta_fast", default=32.0),
    ROPE + "beta_slow": used("yarn_beta_slow", default=1.0),
    ROPE + "attention_factor": refused((), "an explicit YaRN attention factor; strata derives "
                                           "it from the factor"),
}

_HF_FAMILY = {  # GLM-4.5, DeepSeek-V3 (strata.packs.from_hf_ds)
    "intermediate_size": used("d_ff"),
    "moe_intermediate_size": used("d_expert"),
    "n_routed_experts": used("n_expert"),
    "num_local_experts": used("n_expert"),
    "n_shared_experts": used("n_shared"),
    "routed_scaling_factor": used("routed_scale", default=1.0),
    "n_group": used("n_group", default=1),
    "topk_group": used("topk_group", default=1),
    "first_k_dense_replace": used("n_dense_lead"),
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


HF: dict[str, dict[str, Hp]] = {
    "qwen3_moe": _HF_COMMON | {
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
    },
    "mixtral": _HF_COMMON | {
        "intermediate_size": used("d_expert"),
        "num_local_experts": used("n_expert"),
        "num_experts": _ALIAS_EXPERTS,
        "sliding_window": refused((None,), "sliding-window attention on every layer; strata's "
                                           "mixtral attends fully"),
        "router_jitter_noise": inert("noise on the router in training only"),
    },
    "gpt_oss": _HF_COMMON | _HF_YARN | {
        "intermediate_size": used("d_expert"),
        "num_local_experts": used("n_expert"),
        "num_experts": _ALIAS_EXPERTS,
        "sliding_window": used("sliding_window", default=128),
        "layer_types": used("sliding_pattern", default=None),
        "swiglu_alpha": used("swiglu_alpha", default=1.702),
        "swiglu_limit": used("swiglu_limit", default=7.0),
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
        ROPE + "truncate": used("yarn_truncate", default=True),
        ROPE + "mscale": refused((), "YaRN's mscale changes the attention factor; strata's "
                                     "gpt-oss derives it from the factor alone"),
        ROPE + "mscale_all_dim": refused((), "see mscale"),
    },
    "deepseek_v3": _HF_COMMON | _HF_FAMILY | _HF_YARN | {
        "num_key_value_heads": refused(SameAs("num_attention_heads"),
                                       "MLA: each head has its own key and value"),
        "head_dim": inert("transformers sets it to qk_rope_head_dim (the rotary width)"),
        "qk_head_dim": inert("derived: qk_nope_head_dim + qk_rope_head_dim"),
        "qk_nope_head_dim": used("head_dim"),
        "qk_rope_head_dim": used("head_dim", "qk_rope"),
        "v_head_dim": used("v_head_dim"),
        "q_lora_rank": used("q_lora"),
        "kv_lora_rank": used("kv_lora"),
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
        # DeepSeek's YaRN (strata.packs.from_hf_ds.hf_yarn_ds): cos/sin and the softmax scale
        ROPE + "truncate": used("yarn_truncate", default=True),
        ROPE + "mscale": used("yarn_attn"),
        ROPE + "mscale_all_dim": used("yarn_attn", "yarn_kq"),
        ROPE + "attention_factor": used("yarn_attn"),
    },
    "glm4_moe": _HF_COMMON | _HF_FAMILY | {
        "attention_bias": used("attn_bias", default=False),
        "use_qk_norm": used("qk_norm", default=False),
        "partial_rotary_factor": used("rope_dim", missing=_hf_missing(
            "partial_rotary_factor", "0.5", "1.0"), also=(ROPE + "partial_rotary_factor",)),
        ROPE + "partial_rotary_factor": used("rope_dim"),
    },
}
for _f, _hf, _st in (("routed_scaling_factor", "2.5", "1.0"), ("n_shared_experts", "1", "0"),
                     ("first_k_dense_replace", "3", "0"), ("n_group", "8", "1"),
                     ("topk_group", "4", "1"), ("q_lora_rank", "1536", "0 (a full Wq)")):
    HF["deepseek_v3"][_f] = replace(HF["deepseek_v3"][_f], missing=_hf_missing(_f, _hf, _st),
                                    default=NO_DEFAULT)
for _f, _hf, _st in (("n_shared_experts", "1", "0"), ("first_k_dense_replace", "1", "0")):
    HF["glm4_moe"][_f] = replace(HF["glm4_moe"][_f], missing=_hf_missing(_f, _hf, _st))
HF["kimi_k2"] = HF["deepseek_v3"]   # Kimi-K2's config.json: DeepSeek-V3's fields

# The HF model_type of each GGUF architecture's table (one architecture, two sources)
SAME_ARCH = {"qwen3moe": "qwen3_moe", "llama": "mixtral", "gpt-oss": "gpt_oss",
             "deepseek2": "deepseek_v3", "glm4moe": "glm4_moe"}


# ---- the audit ------------------------------------------------------------------------------
def _show(v) -> str:
    s = repr(v)
    return s if len(s) <= 60 else s[:57] + "..."


def _check(hp: Hp, key: str, v, get, where: str, fix: str, layers: bool = False) -> None:
    """Refuse `v` where `hp` bounds it; `layers`: a GGUF, where an array is a per-layer value."""
    if layers and isinstance(v, (list, tuple)) and not hp.array:
        raise StrataError(f"{where} {key} is a per-layer array ({_show(list(v))}); strata reads "
                          f"one value for every layer")
    if hp.ok is not None and not hp.ok.holds(v, get):
        reads = ("reads files without it" if hp.ok == OneOf(()) else
                 f"implements {hp.ok} only")
        why = f": {hp.why}" if hp.why else ""
        raise StrataError(f"{where} {key} is {_show(v)}, but strata {reads}{why}; {fix}")


def audit_gguf(arch: str | None, meta: Mapping[str, Any], path) -> None:
    """Refuse a GGUF whose metadata carries a key strata would drop or a value it does not
    implement (one line naming the key). `meta`: key -> value (values read when asked);
    an architecture without a table is left to the reader (which names those it reads)."""
    table = GGUF.get(arch) if isinstance(arch, str) else None
    if table is None:
        return
    pre = arch + "."
    where = f"{path}: GGUF metadata"
    fix = "re-convert the model without it, or read it with llama.cpp"

    def get(suffix):
        return meta[pre + suffix] if pre + suffix in meta else None
    unknown = []
    for key in meta:
        if key in GGUF_GLOBAL:
            _check(GGUF_GLOBAL[key], key, meta[key], lambda k: meta.get(k), where, fix, True)
        elif key.startswith(pre):
            hp = table.get(key[len(pre):])
            if hp is None:
                unknown.append(key)
            else:
                _check(hp, key, meta[key], get, where, fix, True)
    for suffix, hp in table.items():
        if hp.missing and all(k not in meta for k in (pre + suffix, *hp.also)):
            raise StrataError(f"{where} {pre}{suffix} is missing: {hp.missing}")
    if unknown:
        raise StrataError(f"{where} {unknown[0]} is not in strata's table of {arch} keys "
                          f"(strata.packs.hparams), so strata cannot tell whether it changes "
                          f"the logits: remove it with gguf-py's gguf_new_metadata.py, or add "
                          f"it to the table (used, refused or inert) with a test")


def hf_fields(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """config.json's fields as the HF table names them: the top level, and each field of the
    RoPE dict (rope_parameters, else the legacy rope_scaling) as "rope_parameters.<name>"."""
    out = {k: v for k, v in cfg.items() if k not in ROPE_DICTS}
    for d in ROPE_DICTS:
        rope = cfg.get(d)
        if rope is None:
            continue
        if not isinstance(rope, Mapping):
            raise StrataError(f"config.json's {d} is {_show(rope)}; it must be an object")
        for k, v in rope.items():
            out.setdefault(ROPE + k, v)
    return out


def audit_hf(cfg: Mapping[str, Any], where) -> None:
    """Refuse a config.json with a field strata would drop or a value it does not implement
    (one line naming the field); a model_type without a table is left to the reader."""
    table = HF.get(cfg.get("model_type"))
    if table is None:
        return
    flat = hf_fields(cfg)
    at = f"{where}: config.json's"
    fix = "strata cannot read this checkpoint"
    unknown = []
    for key, v in flat.items():
        hp = table.get(key)
        if hp is None:
            unknown.append(key)
        elif v is not None:
            _check(hp, key, v, flat.get, at, fix)
    for key, hp in table.items():
        if hp.missing and all(k not in flat for k in (key, *hp.also)):
            raise StrataError(f"{at} {key} is missing: {hp.missing}")
    if unknown:
        raise StrataError(f"{at} field {unknown[0]} is not in strata's table of "
                          f"{cfg.get('model_type')} fields (strata.packs.hparams), so strata "
                          f"cannot tell whether it changes the logits: remove it from "
                          f"config.json, or add it to the table (used, refused or inert) with "
                          f"a test")


def gguf_meta(r) -> Mapping[str, Any]:
    """A GGUFReader's metadata as key -> value, each value read when asked (the tokenizer's
    large arrays are never read here)."""
    return _Meta({name: f for name, f in r.fields.items() if not name.startswith("GGUF.")})


class _Meta(Mapping):
    def __init__(self, fields):
        self._f = fields

    def __getitem__(self, k):
        return self._f[k].contents()

    def __iter__(self):
        return iter(self._f)

    def __len__(self):
        return len(self._f)

    def __contains__(self, k):
        return k in self._f


def counts() -> dict[str, dict[str, int]]:
    """{table: {kind: n}} for every architecture's GGUF and HF tables (the report's numbers)."""
    out = {}
    for name, t in [*((f"gguf:{a}", t | GGUF_GLOBAL) for a, t in GGUF.items()),
                    *((f"hf:{m}", t) for m, t in HF.items() if m != "kimi_k2")]:
        out[name] = {k: sum(hp.kind == k for hp in t.values()) for k in (USED, REFUSED, INERT)}
    return out
