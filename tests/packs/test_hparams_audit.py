"""The hparam audit (strata.packs.hparams) walked against its sources and its readers.

(a) every key llama.cpp's loader reads for an architecture (and convert_hf_to_gguf.py writes), and
    every field transformers' config class writes, is in the table: a new key fails here;
(b) every used key, changed in a GGUF / config.json, changes the ModelShape field(s) the table
    names; every used field the tensors do not pin changes a tiny model's logits (key -> field
    -> logits); an absent key reads as the source's default;
(c) every refused value (and every bound on a used one, every refusal of an absent key): `strata
    pack` exits 2 with one line naming the key;
(d) a key the table does not know: exit 2, one line.
"""
from __future__ import annotations

import inspect
import itertools
import json

import numpy as np
import pytest
import torch

from strata.cli import main
from strata.packs import hparams as hp
from strata.shapes import ModelShape, Yarn
from tests.models.hf_archs import GPT_OSS_TINY, MIXTRAL_TINY
from tests.models.hf_family import DS_TINY, DS_YARN, GLM_TINY
from tests.models.hf_minimax_m2 import MINIMAX_TINY
from tests.models.hf_qwen3next import QWEN35MOE_TINY, QWEN3NEXT_TINY
from tests.models.hf_tiny import TINY

# ---- (a) the sources ------------------------------------------------------------------------
# llama.cpp 0c1e57098 (vendored by llama-cpp-python 0.3.36): every key its loader reads, from
# src/llama-model.cpp (load_hparams up to load_arch_hparams, minus the WavTokenizer branch;
# llama_prec_policy::load; load_swa_pattern), src/models/<arch>.cpp (load_arch_hparams) and
# src/llama-model-loader.cpp, the LLM_KV names resolved through src/llama-arch.cpp. "%s." is the
# architecture; tokenizer.* keys are strata.tokenize's, not the audit's.
LOADER_ALL = [
    "general.architecture", "general.name", "general.file_type", "general.alignment",
    "general.tensor_extra.name", "general.tensor_extra.prec_a4", "split.count", "split.no",
    "split.tensors.count",
    "%s.attention.causal", "%s.attention.head_count", "%s.attention.head_count_kv",
    "%s.attention.key_length", "%s.attention.key_length_swa", "%s.attention.value_length",
    "%s.attention.value_length_swa", "%s.block_count", "%s.classifier.output_labels",
    "%s.classifier.pooling_type", "%s.context_length", "%s.embedding_length",
    "%s.embedding_length_out", "%s.expert_count", "%s.expert_group_count",
    "%s.expert_group_used_count", "%s.expert_used_count", "%s.feed_forward_length",
    "%s.nextn_predict_layers", "%s.pooling_type", "%s.rope.dimension_count",
    "%s.rope.dimension_count_swa", "%s.rope.freq_base", "%s.rope.scale_linear",
    "%s.rope.scaling.alpha", "%s.rope.scaling.attn_factor", "%s.rope.scaling.factor",
    "%s.rope.scaling.finetuned", "%s.rope.scaling.original_context_length",
    "%s.rope.scaling.type",
]
_HYBRID_LOADER = ["%s.expert_feed_forward_length", "%s.expert_shared_feed_forward_length",
                  "%s.attention.layer_norm_rms_epsilon", "%s.ssm.conv_kernel",
                  "%s.ssm.inner_size", "%s.ssm.state_size", "%s.ssm.time_step_rank",
                  "%s.ssm.group_count", "%s.attention.recurrent_layers",
                  "%s.full_attention_interval"]
LOADER_ARCH = {
    "qwen3moe": ["%s.attention.layer_norm_rms_epsilon", "%s.expert_feed_forward_length"],
    "llama": ["%s.attention.layer_norm_rms_epsilon", "%s.vocab_size", "tokenizer.ggml.tokens"],
    "gpt-oss": ["%s.attention.layer_norm_rms_epsilon", "%s.attention.sliding_window",
                "%s.expert_feed_forward_length", "%s.rope.freq_base_swa",
                "%s.attention.sliding_window_pattern"],
    "deepseek2": ["%s.attention.key_length_mla", "%s.attention.kv_lora_rank",
                  "%s.attention.layer_norm_rms_epsilon", "%s.attention.q_lora_rank",
                  "%s.attention.temperature_length", "%s.attention.temperature_scale",
                  "%s.attention.value_length_mla", "%s.expert_feed_forward_length",
                  "%s.expert_gating_func", "%s.expert_shared_count", "%s.expert_weights_norm",
                  "%s.expert_weights_scale", "%s.leading_dense_block_count",
                  "%s.rope.scaling.yarn_log_multiplier", "%s.vocab_size",
                  "tokenizer.ggml.tokens"],
    "glm4moe": ["%s.attention.layer_norm_rms_epsilon", "%s.expert_feed_forward_length",
                "%s.expert_gating_func", "%s.expert_shared_count", "%s.expert_weights_norm",
                "%s.expert_weights_scale", "%s.leading_dense_block_count",
                "%s.rope.dimension_sections"],
    "minimax-m2": ["%s.attention.layer_norm_rms_epsilon", "%s.expert_feed_forward_length",
                   "%s.expert_gating_func"],
    # src/models/qwen3next.cpp / qwen35moe.cpp (load_arch_hparams)
    "qwen3next": _HYBRID_LOADER,
    "qwen35moe": _HYBRID_LOADER + ["%s.rope.dimension_sections"],
}
# what the same llama.cpp's conversion/base.py (TextModel.set_gguf_parameters) and its
# qwen.py / llama.py / gpt_oss.py / deepseek.py / glm.py classes write for these architectures
CONVERTER_ALL = [
    "%s.block_count", "%s.context_length", "%s.embedding_length", "%s.feed_forward_length",
    "%s.attention.head_count", "%s.attention.head_count_kv", "%s.attention.causal",
    "%s.rope.scaling.type", "%s.rope.scaling.factor", "%s.rope.scaling.original_context_length",
    "%s.rope.scaling.yarn_ext_factor", "%s.rope.scaling.yarn_attn_factor",
    "%s.rope.scaling.yarn_beta_fast", "%s.rope.scaling.yarn_beta_slow", "%s.rope.freq_base",
    "%s.attention.layer_norm_rms_epsilon", "%s.attention.layer_norm_epsilon",
    "%s.expert_count", "%s.expert_used_count", "%s.expert_group_count",
    "%s.expert_group_used_count", "%s.expert_gating_func", "%s.attention.key_length",
    "%s.attention.value_length", "%s.pooling_type", "general.file_type",
    "general.quantization_version", "general.type", "general.name",
]
_HYBRID_CONVERTER = ["%s.expert_feed_forward_length", "%s.expert_shared_feed_forward_length",
                     "%s.ssm.conv_kernel", "%s.ssm.state_size", "%s.ssm.group_count",
                     "%s.ssm.time_step_rank", "%s.ssm.inner_size",
                     "%s.attention.recurrent_layers", "%s.full_attention_interval",
                     "%s.rope.dimension_count", "%s.nextn_predict_layers"]
