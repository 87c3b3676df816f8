"""Mixtral's record: its dense tensors (llama.cpp's names), and how the HF and GGUF readers
find them and its experts.

Legend: D hidden, E experts, F expert width, H query heads, Hkv kv heads, hd head dim.

HF (MixtralForCausalLM): save_pretrained writes `block_sparse_moe.gate.weight` (router) and
per-expert `block_sparse_moe.experts.<e>.w1/w3/w2.weight` (gate/up/down); transformers 5's
in-memory layout is `mlp.gate.weight` and fused `mlp.experts.gate_up_proj` [E, 2F, D] (gate rows
first) / `mlp.experts.down_proj` [E, D, F]. Both are read.

GGUF (llama.cpp arch `llama` with `llama.expert_count`): the expert width is
`llama.feed_forward_length`; experts are 3-D `blk.N.ffn_{gate,up,down}_exps` (ggml {D, F, E} /
{F, D, E}) or, in older conversions, 2-D per expert `blk.N.ffn_{gate,up,down}.<e>.weight`
({D, F} / {F, D}). llama.cpp's converter permutes the rows of attn_q/attn_k for ggml's
interleaved-pair RoPE (per head: rows [0, hd/2) and [hd/2, hd) interleaved); strata's RoPE is
HF's rotate-half, so the import undoes the permutation.
"""
from __future__ import annotations

import numpy as np
import torch

from strata.archs.hf_config import config_fields
from strata.archs.gguf_tensors import check_dense_expert, field as gguf_field, layer_experts
from strata.archs import hparams_gguf, hparams_hf
from strata.archs.attention_names import gqa_specs
from strata.archs.hf_tensors import HF_ATTENTION, hf_dense_tensor
from strata.archs.record import Arch
from strata.errors import StrataError
from strata.models.mixtral import Mixtral
from strata.shapes import ModelShape

ARCH = "mixtral"


def layer_specs(s: ModelShape, i: int) -> dict[str, tuple[int, ...]]:
    p = f"blk.{i}."
    return {p + "attn_norm.weight": (s.d_model,)} | gqa_specs(s, p) | {
        p + "ffn_norm.weight": (s.d_model,),            # [D]
        p + "ffn_gate_inp.weight": (s.n_expert, s.d_model),  # router [E, D]
    }


# ---- Hugging Face ------------------------------------------------------------------------------
_HF_LAYER = HF_ATTENTION | {  # pack name (minus "blk.N.") -> HF name(s) (minus "model.layers.N.")
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate_inp.weight": ("block_sparse_moe.gate.weight", "mlp.gate.weight"),
}


def hf_shape(cfg: dict, where) -> ModelShape:
    with config_fields(where):
        H = cfg["num_attention_heads"]
        rope = cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta",
                                                                                1e6)
        return ModelShape(
            arch=ARCH, n_layer=cfg["num_hidden_layers"], d_model=cfg["hidden_size"],
            n_expert=cfg["num_local_experts"], top_k=cfg["num_experts_per_tok"],
            d_expert=cfg["intermediate_size"], n_head=H,
            n_kv_head=cfg.get("num_key_value_heads") or H,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // H, vocab=cfg["vocab_size"],
            rope_theta=float(rope), rms_eps=float(cfg["rms_norm_eps"]), norm_topk_prob=True,
            max_pos=cfg.get("max_position_embeddings", 32768))


def hf_dense(ts, name: str) -> torch.Tensor:
    """The HF tensor of pack dense tensor `name` (a layer's or a global one)."""
    return hf_dense_tensor(ts, name, _HF_LAYER)


def hf_experts(ts, i: int, s: ModelShape):
    """(gate [E, F, D], up [E, F, D], down [E, D, F], None: no biases) of layer i."""
    E, D, F = s.n_expert, s.d_model, s.d_expert
    fused = f"model.layers.{i}.mlp.experts."
    if fused + "gate_up_proj" in ts:
        gu, dn = ts.get(fused + "gate_up_proj"), ts.get(fused + "down_proj")
        if tuple(gu.shape) != (E, 2 * F, D) or tuple(dn.shape) != (E, D, F):
            raise StrataError(f"layer {i} fused experts are {list(gu.shape)} / "
                              f"{list(dn.shape)}, expected [{E}, {2 * F}, {D}] / [{E}, {D}, {F}]")
        return gu[:, :F], gu[:, F:], dn, None
    p = f"model.layers.{i}.block_sparse_moe.experts."
    if p + "0.w1.weight" not in ts:
        raise StrataError(f"checkpoint has neither {p}0.w1.weight nor {fused}gate_up_proj")
    mats = []
    for w, shp in (("w1", (F, D)), ("w3", (F, D)), ("w2", (D, F))):   # gate, up, down
        m = torch.stack([ts.get(f"{p}{e}.{w}.weight") for e in range(E)])
        if tuple(m.shape[1:]) != shp:
            raise StrataError(f"layer {i} {w} is {list(m.shape[1:])}, expected {list(shp)}")
        mats.append(m)
    return (*mats, None)


