"""A Hugging Face folder's tensors as the HF importers read them: every *.safetensors file
(memory-mapped, never pickle), the global tensors' and a GQA block's names, a dense tensor by
its pack name, and a layer's experts from either storage (per expert, or transformers 5's fused
gate_up_proj / down_proj).

Legend: E experts, D hidden, F expert width.
"""
from __future__ import annotations

from pathlib import Path

import torch

from strata.errors import StrataError
from strata.shapes import ModelShape

HF_GLOBAL = {  # pack name -> HF name of the tensors outside the layers
    "token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight"}
# a GQA layer's attention tensors (strata.archs.attention_names): pack name (minus "blk.N.") ->
# HF name (minus "model.layers.N.")
HF_ATTENTION = {
    "attn_norm.weight": "input_layernorm.weight",
    **{f"attn_{a}.{k}": f"self_attn.{b}_proj.{k}"
       for a, b in (("q", "q"), ("k", "k"), ("v", "v"), ("output", "o"))
       for k in ("weight", "bias")},
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
}


def hf_dense_tensor(ts, name: str, layer_names: dict) -> torch.Tensor:
    """The HF tensor of pack dense tensor `name`: a global one by HF_GLOBAL, a layer's by
    `layer_names` (pack name minus "blk.N." -> HF name minus "model.layers.N.", or a tuple of
    names: the first the checkpoint holds, as where a release and transformers name it apart)."""
    if not name.startswith("blk."):
        return ts.get(HF_GLOBAL[name])
    _, i, rest = name.split(".", 2)
    p = f"model.layers.{i}."
    cands = layer_names[rest]
    for c in (cands,) if isinstance(cands, str) else cands:
        if p + c in ts:
            return ts.get(p + c)
    raise StrataError(f"checkpoint has no {p}{cands if isinstance(cands, str) else cands[0]}")


class SafeTensors:
    """Name -> tensor over every *.safetensors file of a folder (memory-mapped, no pickle).
    `shape`: the ModelShape read from the folder's config.json (strata.packs.from_hf sets it),
    for a reader that splits a fused tensor by the config's dims (Qwen3-Next's in_proj_qkvz)."""

    shape = None

    def __init__(self, folder: Path):
        from safetensors import safe_open
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise StrataError(f"{folder} has no *.safetensors files (strata never loads pickle "
                              f"checkpoints; re-save with safe_serialization)")
        self._open = [safe_open(str(f), "pt") for f in files]
        self._where = {k: h for h in self._open for k in h.keys()}

    def __contains__(self, k):
        return k in self._where

    def get(self, k) -> torch.Tensor:
        h = self._where.get(k)
        if h is None:
            raise StrataError(f"checkpoint has no tensor {k}")
        return h.get_tensor(k)


def layer_experts(ts: SafeTensors, i: int, s: ModelShape, base: str = "model."):
    """(gate [E, F, D], up [E, F, D], down [E, D, F]) of layer i, per-expert or fused storage;
    `base`: the text model's prefix (a multimodal release's "model.language_model.")."""
    p = f"{base}layers.{i}.mlp.experts."
    E, D, F = s.n_expert, s.d_model, s.d_expert
    if p + "gate_up_proj" in ts:
        gu, dn = ts.get(p + "gate_up_proj"), ts.get(p + "down_proj")
        # transformers' layout is [E, 2F, D]; only an unambiguous [E, D, 2F] is read transposed
        if tuple(gu.shape) == (E, D, 2 * F) and D != 2 * F:
            gu = gu.transpose(1, 2)
        if tuple(dn.shape) == (E, F, D) and D != F:
            dn = dn.transpose(1, 2)
        if tuple(gu.shape) != (E, 2 * F, D) or tuple(dn.shape) != (E, D, F):
            raise StrataError(f"layer {i} fused experts are {list(gu.shape)} / {list(dn.shape)}, "
                              f"expected [{E}, {2 * F}, {D}] / [{E}, {D}, {F}]")
        return gu[:, :F], gu[:, F:], dn
    if p + "0.gate_proj.weight" not in ts:
        raise StrataError(f"checkpoint has neither {p}0.gate_proj.weight nor {p}gate_up_proj")
    mats = []
    for w, shp in (("gate", (F, D)), ("up", (F, D)), ("down", (D, F))):
        m = torch.stack([ts.get(f"{p}{e}.{w}_proj.weight") for e in range(E)])
        if tuple(m.shape[1:]) != shp:
            raise StrataError(f"layer {i} {w}_proj is {list(m.shape[1:])}, expected {list(shp)}")
        mats.append(m)
    return tuple(mats)