CONVERTER_ARCH = {
    "qwen3moe": ["%s.expert_feed_forward_length", "%s.expert_shared_feed_forward_length"],
    "llama": ["%s.vocab_size", "%s.rope.dimension_count"],
    "gpt-oss": ["%s.attention.sliding_window", "%s.expert_feed_forward_length",
                "%s.rope.freq_base_swa"],
    "deepseek2": ["%s.leading_dense_block_count", "%s.vocab_size", "%s.attention.q_lora_rank",
                  "%s.attention.kv_lora_rank", "%s.attention.key_length_mla",
                  "%s.attention.value_length_mla", "%s.expert_feed_forward_length",
                  "%s.expert_shared_count", "%s.expert_weights_scale",
                  "%s.expert_weights_norm", "%s.rope.dimension_count",
                  "%s.rope.scaling.yarn_log_multiplier"],
    "glm4moe": ["%s.rope.dimension_count", "%s.expert_feed_forward_length",
                "%s.expert_shared_count", "%s.leading_dense_block_count",
                "%s.expert_weights_scale", "%s.expert_weights_norm", "%s.nextn_predict_layers"],
    "minimax-m2": ["%s.expert_feed_forward_length", "%s.rope.dimension_count"],
    # conversion/qwen.py: Qwen2MoeModel, Qwen3NextModel, _QwenMtpMixin, _Qwen35MRopeMixin
    "qwen3next": _HYBRID_CONVERTER,
    "qwen35moe": _HYBRID_CONVERTER + ["%s.rope.dimension_sections"],
}
# fields of the released config.json files (Qwen3-30B-A3B, Mixtral-8x7B, gpt-oss-20b,
# DeepSeek-V3 / Kimi-K2 with their remote code, GLM-4.5) that transformers 5 no longer writes
RELEASED = {
    "qwen3_moe": ["rope_theta", "rope_scaling", "torch_dtype", "max_window_layers",
                  "num_experts", "head_dim"],
    "mixtral": ["rope_theta", "torch_dtype"],
    "gpt_oss": ["rope_theta", "rope_scaling", "torch_dtype", "experts_per_token",
                "initial_context_length", "quantization_config"],
    "deepseek_v3": ["rope_theta", "rope_scaling", "torch_dtype", "aux_loss_alpha", "ep_size",
                    "moe_layer_freq", "scoring_func", "seq_aux", "topk_method",
                    "quantization_config", "auto_map"],
    "glm4_moe": ["rope_theta", "rope_scaling", "torch_dtype", "partial_rotary_factor",
                 "head_dim"],
    # MiniMaxAI/MiniMax-M2's config.json: the fields of its remote-code config class
    "minimax_m2": ["rope_theta", "rope_scaling", "torch_dtype", "rotary_dim", "attn_type_list", "use_qk_norm", "qk_norm_type",
                   "use_routing_bias", "scoring_func", "use_grouped_topk", "num_expert_group",
                   "topk_group", "routed_scaling_factor", "layernorm_full_attention_beta",
                   "layernorm_linear_attention_beta", "layernorm_mlp_beta",
                   "shared_intermediate_size", "shared_moe_mode", "mlp_intermediate_size",
                   "use_mtp", "num_mtp_modules", "mtp_transformer_layers", "attn_window_size",
                   "swa_rope_theta", "sliding_window", "max_model_len", "quantization_config",
                   "auto_map"],
    # Qwen/Qwen3-Next-80B-A3B-Instruct's config.json; Qwen/Qwen3.5-35B-A3B's text_config
    "qwen3_next": ["rope_theta", "rope_scaling", "torch_dtype", "partial_rotary_factor",
                   "full_attention_interval"],
    "qwen3_5_moe_text": ["full_attention_interval", "attn_output_gate", "mamba_ssm_dtype",
                         "mtp_num_hidden_layers", "mtp_use_dedicated_embeddings"],
    "qwen3_5_moe": ["tie_word_embeddings"],
}
HF_CLASSES = {"qwen3_moe": "Qwen3MoeConfig", "mixtral": "MixtralConfig",
              "gpt_oss": "GptOssConfig", "deepseek_v3": "DeepseekV3Config",
              "glm4_moe": "Glm4MoeConfig", "minimax_m2": "MiniMaxM2Config",
              "qwen3_next": "Qwen3NextConfig", "qwen3_5_moe_text": "Qwen3_5MoeTextConfig",
              "qwen3_5_moe": "Qwen3_5MoeConfig"}

def _ids(v):
    return str(v)


def _in_gguf_table(arch: str, key: str) -> bool:
    if key.startswith("tokenizer."):
        return True   # strata.tokenize's
    if key.startswith("%s."):
        return key[3:] in hp.GGUF[arch]
    return key in hp.GGUF_GLOBAL


@pytest.mark.parametrize("arch", sorted(hp.GGUF))
def test_every_llama_cpp_key_is_in_the_table(arch):
    keys = LOADER_ALL + LOADER_ARCH[arch] + CONVERTER_ALL + CONVERTER_ARCH[arch]
    assert [k for k in keys if not _in_gguf_table(arch, k)] == []


