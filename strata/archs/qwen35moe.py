"""Qwen3.5-MoE's record (its text model): Qwen3-Next's layers (strata.archs.qwen3next) with the
DeltaNet's projections split as HF holds them (`in_proj_qkv`, `in_proj_z`, `in_proj_b`,
`in_proj_a`: llama.cpp's `attn_qkv`, `attn_gate`, `ssm_beta`, `ssm_alpha`), the router always
renormalised, and interleaved MRoPE, which over text (one position per token on all three axes)
is plain partial NEOX RoPE.

Legend: Hk / Hv linear key / value heads, r = Hv / Hk, dv the value head dim.

HF: Qwen3_5MoeForCausalLM's folder (model_type qwen3_5_moe_text, layers under `model.layers`)
or the release's Qwen3_5MoeForConditionalGeneration folder (model_type qwen3_5_moe: the text
model's config under text_config, its tensors under `model.language_model.`; the vision tower
and the MTP layers are not read). GGUF (arch `qwen35moe`): llama.cpp's converter
(conversion/qwen.py, _LinearAttentionVReorderBase) reorders the value heads from HF's grouped
order (value head h reads key head h // r) to a tiled one (h reads h mod Hk) in attn_qkv's v
rows, attn_gate, ssm_beta / ssm_alpha, ssm_a, ssm_dt, the conv's v channels and ssm_out's
columns; `gguf_dense` puts them back.
"""
from __future__ import annotations

import torch

from strata.archs import hparams_gguf, hparams_hf
from strata.archs.qwen3next import (gguf_experts, gguf_linear, gguf_values_of, hf_dense_of,
                                    hf_experts_of, hf_linear, layer_specs_of)
from strata.archs.record import Arch
from strata.models.qwen3_next import Qwen3Next
from strata.shapes import Attn, DenseFfn, LinearAttention, ModelShape

ARCH = "qwen35moe"


def hf_shape(cfg: dict, where) -> ModelShape:
    """The text model's shape (the release's config.json holds it under text_config)."""
    text = cfg.get("text_config")
    return hf_linear(text if isinstance(text, dict) else cfg, where, ARCH, norm_topk_prob=True)


def gguf_shape(r, path) -> ModelShape:
    return gguf_linear(r, path, ARCH)


def grouped(x: torch.Tensor, dim: int, h_k: int, r: int, width: int) -> torch.Tensor:
    """x with its value heads (`width` rows each along `dim`) from llama.cpp's tiled order
    [k0 v0, k1 v0, ..., k0 v1, ...] back to HF's grouped one [k0 v0, k0 v1, ..., k1 v0, ...]."""
    shape = list(x.shape)
    t = x.reshape(*shape[:dim], r, h_k, width, *shape[dim + 1:])
    return t.transpose(dim, dim + 1).reshape(shape)


def gguf_dense(name: str, x: torch.Tensor, s: ModelShape) -> torch.Tensor:
    lin = s.linear
    if lin is None or not name.startswith("blk.") or lin.n_k_head == lin.n_v_head:
        return x
    Hk, r, dv = lin.n_k_head, lin.n_v_head // lin.n_k_head, lin.v_head_dim
    rest = name.split(".", 2)[2]
    qk = 2 * Hk * lin.k_head_dim
    if rest in ("attn_qkv.weight", "ssm_conv1d.weight"):
        return torch.cat([x[:qk], grouped(x[qk:], 0, Hk, r, dv)])
    if rest == "attn_gate.weight":
        return grouped(x, 0, Hk, r, dv)
    if rest in ("ssm_beta.weight", "ssm_alpha.weight", "ssm_a", "ssm_dt.bias"):
        return grouped(x, 0, Hk, r, 1)
    if rest == "ssm_out.weight":
        return grouped(x, 1, Hk, r, dv)
    return x


QWEN35MOE = Arch(
    name=ARCH, hf_types=("qwen3_5_moe_text", "qwen3_5_moe"), gguf_archs=("qwen35moe",),
    wiring=Qwen3Next,
    layer_specs=layer_specs_of(True), hf_shape=hf_shape,
    hf_dense=hf_dense_of(("model.", "model.language_model.")),
    hf_experts=hf_experts_of(("model.", "model.language_model.")), gguf_shape=gguf_shape,
    gguf_dense=gguf_dense,
    gguf_experts=gguf_experts, gguf_hparams=hparams_gguf.QWEN35MOE,
    hf_hparams=hparams_hf.QWEN3_5_MOE, gguf_values=gguf_values_of(True),
    hf_hparams_of={"qwen3_5_moe": hparams_hf.QWEN3_5_MOE_VL},
    options=(DenseFfn, Attn, LinearAttention))