# ---- GGUF --------------------------------------------------------------------------------------
def gguf_shape(r, path) -> ModelShape:
    a = "llama"
    tensors = {t.name: t for t in r.tensors}

    def field(key, default=None):
        return gguf_field(r, key, default)
    if field(f"{a}.expert_count", 0) in (0, None):
        raise StrataError(f"{path} is a dense llama model (no {a}.expert_count); strata reads "
                          f"MoE models (a llama GGUF with experts is Mixtral)")
    D = int(field(f"{a}.embedding_length"))
    H = int(field(f"{a}.attention.head_count"))
    if "token_embd.weight" not in tensors:
        raise StrataError(f"{path} has no token_embd.weight")
    hd = int(field(f"{a}.attention.key_length", 0) or field(f"{a}.rope.dimension_count", 0)
             or D // H)
    return ModelShape(
        arch=ARCH, n_layer=int(field(f"{a}.block_count")), d_model=D,
        n_expert=int(field(f"{a}.expert_count")), top_k=int(field(f"{a}.expert_used_count")),
        d_expert=int(field(f"{a}.expert_feed_forward_length", 0)
                     or field(f"{a}.feed_forward_length")),
        n_head=H, n_kv_head=int(field(f"{a}.attention.head_count_kv", H)), head_dim=hd,
        vocab=int(tensors["token_embd.weight"].shape[1]),
        rope_theta=float(f"{float(field(f'{a}.rope.freq_base')):.7g}"),
        rms_eps=float(f"{float(field(f'{a}.attention.layer_norm_rms_epsilon')):.7g}"),
        norm_topk_prob=True, max_pos=int(field(f"{a}.context_length", 32768)))


def unpermute_rope(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Rows of a llama GGUF attn_q/attn_k [n_head*hd, D] back to HF's rotate-half order: per
    head, GGUF row 2j is HF row j and row 2j+1 is HF row j + hd/2."""
    rows = w.shape[0]
    hd = rows // n_head
    return w.reshape(n_head, hd // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def permute_rope(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """The inverse of unpermute_rope (what llama.cpp's converter writes)."""
    hd = w.shape[0] // n_head
    return w.reshape(n_head, 2, hd // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def gguf_dense(name: str, x: torch.Tensor, s: ModelShape) -> torch.Tensor:
    if name.endswith("attn_q.weight"):
        return unpermute_rope(x, s.n_head)
    if name.endswith("attn_k.weight"):
        return unpermute_rope(x, s.n_kv_head)
    return x


def gguf_experts(tensors: dict, i: int, s: ModelShape, src):
    """Layer i's ([gate, up, down] expert bytes, format names, None: no biases): the 3-D
    `ffn_*_exps` tensors, else the per-expert 2-D `ffn_{gate,up,down}.<e>.weight`."""
    p = f"blk.{i}."
    if p + "ffn_down_exps.weight" in tensors:
        mats, fmts = layer_experts(tensors, i, s, src)
        return mats, fmts, None
    if p + "ffn_down.0.weight" not in tensors:
        raise StrataError(f"{src} has neither {p}ffn_down_exps.weight nor per-expert "
                          f"{p}ffn_down.0.weight; not a MoE layer strata can pack")
    E, D, F = s.n_expert, s.d_model, s.d_expert
    mats, fmts = [], []
    for w, cols, rows in (("gate", D, F), ("up", D, F), ("down", F, D)):
        ts = []
        for e in range(E):
            t = tensors.get(f"{p}ffn_{w}.{e}.weight")
            if t is None:
                raise StrataError(f"{src} has no {p}ffn_{w}.{e}.weight (expert {e} of {E})")
            ts.append(t)
        fmt = check_dense_expert(ts, cols, rows)
        mats.append(np.stack([np.asarray(t.data).reshape(rows, -1) for t in ts]))
        fmts.append(fmt.name)
    return mats, fmts, None


MIXTRAL = Arch(
    name=ARCH, hf_types=("mixtral",), gguf_archs=("llama",), wiring=Mixtral,
    layer_specs=layer_specs, hf_shape=hf_shape, hf_dense=hf_dense, hf_experts=hf_experts,
    gguf_shape=gguf_shape, gguf_dense=gguf_dense, gguf_experts=gguf_experts,
    gguf_hparams=hparams_gguf.LLAMA, hf_hparams=hparams_hf.MIXTRAL)