def _hf_config(model_type: str, **kw):
    import transformers
    return getattr(transformers, HF_CLASSES[model_type])(**kw)


@pytest.mark.parametrize("model_type", sorted(HF_CLASSES))
def test_every_transformers_field_is_in_the_table(model_type):
    yarn = {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0,
                                "original_max_position_embeddings": 4096, "beta_fast": 32.0,
                                "beta_slow": 1.0}}
    fields = set(hp.hf_fields(_hf_config(model_type).to_dict()))
    if model_type in ("gpt_oss", "deepseek_v3"):
        fields |= set(hp.hf_fields(_hf_config(model_type, **yarn).to_dict()))
    fields |= {f for f in RELEASED[model_type] if f not in hp.ROPE_DICTS}
    assert sorted(fields - set(hp.HF[model_type])) == []


def test_table_entries_are_well_formed():
    """Used fields are ModelShape's (or, as "<group>.<name>", an option group's); a SameAs
    names a key of its own table; refusals and inert entries say why; defaults of the HF tables
    are transformers' own."""
    import transformers
    from strata.shapes import OPTION_GROUPS
    shape_fields = (set(ModelShape.__dataclass_fields__)
                    | {f"{g}.{f}" for g, t in OPTION_GROUPS.items()
                       for f in t.__dataclass_fields__})
    tables = {**{a: t | hp.GGUF_GLOBAL for a, t in hp.GGUF.items()}, **hp.HF}
    for name, t in tables.items():
        for key, e in t.items():
            assert e.kind in (hp.USED, hp.REFUSED, hp.INERT), (name, key)
            assert set(e.fields) <= shape_fields, (name, key)
            assert e.kind != hp.USED or e.fields, (name, key)
            assert e.kind == hp.USED or e.why, (name, key)
            if isinstance(e.ok, hp.SameAs):
                assert e.ok.key in t or e.ok.key.startswith("general."), (name, key)
    for mt, cls in HF_CLASSES.items():
        sig = inspect.signature(getattr(transformers, cls).__init__).parameters
        for key, e in hp.HF[mt].items():
            if e.default is not hp.NO_DEFAULT and key in sig:
                assert sig[key].default == e.default, (mt, key)


# ---- GGUF and config.json writers -------------------------------------------------------------
GGUF_SHAPES = {"qwen3moe": TINY, "llama": MIXTRAL_TINY, "gpt-oss": GPT_OSS_TINY,
               "glm4moe": GLM_TINY, "deepseek2": DS_TINY, "minimax-m2": MINIMAX_TINY,
               "qwen3next": QWEN3NEXT_TINY, "qwen35moe": QWEN35MOE_TINY}


def base_gguf(arch: str) -> dict:
    """The metadata convert_hf_to_gguf.py writes for the tiny model of `arch` (suffixes)."""
    s = GGUF_SHAPES[arch]
    m = {"context_length": 512, "embedding_length": s.d_model, "block_count": s.n_layer,
         "attention.head_count": s.n_head, "attention.head_count_kv": s.n_kv_head,
         "attention.key_length": s.head_dim, "attention.value_length": s.head_dim,
         "rope.freq_base": s.rope_theta, "attention.layer_norm_rms_epsilon": s.rms_eps,
         "expert_count": s.n_expert, "expert_used_count": s.top_k, "vocab_size": s.vocab,
         "feed_forward_length": 4 * s.d_model, "general.file_type": 32,
         "general.quantization_version": 2}
    if arch == "qwen3moe":
        m["expert_feed_forward_length"] = s.d_expert
    elif arch == "llama":
        m |= {"feed_forward_length": s.d_expert, "rope.dimension_count": s.head_dim}
    elif arch == "gpt-oss":
        m |= {"expert_feed_forward_length": s.d_expert, "feed_forward_length": s.d_expert,
              "attention.sliding_window": s.window.size, "rope.scaling.type": "yarn",
              "rope.scaling.factor": s.yarn.factor,
              "rope.scaling.original_context_length": s.yarn.orig_ctx,
              "swiglu_clamp_exp": [s.opts.swiglu_limit] * s.n_layer}
    elif arch in ("qwen3next", "qwen35moe"):   # conversion/qwen.py's Qwen3NextModel
        lin = s.linear
        m |= {"expert_feed_forward_length": s.d_expert,
              "expert_shared_feed_forward_length": s.dense.shared * s.d_expert,
              "rope.dimension_count": s.rot_dim, "ssm.conv_kernel": lin.conv_kernel,
              "ssm.state_size": lin.k_head_dim, "ssm.group_count": lin.n_k_head,
              "ssm.time_step_rank": lin.n_v_head, "ssm.inner_size": lin.n_v_head * lin.v_head_dim,
              "attention.recurrent_layers": [s.layer_kind(l) == "linear"
                                             for l in range(s.n_layer)],
              "full_attention_interval": lin.full_interval}
        if arch == "qwen35moe":
            m["rope.dimension_sections"] = [11, 11, 10, 0]
    elif arch == "minimax-m2":   # conversion/minimax.py's MiniMaxM2Model (scoring_func sigmoid)
        m |= {"feed_forward_length": s.d_expert, "expert_feed_forward_length": s.d_expert,
              "rope.dimension_count": s.rot_dim, "expert_gating_func": 2}
    else:   # the family
        m |= {"feed_forward_length": s.dense.d_ff, "expert_feed_forward_length": s.d_expert,
              "expert_shared_count": s.dense.shared, "leading_dense_block_count": s.dense.lead,
              "expert_weights_scale": s.router.scale, "expert_weights_norm": s.norm_topk_prob,
              "expert_gating_func": 2, "expert_group_count": s.router.n_group,
              "expert_group_used_count": s.router.topk_group, "rope.dimension_count": s.rot_dim}
        if arch == "glm4moe":
            m["nextn_predict_layers"] = 0
        else:   # deepseek2, the newer MLA layout
            a = s.mla
            m |= {"attention.q_lora_rank": a.q_lora, "attention.kv_lora_rank": a.kv_lora,
                  "attention.head_count_kv": 1, "attention.key_length": a.kv_lora + a.qk_rope,
                  "attention.value_length": a.kv_lora, "attention.key_length_mla": s.head_dim,
                  "attention.value_length_mla": a.v_head_dim}
    return m


