"""The dense tensors of a `glm4moe` (GLM-4.5) or `deepseek2` (DeepSeek-V3, Kimi-K2) pack, per
layer: llama.cpp's GGUF names, torch shapes ([out, in] for matrices).

Legend: D hidden, E experts, F expert width, Fd dense-layer FFN width (dense.d_ff), Fs =
dense.shared * F the shared experts' width, H query heads, Hkv kv heads, hd head dim, R rope
dims, Lq q_lora, Lkv kv_lora, N = hd - R the no-rope dims of an MLA head, Hv the value head dim
(the MLA ones: strata.shapes.Mla).

Attention (glm4moe): attn_q/k/v (+ .bias), attn_output, optional attn_q_norm/attn_k_norm.
Attention (deepseek2, MLA): attn_q_a [Lq, D], attn_q_a_norm [Lq], attn_q_b [H*hd, Lq] (or a full
attn_q [H*hd, D] when q_lora = 0), attn_kv_a_mqa [Lkv + R, D], attn_kv_a_norm [Lkv],
attn_kv_b [H*(N + Hv), Lkv] (llama.cpp's newer attn_k_b / attn_v_b split is joined back into it
on import: strata.archs.family_gguf), attn_output [D, H*Hv].
FFN: a leading dense layer has ffn_gate/ffn_up [Fd, D], ffn_down [D, Fd]; a MoE layer has the
router ffn_gate_inp [E, D], the sigmoid router's exp_probs_b.bias [E] (e_score_correction_bias)
and the shared expert ffn_{gate,up}_shexp [Fs, D], ffn_down_shexp [D, Fs]; its routed experts
are the pack's blobs. GLM-4.5 calls the pre-FFN norm post_attention_norm, DeepSeek ffn_norm.
"""
from __future__ import annotations

from strata.archs.attention_names import gqa_specs
from strata.shapes import ModelShape

def ffn_norm_name(s: ModelShape) -> str:
    return "post_attention_norm" if s.arch == "glm4moe" else "ffn_norm"


def _attention(s: ModelShape, p: str) -> dict[str, tuple[int, ...]]:
    D, H = s.d_model, s.n_head
    m = s.mla
    if m:
        out = {}
        if m.q_lora:
            out |= {p + "attn_q_a.weight": (m.q_lora, D), p + "attn_q_a_norm.weight": (m.q_lora,),
                    p + "attn_q_b.weight": (H * s.head_dim, m.q_lora)}
        else:
            out[p + "attn_q.weight"] = (H * s.head_dim, D)
        nope = s.head_dim - m.qk_rope
        return out | {
            p + "attn_kv_a_mqa.weight": (m.kv_lora + m.qk_rope, D),
            p + "attn_kv_a_norm.weight": (m.kv_lora,),
            p + "attn_kv_b.weight": (H * (nope + m.v_head_dim), m.kv_lora),
            p + "attn_output.weight": (D, H * m.v_head_dim)}
    return gqa_specs(s, p, bias="after" if s.attn.bias else None,
                     qk_norm="head" if s.attn.qk_norm else None)


def _ffn(s: ModelShape, i: int, p: str) -> dict[str, tuple[int, ...]]:
    D = s.d_model
    if not s.is_moe_layer(i):
        fd = s.dense.d_ff
        return {p + "ffn_gate.weight": (fd, D), p + "ffn_up.weight": (fd, D),
                p + "ffn_down.weight": (D, fd)}
    out = {p + "ffn_gate_inp.weight": (s.n_expert, D)}
    if s.router.kind == "sigmoid":
        out[p + "exp_probs_b.bias"] = (s.n_expert,)
    if s.dense.shared:
        fs = s.dense.shared * s.d_expert
        out |= {p + "ffn_gate_shexp.weight": (fs, D), p + "ffn_up_shexp.weight": (fs, D),
                p + "ffn_down_shexp.weight": (D, fs)}
    return out


def layer_specs(s: ModelShape, i: int) -> dict[str, tuple[int, ...]]:
    p = f"blk.{i}."
    return ({p + "attn_norm.weight": (s.d_model,)} | _attention(s, p)
            | {p + ffn_norm_name(s) + ".weight": (s.d_model,)} | _ffn(s, i, p))
