"""A GQA attention block's dense tensors under llama.cpp's names, with torch shapes ([out, in]
for matrices): the one spelling the records whose layers attend this way share (Mixtral,
Qwen3-MoE, MiniMax-M2, GPT-OSS, GLM-4.5).

Legend: D hidden, H query heads, Hkv kv heads, hd head dim.

    attn_q [H*hd, D], attn_k / attn_v [Hkv*hd, D], each with a .bias [rows] where `bias` says
    where the biases stand in the file: "each" after its own weight (GPT-OSS), "after" the three
    weights (GLM-4.5), as llama.cpp's converter writes them (the synthesized file is byte for
    byte the one llama.cpp read: tests/models/test_llama_cpp_synth.py); attn_output [D, H*hd]
    (+ .bias [D] where `out_bias`); the q/k norms where `qk_norm`: "head" one weight a head
    ([hd], Qwen3), "whole" one over the whole projection ([H*hd] and [Hkv*hd], MiniMax-M2).
"""
from __future__ import annotations

from strata.errors import StrataError
from strata.shapes import ModelShape

QK_NORMS = (None, "head", "whole")
BIASES = (None, "each", "after")


def gqa_specs(s: ModelShape, p: str, *, bias: str | None = None, out_bias: bool = False,
              qk_norm: str | None = None) -> dict[str, tuple[int, ...]]:
    """The block's tensors of the layer whose names start with `p` ("blk.N."), in file order."""
    if qk_norm not in QK_NORMS or bias not in BIASES:
        raise StrataError(f"gqa_specs: qk_norm must be one of {QK_NORMS} and bias one of "
                          f"{BIASES}, got {qk_norm!r} and {bias!r}")
    q, kv, D = s.n_head * s.head_dim, s.n_kv_head * s.head_dim, s.d_model
    rows = {"q": q, "k": kv, "v": kv}
    out: dict[str, tuple[int, ...]] = {}
    for name, n in rows.items():
        out[f"{p}attn_{name}.weight"] = (n, D)
        if bias == "each":
            out[f"{p}attn_{name}.bias"] = (n,)
    if bias == "after":
        out |= {f"{p}attn_{name}.bias": (n,) for name, n in rows.items()}
    out[p + "attn_output.weight"] = (D, q)
    if out_bias:
        out[p + "attn_output.bias"] = (D,)
    if qk_norm:
        whole = qk_norm == "whole"
        out |= {p + "attn_q_norm.weight": (q if whole else s.head_dim,),
                p + "attn_k_norm.weight": (kv if whole else s.head_dim,)}
    return out