_names = itertools.count()


def _vt(v):
    import gguf
    T = gguf.GGUFValueType
    if isinstance(v, bool):
        return T.BOOL
    if isinstance(v, int):
        return T.INT32 if v < 0 else T.UINT32
    return T.FLOAT32 if isinstance(v, float) else T.STRING


def write_gguf(d, arch: str, meta: dict):
    """A GGUF of `meta` (suffixes of "{arch}.", or whole general.* / split.* keys) and a token
    embedding (all the shape readers look at); the audit runs before any other tensor is read."""
    import gguf
    path = d / f"m{next(_names)}.gguf"
    w = gguf.GGUFWriter(str(path), arch)
    for k, v in meta.items():
        key = k if k.startswith(hp.GLOBAL_PREFIXES) else f"{arch}.{k}"
        if isinstance(v, (list, tuple)):
            w.add_key_value(key, list(v), gguf.GGUFValueType.ARRAY, sub_type=_vt(v[0]))
        else:
            w.add_key_value(key, v, _vt(v))
    w.add_tensor("token_embd.weight", np.zeros((GGUF_SHAPES[arch].vocab, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def gguf_read(d, arch: str, meta: dict) -> ModelShape:
    from strata.gguf_file import open_gguf
    from strata.packs.from_gguf import gguf_shape
    p = write_gguf(d, arch, meta)
    return gguf_shape(open_gguf(p), p)


HF_SHAPES = {"qwen3_moe": TINY, "mixtral": MIXTRAL_TINY, "gpt_oss": GPT_OSS_TINY,
             "glm4_moe": GLM_TINY, "deepseek_v3": DS_TINY, "minimax_m2": MINIMAX_TINY,
             "qwen3_next": QWEN3NEXT_TINY, "qwen3_5_moe_text": QWEN35MOE_TINY,
             "qwen3_5_moe": QWEN35MOE_TINY}


def base_hf(model_type: str) -> dict:
    """config.json of the tiny model of `model_type`, as transformers 5 writes it."""
    s = HF_SHAPES[model_type]
    kw = dict(vocab_size=s.vocab, hidden_size=s.d_model, num_hidden_layers=s.n_layer,
              num_attention_heads=s.n_head, num_key_value_heads=s.n_kv_head,
              num_experts_per_tok=s.top_k, rms_norm_eps=s.rms_eps, max_position_embeddings=512,
              tie_word_embeddings=False)
    rope = {"rope_type": "default", "rope_theta": s.rope_theta}
    if model_type == "qwen3_moe":
        kw |= dict(intermediate_size=4 * s.d_model, moe_intermediate_size=s.d_expert,
                   head_dim=s.head_dim, num_experts=s.n_expert, norm_topk_prob=True)
    elif model_type == "mixtral":
        kw |= dict(intermediate_size=s.d_expert, head_dim=s.head_dim,
                   num_local_experts=s.n_expert, sliding_window=None)
    elif model_type == "gpt_oss":
        kw |= dict(intermediate_size=s.d_expert, head_dim=s.head_dim,
                   num_local_experts=s.n_expert, sliding_window=s.window.size,
                   swiglu_limit=s.opts.swiglu_limit, max_position_embeddings=s.max_pos)
        y = s.yarn
        rope = {"rope_type": "yarn", "rope_theta": s.rope_theta, "factor": y.factor,
                "beta_fast": y.beta_fast, "beta_slow": y.beta_slow,
                "truncate": y.truncate, "original_max_position_embeddings": y.orig_ctx}
    elif model_type == "qwen3_5_moe":   # the release's folder: the text model in text_config
        return _hf_config(model_type, text_config=base_hf("qwen3_5_moe_text")).to_dict()
    elif model_type in ("qwen3_next", "qwen3_5_moe_text"):
        from tests.models.hf_qwen3next import config_kwargs
        kw = config_kwargs(s) | dict(max_position_embeddings=512)
        rope = kw.pop("rope_parameters")
    elif model_type == "minimax_m2":
        kw |= dict(intermediate_size=s.d_expert, head_dim=s.head_dim,
                   num_local_experts=s.n_expert, rotary_dim=s.rot_dim)
        rope["partial_rotary_factor"] = s.rot_dim / s.head_dim
    else:
        from tests.models.hf_family import _config
        return _config(s).to_dict()
    return _hf_config(model_type, rope_parameters=rope, **kw).to_dict()


def _text_kwargs(s: ModelShape) -> dict:
    from tests.models.hf_qwen3next import config_kwargs
    return config_kwargs(s) | dict(max_position_embeddings=512)


def hf_read(cfg: dict) -> ModelShape:
    """What strata.packs.from_hf.hf_to_pack reads from `cfg`: the audit, then the reader."""
    from strata.archs.registry import by_hf
    from strata.packs.file import check_shape
    hp.audit_hf(cfg, "cfg")
    s = by_hf(cfg["model_type"], "cfg").hf_shape(cfg, "cfg")
    check_shape(s, "cfg")
    return s


def hf_with(cfg: dict, key: str, value) -> dict:
    """cfg with field `key` (a "rope_parameters.<sub>" too) set, or dropped when value is DROP."""
    out = json.loads(json.dumps(cfg))
    if key.startswith(hp.ROPE):
        d, k = out.setdefault("rope_parameters", {}), key[len(hp.ROPE):]
    else:
        d, k = out, key
    if value is DROP:
        d.pop(k, None)
    else:
        d[k] = value
    return out


DROP = object()


def _with(meta: dict, changes: dict) -> dict:
    out = dict(meta)
    for k, v in changes.items():
        if v is DROP:
            out.pop(k, None)
        else:
            out[k] = v
    return out


# ---- (b) used keys change their fields ---------------------------------------------------------
# key -> (new value, changes that go with it, changes made to both files) -- the second keeps
# the model valid (a wider head's values), the third makes the key the one that counts
_DS_YARN = {"rope.scaling.type": "yarn", "rope.scaling.factor": 40.0,
            "rope.scaling.original_context_length": 32, "rope.scaling.yarn_log_multiplier": 0.1,
            "rope.scaling.yarn_beta_fast": 32.0, "rope.scaling.yarn_beta_slow": 1.0}
GGUF_CASES = {
    "embedding_length": (128, {}), "block_count": (3, {}), "expert_count": (16, {}),
    "expert_used_count": (4, {}), "attention.head_count": (8, {}),
    "attention.head_count_kv": (4, {}), "rope.freq_base": (5e5, {}),
    "attention.key_length": (32, {"attention.value_length": 32}),
    "attention.layer_norm_rms_epsilon": (1e-3, {}), "expert_feed_forward_length": (64, {}),
}
_HYBRID_GGUF_CASES = {
    "rope.dimension_count": (8, {}), "expert_shared_feed_forward_length": (64, {}),
    "ssm.conv_kernel": (3, {}), "ssm.state_size": (32, {}), "ssm.group_count": (4, {}),
    "ssm.time_step_rank": (8, {"ssm.inner_size": 128}), "ssm.inner_size": (128, {}),
    "attention.recurrent_layers": ([True, False, True, False], {}),
    "full_attention_interval": (2, {}, {"attention.recurrent_layers": DROP})}
GGUF_ARCH_CASES = {
    "llama": {"feed_forward_length": (64, {}),
              "attention.key_length": (32, {"attention.value_length": 32,
                                            "rope.dimension_count": 32})},
    "gpt-oss": {"block_count": (4, {}),
                "expert_feed_forward_length": (32, {}), "attention.sliding_window": (3, {}),
                "attention.sliding_window_pattern": (3, {}),
                "swiglu_clamp_exp": ([3.0] * 3, {}), "rope.scaling.type": ("none", {}),
                "rope.scaling.factor": (16.0, {}),
                "rope.scaling.original_context_length": (2048, {}),
                "rope.scaling.yarn_beta_fast": (16.0, {}),
                "rope.scaling.yarn_beta_slow": (2.0, {})},
    "glm4moe": {"block_count": (4, {}), "expert_count": (32, {}),
                "expert_used_count": (3, {}), "nextn_predict_layers": (1, {}), "expert_group_count": (2, {}),
                "expert_group_used_count": (1, {}), "feed_forward_length": (128, {}),
                "leading_dense_block_count": (2, {}), "expert_shared_count": (2, {}),
                "expert_weights_scale": (1.5, {}), "expert_weights_norm": (False, {}),
                "rope.dimension_count": (4, {})},
    "deepseek2": {"block_count": (4, {}), "expert_count": (32, {}),
                  "expert_used_count": (3, {}), "nextn_predict_layers": (1, {}), "expert_group_count": (2, {}),
                  "expert_group_used_count": (1, {}), "feed_forward_length": (128, {}),
                  "leading_dense_block_count": (2, {}), "expert_shared_count": (2, {}),
                  "expert_weights_scale": (1.5, {}), "expert_weights_norm": (False, {}),
                  "attention.key_length_mla": (32, {}), "attention.value_length_mla": (24, {}),
                  "attention.key_length": (32, {}, {"attention.key_length_mla": DROP}),
                  "attention.value_length": (24, {}, {"attention.value_length_mla": DROP}),
                  "attention.q_lora_rank": (16, {}), "attention.kv_lora_rank": (16, {}),
                  "rope.dimension_count": (4, {}),
                  # YaRN as convert_hf_to_gguf.py writes DeepSeek-V3's (hf_family.DS_YARN)
                  "rope.scaling.type": ("yarn", {k: v for k, v in _DS_YARN.items()
                                                 if k != "rope.scaling.type"}),
                  **{k: (v, {}, _DS_YARN) for k, v in (
                      ("rope.scaling.factor", 16.0),
                      ("rope.scaling.original_context_length", 64),
                      ("rope.scaling.yarn_beta_fast", 16.0), ("rope.scaling.yarn_beta_slow", 2.0),
                      ("rope.scaling.yarn_log_multiplier", 0.0707),
                      ("rope.scaling.attn_factor", 1.5))}},
    "minimax-m2": {"expert_feed_forward_length": (64, {"feed_forward_length": 64}),
                   "rope.dimension_count": (4, {})},
    "qwen3next": _HYBRID_GGUF_CASES,
    "qwen35moe": _HYBRID_GGUF_CASES,
}


def _used(tables: dict):
    return [(name, key) for name, t in tables.items() for key, e in t.items()
            if e.kind == hp.USED and e.fields != ("arch",)]


def _gguf_case(arch, key):
    return GGUF_ARCH_CASES.get(arch, {}).get(key) or GGUF_CASES.get(key)


@pytest.mark.parametrize("arch,key", _used(hp.GGUF), ids=_ids)
def test_gguf_used_key_sets_its_fields(arch, key, tmp_path):
    case = _gguf_case(arch, key)
    assert case is not None, f"a used key needs a case here: {arch} {key}"
    value, co, pre = (*case, {})[:3]
    base = _with(base_gguf(arch), pre)
    a = gguf_read(tmp_path, arch, base)
    b = gguf_read(tmp_path, arch, _with(base, {**co, key: value}))
    for f in hp.GGUF[arch][key].fields:
        assert a.field(f) != b.field(f), (key, f)


HF_CASES = {
    "vocab_size": 512, "hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 8,
    "num_key_value_heads": 4, "head_dim": 32, "rms_norm_eps": 1e-3, "num_experts_per_tok": 4,
    "rope_theta": 5e5, hp.ROPE + "rope_theta": 5e5, "moe_intermediate_size": 64,
    "intermediate_size": 128, "num_experts": 16, "num_local_experts": 16,
    "norm_topk_prob": False,
}
# (model_type, key) -> (value, other changes)
HF_ARCH_CASES = {
    "qwen3_moe": {"num_local_experts": (16, {}, {"num_experts": DROP})},
    "mixtral": {"intermediate_size": (64, {})},
    "gpt_oss": {"intermediate_size": (32, {}), "sliding_window": (3, {}),
                "num_hidden_layers": (4, {"layer_types": ["sliding_attention",
                                                          "full_attention"] * 2}),
                "layer_types": (["sliding_attention", "sliding_attention", "full_attention"],
                                {}),
                "swiglu_alpha": (1.0, {}), "swiglu_limit": (3.0, {}),
                hp.ROPE + "rope_type": ("default", {}),
                hp.ROPE + "type": ("default", {}, {hp.ROPE + "rope_type": DROP,
                                                   hp.ROPE + "type": "yarn"}),
                hp.ROPE + "factor": (16.0, {}),
                hp.ROPE + "original_max_position_embeddings": (2048, {}),
                hp.ROPE + "beta_fast": (16.0, {}), hp.ROPE + "beta_slow": (2.0, {}),
                hp.ROPE + "truncate": (True, {})},
    "glm4_moe": {"attention_bias": (False, {}), "use_qk_norm": (True, {}),
                 "partial_rotary_factor": (0.25, {}, {hp.ROPE + "partial_rotary_factor": DROP,
                                                      "partial_rotary_factor": 0.5}),
                 hp.ROPE + "partial_rotary_factor": (0.25, {})},
    # rotary_dim counts only without a partial_rotary_factor (transformers' order)
    "minimax_m2": {"rotary_dim": (4, {}, {hp.ROPE + "partial_rotary_factor": DROP}),
                   "partial_rotary_factor": (0.25, {}, {hp.ROPE + "partial_rotary_factor": DROP,
                                                        "partial_rotary_factor": 0.5}),
                   hp.ROPE + "partial_rotary_factor": (0.25, {})},
    "deepseek_v3": {"num_attention_heads": (8, {"num_key_value_heads": 8}),
                    "qk_nope_head_dim": (24, {}), "qk_rope_head_dim": (4, {}),
                    "v_head_dim": (24, {}), "q_lora_rank": (16, {}), "kv_lora_rank": (16, {}),
                    "n_routed_experts": (8, {}),
                    # YaRN (hf_family.DS_YARN) on top of the plain base, then each of its fields
                    hp.ROPE + "rope_type": ("yarn", {hp.ROPE + k: v for k, v in DS_YARN.items()
                                                     if k != "rope_type"}),
                    hp.ROPE + "type": ("yarn", {hp.ROPE + k: v for k, v in DS_YARN.items()
                                                if k != "rope_type"},
                                       {hp.ROPE + "rope_type": DROP}),
                    **{hp.ROPE + k: (v, {}, {hp.ROPE + k: v for k, v in DS_YARN.items()})
                       for k, v in (("factor", 16.0), ("original_max_position_embeddings", 64),
                                    ("beta_fast", 16.0), ("beta_slow", 2.0), ("truncate", False),
                                    ("mscale", 0.707), ("mscale_all_dim", 0.707),
                                    ("attention_factor", 0.9))}},
}
_HYBRID_HF_CASES = {
    "num_hidden_layers": (8, {"layer_types": DROP}), "moe_intermediate_size": (16, {}),
    "shared_expert_intermediate_size": (64, {}),
    "partial_rotary_factor": (0.25, {}, {hp.ROPE + "partial_rotary_factor": DROP,
                                         "partial_rotary_factor": 0.5}),
    hp.ROPE + "partial_rotary_factor": (0.5, {}),
    "linear_conv_kernel_dim": (3, {}), "linear_key_head_dim": (32, {}),
    "linear_value_head_dim": (32, {}), "linear_num_key_heads": (4, {}),
    "linear_num_value_heads": (8, {}),
    "layer_types": (["full_attention", "linear_attention"] * 2, {}),
    "full_attention_interval": (2, {})}
HF_ARCH_CASES["qwen3_next"] = _HYBRID_HF_CASES
# every field text_config's entry names moves: another text model
_OTHER_TEXT = QWEN35MOE_TINY.with_(n_layer=8, d_model=128, n_expert=16, d_expert=16, vocab=512,
                                   **{"linear.n_v_head": 8})
HF_ARCH_CASES["qwen3_5_moe"] = {"text_config": (None, {})}
HF_ARCH_CASES["qwen3_5_moe_text"] = _HYBRID_HF_CASES
_FAMILY_CASES = {"n_shared_experts": (2, {}), "routed_scaling_factor": (1.5, {}),
                 "n_group": (2, {}), "topk_group": (1, {}), "first_k_dense_replace": (2, {}),
                 "num_hidden_layers": (4, {}), "n_routed_experts": (8, {}),
                 "num_experts_per_tok": (3, {}),
                 "num_local_experts": (8, {}, {"n_routed_experts": DROP,
                                               "num_local_experts": 16})}
for _mt in ("glm4_moe", "deepseek_v3"):
    HF_ARCH_CASES[_mt] = _FAMILY_CASES | HF_ARCH_CASES[_mt]


def _hf_case(mt, key):
    if (mt, key) == ("qwen3_5_moe", "text_config"):   # built here: it needs the writer
        return _hf_config("qwen3_5_moe_text", **_text_kwargs(_OTHER_TEXT)).to_dict(), {}
    c = HF_ARCH_CASES.get(mt, {}).get(key)
    return c if c is not None or key not in HF_CASES else (HF_CASES[key], {})


def _hf_used():
    return _used({m: t for m, t in hp.HF.items() if m != "kimi_k2"})


@pytest.mark.parametrize("mt,key", _hf_used(), ids=_ids)
def test_hf_used_field_sets_its_fields(mt, key):
    case = _hf_case(mt, key)
    assert case is not None, f"a used field needs a case here: {mt} {key}"
    value, co, pre = (*case, {})[:3]
    base = base_hf(mt)
    for k, v in pre.items():
        base = hf_with(base, k, v)
    changed = base
    for k, v in {**co, key: value}.items():
        changed = hf_with(changed, k, v)
    a, b = hf_read(base), hf_read(changed)
    for f in hp.HF[mt][key].fields:
        assert a.field(f) != b.field(f), (key, f)


# what a default needs of the other keys to be a valid model (one group: one kept)
DEFAULT_PRE = {("deepseek2", "expert_group_count"): {"expert_group_used_count": 1},
               ("glm4moe", "expert_group_count"): {"expert_group_used_count": 1},
               ("glm4_moe", "n_group"): {"topk_group": 1}}


@pytest.mark.parametrize("arch,key", [(a, k) for a, k in _used(hp.GGUF)
                                      if hp.GGUF[a][k].default is not hp.NO_DEFAULT],
                         ids=_ids)
def test_gguf_absent_key_reads_as_its_default(arch, key, tmp_path):
    base = _with(base_gguf(arch), DEFAULT_PRE.get((arch, key), {}))
    a = gguf_read(tmp_path, arch, _with(base, {key: DROP}))
    b = gguf_read(tmp_path, arch, _with(base, {key: hp.GGUF[arch][key].default}))
    assert a == b


@pytest.mark.parametrize("mt,key", [(m, k) for m, k in _hf_used()
                                    if hp.HF[m][k].default is not hp.NO_DEFAULT],
                         ids=_ids)
def test_hf_absent_field_reads_as_transformers_default(mt, key):
    base = base_hf(mt)
    for k, v in DEFAULT_PRE.get((mt, key), {}).items():
        base = hf_with(base, k, v)
    assert hf_read(hf_with(base, key, DROP)) == hf_read(hf_with(base, key, hp.HF[mt][key].default))


# ---- (b) fields change the logits ------------------------------------------------------------
# fields the tensors pin (a wrong value reads tensors of the wrong shape: refused by the readers'
# shape checks, tests/test_fuzz_headers.py) and max_pos (a bound, never a computation)
PINNED = {"arch", "n_layer", "d_model", "n_expert", "d_expert", "n_head", "n_kv_head",
          "head_dim", "vocab", "dense.d_ff", "dense.lead", "dense.shared", "mla.q_lora",
          "mla.kv_lora", "mla.qk_rope", "mla.v_head_dim", "attn.qk_norm", "attn.bias",
          "max_pos", "linear.conv_kernel", "linear.n_k_head", "linear.n_v_head",
          "linear.k_head_dim", "linear.v_head_dim"}
LOGIT_CHANGES = {   # field -> its new value, from the tiny shape's
    "rope_theta": lambda s: s.rope_theta * 7, "rms_eps": lambda s: 0.3,
    "top_k": lambda s: s.top_k + 1, "norm_topk_prob": lambda s: not s.norm_topk_prob,
    "router.scale": lambda s: 1.0, "router.n_group": lambda s: 2,
    "router.topk_group": lambda s: 3, "window.size": lambda s: 3, "window.pattern": lambda s: 3,
    "opts.swiglu_alpha": lambda s: 1.0, "opts.swiglu_limit": lambda s: 1.0,
    "yarn": lambda s: None, "yarn.factor": lambda s: 8.0, "yarn.orig_ctx": lambda s: 64,
    "yarn.beta_fast": lambda s: 8.0, "yarn.beta_slow": lambda s: 4.0,
    "yarn.truncate": lambda s: not s.yarn.truncate, "attn.rope_dim": lambda s: 4,
    "yarn.attn": lambda s: 1.5, "yarn.kq": lambda s: 2.0,
    "linear.full_interval": lambda s: 2,
    "linear.layer_types": lambda s: ("full", "linear", "full", "linear"),
}
LOGIT_SHAPES = {"qwen3moe": TINY, "mixtral": MIXTRAL_TINY, "gpt-oss": GPT_OSS_TINY,
                "glm4moe": GLM_TINY,
                # with DeepSeek-V3's YaRN, so that its fields have something to change; the
                # correction range untruncated (over 4 rotary pairs whole dims hide the betas)
                "deepseek2": DS_TINY.with_(yarn=Yarn(40.0, 4096, truncate=False, attn=1.0,
                                                     kq=1.3689 ** 2)),
                "minimax-m2": MINIMAX_TINY,
                # RoPE on 8 of 16 dims, so that LOGIT_CHANGES' attn.rope_dim 4 is a change
                "qwen3next": QWEN3NEXT_TINY.with_(**{"attn.rope_dim": 8}),
                "qwen35moe": QWEN35MOE_TINY.with_(**{"attn.rope_dim": 8})}
_TABLES_OF = {"qwen3moe": ("qwen3moe", "qwen3_moe"), "mixtral": ("llama", "mixtral"),
              "gpt-oss": ("gpt-oss", "gpt_oss"), "glm4moe": ("glm4moe", "glm4_moe"),
              "deepseek2": ("deepseek2", "deepseek_v3"),
              "minimax-m2": ("minimax-m2", "minimax_m2"),
              "qwen3next": ("qwen3next", "qwen3_next"),
              "qwen35moe": ("qwen35moe", "qwen3_5_moe_text")}


def _fields_used(arch: str) -> set[str]:
    g, h = _TABLES_OF[arch]
    out = set()
    for name, t in ((g, hp.GGUF[g]), (h, hp.HF[h])):
        out |= {f for k, e in t.items() if e.kind == hp.USED
                for f in e.fields}
    return out


LOGIT_CASES = [(a, f) for a in LOGIT_SHAPES for f in sorted(_fields_used(a) - PINNED)]


def test_every_used_field_is_pinned_or_changes_the_logits():
    assert [(a, f) for a, f in LOGIT_CASES if f not in LOGIT_CHANGES] == []


TOKENS = torch.tensor([3, 250, 17, 17, 0, 128, 64, 9, 200, 31, 5, 77, 1, 42, 99, 7, 180])
_logits_cache: dict = {}


def _logits(shape: ModelShape) -> torch.Tensor:
    from strata.engine.load import load_model, resident_provider
    from strata.models.moe import expert_ffn
    from strata.packs.memory import MemoryPack
    from strata.packs.synth import ExpertFormats
    if shape not in _logits_cache:
        mem = MemoryPack(shape, ExpertFormats.of("BF16"), distinct=shape.n_expert, variants=2,
                         device="cpu")
        _logits_cache[shape] = load_model(mem, ffn=expert_ffn("ref")).prefill(
            TOKENS % shape.vocab, resident_provider(mem), chunk=None)
    return _logits_cache[shape]


@pytest.mark.parametrize("arch,field", LOGIT_CASES, ids=_ids)
def test_field_changes_the_logits(arch, field):
    s = LOGIT_SHAPES[arch]
    a, b = _logits(s), _logits(s.with_(**{field: LOGIT_CHANGES[field](s)}))
    assert torch.isfinite(a).all() and torch.isfinite(b).all()
    assert float((a - b).abs().max()) > 1e-4 * float(a.abs().max()), field


# ---- (c) refusals, (d) unknown keys: one line, exit 2 ----------------------------------------
SAMPLES = {"quantization_config": {"quant_method": "fp8"}, "general.type": "adapter",
           "hidden_act": "gelu", "scoring_func": "softmax", "topk_method": "greedy",
           "classifier.output_labels": ["yes", "no"],
           "rope.dimension_sections": [8, 8, 0, 0], "expert_weights_scale": 0.0,
           "attn_type_list": [0, 1]}


def _bad(key: str, e: hp.Hp, get):
    """A value strata does not implement for `key` (given the base file's other values)."""
    if key in SAMPLES:
        return SAMPLES[key]
    ok = e.ok
    if isinstance(ok, hp.SameAs):
        want = get(ok.key)
        want = ok.fallback(get) if want is None and ok.fallback else want
        return want + 8
    vals = [v for v in ok.values if v is not None and v != []]
    if not ok.values:
        return 1.0
    if not vals:
        return 8
    if isinstance(vals[0], bool):
        return not vals[0]
    if isinstance(vals[0], (int, float)):
        return max(vals) + (7 if all(isinstance(v, int) for v in vals) else 7.0)
    return next(s for s in ("yarn", "linear", "longrope") if s not in vals)


def _one_line_refusal(argv, capsys, *words):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, (w, err)
    return err


def _gguf_refusals():
    out = []
    for arch, t in hp.GGUF.items():
        for key, e in t.items():
            if e.ok is not None:
                out.append((arch, key, "value"))
            if e.missing:
                out.append((arch, key, "missing"))
    return out + [("qwen3moe", k, "value") for k, e in hp.GGUF_GLOBAL.items() if e.ok]


@pytest.mark.parametrize("arch,key,what", _gguf_refusals(), ids=_ids)
def test_gguf_refusal_is_one_line(arch, key, what, tmp_path, capsys):
    base = base_gguf(arch)
    e = hp.GGUF[arch].get(key) or hp.GGUF_GLOBAL[key]
    bad = DROP if what == "missing" else _bad(key, e, base.get)
    p = write_gguf(tmp_path, arch, _with(base, {key: bad}))
    _one_line_refusal(["pack", str(p), "-o", str(tmp_path / "x.pack")], capsys, key,
                      "missing" if what == "missing" else "but strata")


def test_gguf_per_layer_array_is_refused(tmp_path, capsys):
    p = write_gguf(tmp_path, "qwen3moe", _with(base_gguf("qwen3moe"), {"expert_used_count": [2, 2]}))
    _one_line_refusal(["pack", str(p), "-o", str(tmp_path / "x.pack")], capsys,
                      "qwen3moe.expert_used_count", "per-layer")


def _hf_refusals():
    out = []
    for mt, t in hp.HF.items():
        if mt == "kimi_k2":
            continue
        for key, e in t.items():
            if e.ok is not None:
                out.append((mt, key, "value"))
            if e.missing:
                out.append((mt, key, "missing"))
    return out


def _hf_folder(d, cfg: dict):
    f = d / f"hf{next(_names)}"
    f.mkdir()
    (f / "config.json").write_text(json.dumps(cfg))
    return f


@pytest.mark.parametrize("mt,key,what", _hf_refusals(), ids=_ids)
def test_hf_refusal_is_one_line(mt, key, what, tmp_path, capsys):
    base = base_hf(mt)
    e = hp.HF[mt][key]
    if what == "missing":
        cfg = hf_with(base, key, DROP)
        for k in e.also:
            cfg = hf_with(cfg, k, DROP)
    else:
        cfg = hf_with(base, key, _bad(key, e, hp.hf_fields(base).get))
    _one_line_refusal(["pack", str(_hf_folder(tmp_path, cfg)), "-o", str(tmp_path / "x.pack")],
                      capsys, key, "missing" if what == "missing" else "but strata")


@pytest.mark.parametrize("arch", sorted(hp.GGUF))
def test_unknown_gguf_key_is_refused(arch, tmp_path, capsys):
    p = write_gguf(tmp_path, arch, _with(base_gguf(arch), {"attention.scale": 0.125}))
    _one_line_refusal(["pack", str(p), "-o", str(tmp_path / "x.pack")], capsys,
                      f"{arch}.attention.scale", "not in strata's table")


@pytest.mark.parametrize("mt", sorted(HF_SHAPES))
def test_unknown_hf_field_is_refused(mt, tmp_path, capsys):
    cfg = hf_with(base_hf(mt), "attn_logit_softcapping", 50.0)
    _one_line_refusal(["pack", str(_hf_folder(tmp_path, cfg)), "-o", str(tmp_path / "x.pack")],
                      capsys, "attn_logit_softcapping", "not in strata's table")
    cfg = hf_with(base_hf(mt), hp.ROPE + "low_freq_factor", 1.0)
    _one_line_refusal(["pack", str(_hf_folder(tmp_path, cfg)), "-o", str(tmp_path / "x.pack")],
                      capsys, "rope_parameters.low_freq_factor")


def test_the_base_files_pass_the_audit(tmp_path):
    """Every writer's file of this test reads (so a refusal above is the key's, not the base's);
    general.* keys outside the table (a license, an author) and tokenizer.* keys are not the
    audit's."""
    for arch in hp.GGUF:
        gguf_read(tmp_path, arch, base_gguf(arch) | {"general.license": "mit"})
    for mt in HF_SHAPES:
        hf_read(base_hf(mt))
