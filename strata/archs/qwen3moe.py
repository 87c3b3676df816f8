"""Qwen3-MoE's record: its dense tensors (llama.cpp's qwen3moe names), and how the HF and GGUF
readers find them and its experts.

Legend: D hidden, E experts, F expert width, H query heads, Hkv kv heads, hd head dim.

HF (Qwen3MoeForCausalLM): experts per expert (`mlp.experts.<e>.{gate,up,down}_proj.weight`, what
save_pretrained writes) or fused (`mlp.experts.gate_up_proj` [E, 2F, D], gate rows first, and
`down_proj` [E, D, F], transformers 5's in-memory layout): strata.archs.hf_tensors.
GGUF (arch `qwen3moe`): 3-D `ffn_*_exps` experts (strata.archs.gguf_tensors); llama.cpp's
converter permutes nothing for qwen3moe (its RoPE is NEOX, HF's rotate-half), so q/k weights are
used as stored.
"""
from __future__ import annotations

import torch

from strata.archs.hf_config import config_fields
from strata.archs.gguf_tensors import field, layer_experts, rope_base
from strata.archs.attention_names import gqa_specs
from strata.archs.hf_tensors import HF_ATTENTION, hf_dense_tensor, layer_experts as hf_layer_experts
from strata.archs import hparams_gguf, hparams_hf
from strata.archs.record import Arch
from strata.errors import StrataError
from strata.models.qwen3moe import Qwen3Moe
from strata.shapes import ModelShape


def layer_specs(s: ModelShape, i: int) -> dict[str, tuple[int, ...]]:
    p = f"blk.{i}."
    return {p + "attn_norm.weight": (s.d_model,)} | gqa_specs(s, p, qk_norm="head") | {
        p + "ffn_norm.weight": (s.d_model,),            # [D]
        p + "ffn_gate_inp.weight": (s.n_expert, s.d_model),  # router [E, D]
    }


# ---- Hugging Face ------------------------------------------------------------------------------
_DENSE = HF_ATTENTION | {  # pack name (minus "blk.N.") -> HF name (minus "model.layers.N.")
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate_inp.weight": "mlp.gate.weight",
}


def hf_shape(cfg: dict, where) -> ModelShape:
    if cfg.get("mlp_only_layers") or cfg.get("decoder_sparse_step", 1) != 1:
        raise StrataError(f"{where}: dense MLP layers (mlp_only_layers/decoder_sparse_step) are not "
                          f"supported; every layer must be MoE")
    with config_fields(where):
        H = cfg["num_attention_heads"]
        rope = cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)
        return ModelShape(
            arch="qwen3moe", n_layer=cfg["num_hidden_layers"], d_model=cfg["hidden_size"],
            n_expert=cfg.get("num_experts") or cfg["num_local_experts"],
            top_k=cfg["num_experts_per_tok"], d_expert=cfg["moe_intermediate_size"], n_head=H,
            n_kv_head=cfg.get("num_key_value_heads", H),
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // H, vocab=cfg["vocab_size"],
            rope_theta=float(rope), rms_eps=float(cfg["rms_norm_eps"]),
            norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),   # Qwen3MoeConfig's default
            max_pos=cfg.get("max_position_embeddings", 40960))


def hf_dense(ts, name: str) -> torch.Tensor:
    return hf_dense_tensor(ts, name, _DENSE)


def hf_experts(ts, i: int, s: ModelShape):
    """(gate [E, F, D], up [E, F, D], down [E, D, F], None: no biases) of layer i."""
    return (*hf_layer_experts(ts, i, s), None)


# ---- GGUF --------------------------------------------------------------------------------------
def gguf_shape(r, path) -> ModelShape:
    a = "qwen3moe"
    tensors = {t.name: t for t in r.tensors}
    D = int(field(r, f"{a}.embedding_length"))
    H = int(field(r, f"{a}.attention.head_count"))
    if "token_embd.weight" not in tensors:
        raise StrataError(f"{path} has no token_embd.weight")
    V = int(tensors["token_embd.weight"].shape[1])
    return ModelShape(
        arch="qwen3moe", n_layer=int(field(r, f"{a}.block_count")), d_model=D,
        n_expert=int(field(r, f"{a}.expert_count")), top_k=int(field(r, f"{a}.expert_used_count")),
        d_expert=int(field(r, f"{a}.expert_feed_forward_length")), n_head=H,
        n_kv_head=int(field(r, f"{a}.attention.head_count_kv", H)),
        head_dim=int(field(r, f"{a}.attention.key_length", D // H)), vocab=V,
        rope_theta=float(f"{float(rope_base(r, a, path)):.7g}"),
        rms_eps=float(f"{float(field(r, f'{a}.attention.layer_norm_rms_epsilon')):.7g}"),
        max_pos=int(field(r, f"{a}.context_length", 40960)))


def gguf_experts(tensors: dict, i: int, s: ModelShape, src):
    """Layer i's ([gate, up, down] expert bytes, format names, None: no biases)."""
    return (*layer_experts(tensors, i, s, src), None)


QWEN3MOE = Arch(
    name="qwen3moe", hf_types=("qwen3_moe",), gguf_archs=("qwen3moe",), wiring=Qwen3Moe,
    layer_specs=layer_specs, hf_shape=hf_shape, hf_dense=hf_dense, hf_experts=hf_experts,
    gguf_shape=gguf_shape, gguf_experts=gguf_experts, gguf_hparams=hparams_gguf.QWEN3MOE,
    hf_hparams=hparams_hf.QWEN3_MOE)
