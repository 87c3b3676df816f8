"""How the HF folder reader reads GLM-4.5 (`glm4_moe`) and DeepSeek-V3 / Kimi-K2
(`deepseek_v3`, `kimi_k2`) checkpoints: config.json -> ModelShape, the dense tensors' HF names,
the experts (strata.archs.hf_tensors). Leading dense layers carry no blobs; shared experts and
the correction bias are dense tensors (strata.archs.family_names)."""
from __future__ import annotations

from strata.archs.hf_config import config_fields
from strata.archs.hf_tensors import HF_ATTENTION, hf_dense_tensor, layer_experts
from strata.errors import StrataError
from strata.shapes import Attn, DenseFfn, Mla, ModelShape, Router, Yarn

_DENSE = HF_ATTENTION | {  # pack name (minus "blk.N.") -> HF name (minus "model.layers.N.")
    "attn_q_a.weight": "self_attn.q_a_proj.weight",
    "attn_q_a_norm.weight": "self_attn.q_a_layernorm.weight",
    "attn_q_b.weight": "self_attn.q_b_proj.weight",
    "attn_kv_a_mqa.weight": "self_attn.kv_a_proj_with_mqa.weight",
    "attn_kv_a_norm.weight": "self_attn.kv_a_layernorm.weight",
    "attn_kv_b.weight": "self_attn.kv_b_proj.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate_inp.weight": "mlp.gate.weight",
    "exp_probs_b.bias": "mlp.gate.e_score_correction_bias",
} | {f"ffn_{w}.weight": f"mlp.{w}_proj.weight" for w in ("gate", "up", "down")
          } | {f"ffn_{w}_shexp.weight": f"mlp.shared_experts.{w}_proj.weight"
               for w in ("gate", "up", "down")}


def hf_yarn_ds(cfg: dict, rope: dict, where) -> Yarn | None:
    """DeepseekV3's rope scaling as transformers reads it (None: plain RoPE):
    YaRN's frequencies over qk_rope_head_dim from factor (default max_position_embeddings /
    original_max_position_embeddings), original_max_position_embeddings, beta_fast / beta_slow
    and truncate; cos/sin and the softmax scale from mscale / mscale_all_dim / attention_factor
    (strata.rope_scaling.deepseek_yarn)."""
    from strata.rope_scaling import deepseek_yarn
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind in ("default", None):
        return None
    if kind != "yarn":
        raise StrataError(f"{where}: rope scaling {kind!r} is not implemented (strata reads "
                          f"DeepSeek with plain RoPE or yarn)")
    orig = int(rope["original_max_position_embeddings"])
    factor = float(rope.get("factor") or cfg["max_position_embeddings"] / orig)
    attn, kq = deepseek_yarn(factor, rope.get("mscale"), rope.get("mscale_all_dim"),
                             rope.get("attention_factor"))
    return Yarn(factor, orig, beta_fast=float(rope.get("beta_fast") or 32.0),
                beta_slow=float(rope.get("beta_slow") or 1.0),
                truncate=bool(rope.get("truncate", True)), attn=attn, kq=kq)


def hf_shape_glm(cfg: dict, where) -> ModelShape:
    return _hf_shape(cfg, where, "glm4moe")


def hf_shape_ds(cfg: dict, where) -> ModelShape:
    return _hf_shape(cfg, where, "deepseek2")


def _hf_shape(cfg: dict, where, arch: str) -> ModelShape:
    mt = cfg.get("model_type")
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if arch != "deepseek2" and kind not in ("default", None):
        raise StrataError(f"{where}: rope scaling {kind!r} is not implemented (strata runs "
                          f"plain RoPE for {mt})")
    with config_fields(where):
        H = cfg["num_attention_heads"]
        theta = cfg.get("rope_theta") or rope.get("rope_theta", 10000.0)
        common = dict(
            n_layer=cfg["num_hidden_layers"], d_model=cfg["hidden_size"],
            n_expert=cfg.get("n_routed_experts") or cfg["num_local_experts"],
            top_k=cfg["num_experts_per_tok"], d_expert=cfg["moe_intermediate_size"], n_head=H,
            vocab=cfg["vocab_size"], rope_theta=float(theta), rms_eps=float(cfg["rms_norm_eps"]),
            norm_topk_prob=bool(cfg.get("norm_topk_prob", True)),
            max_pos=cfg.get("max_position_embeddings", 40960),
            dense=DenseFfn(int(cfg.get("first_k_dense_replace", 0)),
                           int(cfg["intermediate_size"]), int(cfg.get("n_shared_experts") or 0)),
            router=Router("sigmoid", int(cfg.get("n_group") or 1),
                          int(cfg.get("topk_group") or 1),
                          float(cfg.get("routed_scaling_factor", 1.0))))
        if arch == "glm4moe":
            hd = cfg.get("head_dim") or cfg["hidden_size"] // H
            prf = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
            return ModelShape(arch="glm4moe", n_kv_head=cfg.get("num_key_value_heads", H),
                              head_dim=hd,
                              attn=Attn(qk_norm=bool(cfg.get("use_qk_norm", False)),
                                        bias=bool(cfg.get("attention_bias", False)),
                                        rope_dim=int(hd * prf)), **common)
        if not cfg.get("rope_interleave", True):
            raise StrataError(f"{where}: rope_interleave false is not implemented; strata's "
                              f"deepseek2 rotates interleaved pairs (as llama.cpp)")
        return ModelShape(arch="deepseek2", n_kv_head=H,
                          head_dim=cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"],
                          mla=Mla(int(cfg.get("q_lora_rank") or 0), cfg["kv_lora_rank"],
                                  cfg["qk_rope_head_dim"], cfg["v_head_dim"]),
                          yarn=hf_yarn_ds(cfg, rope, where), **common)


def hf_dense(ts, name: str):
    """The HF tensor of pack dense tensor `name` (a layer's or a global one)."""
    return hf_dense_tensor(ts, name, _DENSE)


def hf_experts(ts, i: int, s: ModelShape):
    """(gate [E, F, D], up [E, F, D], down [E, D, F], None: no biases) of MoE layer i."""
    return (*layer_experts(ts, i, s), None)
