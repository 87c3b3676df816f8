"""MiniMax-M2's record: its dense tensors (llama.cpp's minimax-m2 names), and how the HF and GGUF
readers find them and its experts.

Legend: D hidden, E experts, F expert width, H query heads, Hkv kv heads, hd head dim, R rotary
dims.

HF (MiniMaxM2ForCausalLM): the release (and save_pretrained) stores Mixtral's layout,
`block_sparse_moe.gate.weight` (router), `block_sparse_moe.e_score_correction_bias` and
per-expert `block_sparse_moe.experts.<e>.w1/w3/w2.weight`; transformers 5's in-memory names are
`mlp.gate.weight`, `mlp.e_score_correction_bias` and fused `mlp.experts.gate_up_proj` /
`down_proj`. Both are read (the experts as strata.archs.mixtral reads them). The q/k norms are
one weight over the whole projection (`self_attn.q_norm.weight` [H*hd], `k_norm` [Hkv*hd]). The
rotary width: rope_parameters.partial_rotary_factor, else a top-level partial_rotary_factor,
else the release's `rotary_dim` / head_dim, else the whole head (transformers' order).

GGUF (arch `minimax-m2`): 3-D `ffn_*_exps` experts sized by feed_forward_length in llama.cpp's
loader (equal to expert_feed_forward_length, which strata reads), `exp_probs_b.bias` the
correction bias, `rope.dimension_count` the rotary width; the converter permutes nothing
(llama.cpp runs NEOX RoPE for it, HF's rotate-half).
"""
from __future__ import annotations

import torch

from strata.archs import hparams_gguf, hparams_hf
from strata.archs.hf_config import config_fields
from strata.archs.gguf_tensors import field, layer_experts, rope_base
from strata.archs.attention_names import gqa_specs
from strata.archs.hf_tensors import HF_ATTENTION, hf_dense_tensor
from strata.archs.mixtral import hf_experts as mixtral_hf_experts
from strata.archs.record import Arch
from strata.errors import StrataError
from strata.models.minimax_m2 import MiniMaxM2
from strata.shapes import Attn, ModelShape, Router

ARCH = "minimax-m2"


def layer_specs(s: ModelShape, i: int) -> dict[str, tuple[int, ...]]:
    p = f"blk.{i}."
    return {p + "attn_norm.weight": (s.d_model,)} | gqa_specs(s, p, qk_norm="whole") | {
        p + "ffn_norm.weight": (s.d_model,),            # [D]
        p + "ffn_gate_inp.weight": (s.n_expert, s.d_model),  # router [E, D]
        p + "exp_probs_b.bias": (s.n_expert,),          # [E] e_score_correction_bias
    }


# ---- Hugging Face ------------------------------------------------------------------------------
_DENSE = HF_ATTENTION | {  # pack name (minus "blk.N.") -> HF name(s) (minus "model.layers.N.")
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate_inp.weight": ("block_sparse_moe.gate.weight", "mlp.gate.weight"),
    "exp_probs_b.bias": ("block_sparse_moe.e_score_correction_bias",
                         "mlp.e_score_correction_bias"),
}


def rotary_fraction(cfg: dict, rope: dict, hd: int) -> float:
    """The rotated share of a head as transformers reads it (see the module doc)."""
    prf = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor"))
    if prf is not None:
        return float(prf)
    rd = cfg.get("rotary_dim")
    return float(rd) / hd if rd is not None else 1.0


def hf_shape(cfg: dict, where) -> ModelShape:
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    with config_fields(where):
        H, D = cfg["num_attention_heads"], cfg["hidden_size"]
        hd = cfg.get("head_dim") or D // H
        theta = cfg.get("rope_theta") or rope.get("rope_theta", 5_000_000.0)
        return ModelShape(
            arch=ARCH, n_layer=cfg["num_hidden_layers"], d_model=D,
            n_expert=cfg.get("num_local_experts") or cfg["num_experts"],
            top_k=cfg["num_experts_per_tok"], d_expert=cfg["intermediate_size"], n_head=H,
            n_kv_head=cfg.get("num_key_value_heads") or H, head_dim=hd,
            vocab=cfg["vocab_size"], rope_theta=float(theta),
            rms_eps=float(cfg["rms_norm_eps"]), norm_topk_prob=True,
            max_pos=cfg.get("max_position_embeddings", 196608), router=Router("sigmoid"),
            attn=Attn(rope_dim=int(hd * rotary_fraction(cfg, rope, hd))))


def hf_dense(ts, name: str) -> torch.Tensor:
    return hf_dense_tensor(ts, name, _DENSE)


def hf_experts(ts, i: int, s: ModelShape):
    """(gate [E, F, D], up [E, F, D], down [E, D, F], None: no biases) of layer i: per-expert
    w1/w3/w2 or transformers 5's fused gate_up_proj / down_proj (Mixtral's layouts)."""
    return mixtral_hf_experts(ts, i, s)


# ---- GGUF --------------------------------------------------------------------------------------
def gguf_shape(r, path) -> ModelShape:
    a = ARCH
    tensors = {t.name: t for t in r.tensors}
    D = int(field(r, f"{a}.embedding_length"))
    H = int(field(r, f"{a}.attention.head_count"))
    if "token_embd.weight" not in tensors:
        raise StrataError(f"{path} has no token_embd.weight")
    hd = int(field(r, f"{a}.attention.key_length", D // H))
    return ModelShape(
        arch=ARCH, n_layer=int(field(r, f"{a}.block_count")), d_model=D,
        n_expert=int(field(r, f"{a}.expert_count")), top_k=int(field(r, f"{a}.expert_used_count")),
        d_expert=int(field(r, f"{a}.expert_feed_forward_length")), n_head=H,
        n_kv_head=int(field(r, f"{a}.attention.head_count_kv", H)), head_dim=hd,
        vocab=int(tensors["token_embd.weight"].shape[1]),
        rope_theta=float(f"{float(rope_base(r, a, path)):.7g}"),
        rms_eps=float(f"{float(field(r, f'{a}.attention.layer_norm_rms_epsilon')):.7g}"),
        norm_topk_prob=True, max_pos=int(field(r, f"{a}.context_length", 196608)),
        router=Router("sigmoid"),
        attn=Attn(rope_dim=int(field(r, f"{a}.rope.dimension_count", hd))))


def gguf_experts(tensors: dict, i: int, s: ModelShape, src):
    """Layer i's ([gate, up, down] expert bytes, format names, None: no biases)."""
    return (*layer_experts(tensors, i, s, src), None)


def gguf_values(shape: ModelShape) -> dict:
    """llama.cpp's minimax-m2 loader sizes the expert tensors by feed_forward_length, so a GGUF
    strata writes carries the expert width there too (the converter writes both)."""
    return {"feed_forward_length": shape.d_expert}


MINIMAX_M2 = Arch(
    name=ARCH, hf_types=("minimax_m2",), gguf_archs=("minimax-m2",), wiring=MiniMaxM2,
    layer_specs=layer_specs, hf_shape=hf_shape, hf_dense=hf_dense, hf_experts=hf_experts,
    gguf_shape=gguf_shape, gguf_experts=gguf_experts, gguf_hparams=hparams_gguf.MINIMAX_M2,
    hf_hparams=hparams_hf.MINIMAX_M2, gguf_values=gguf_values, options=(Router, Attn))
