"""MiniMax-M2 (`minimax-m2`, MiniMaxM2ForCausalLM): the MoE decoder (strata.models.moe_decoder)
with q/k norms over the whole projection, partial RoPE and a sigmoid router whose choice a
correction bias steers.

Legend: T tokens, D hidden, H query heads, Hkv kv heads, hd head dim, R rotary dims, E experts,
K top-k.

Per layer:
    q = rms(Wq xn) [T, H*hd] -> [T, H, hd]     # one norm weight over all heads (H*hd), before
    k = rms(Wk xn) [T, Hkv*hd] -> [T, Hkv, hd] # the heads are split (not Qwen3's per head)
    v = Wv xn                                  # no projection biases
    q, k = NEOX RoPE on dims [0, R), dims [R, hd) as they are (R = attn.rope_dim)
    h = x + Wo attn(q, k, v)
    s = sigmoid(Wr rms(h)) [T, E] fp32; ids = top-K of s + bias; w = s[ids] / sum(s[ids])
    x = h + sum_k w_k expert_ids_k(rms(h))     # no shared expert, no routed scaling
The router is strata.models.routers' grouped one with a single group (the shape says
Router("sigmoid"): n_group = topk_group = 1, scale 1).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from strata.models.attention import AttentionWeights, attention
from strata.models.moe_decoder import MoeDecoder
from strata.models.routers import sigmoid_router


@dataclass
class MiniMaxM2Layer:
    attn_norm: torch.Tensor    # [D]
    attn: AttentionWeights     # wq, wk, wv, wo; q_norm [H*hd], k_norm [Hkv*hd]
    ffn_norm: torch.Tensor     # [D]
    router: torch.Tensor       # [E, D]
    bias: torch.Tensor         # [E] e_score_correction_bias, fp32 (routing is fp32, as in HF)

    @classmethod
    def from_tensors(cls, get, l: int) -> "MiniMaxM2Layer":
        def w(n, kind="weight"):
            return get(f"blk.{l}.{n}.{kind}")
        return cls(w("attn_norm"),
                   AttentionWeights(w("attn_q"), w("attn_k"), w("attn_v"), w("attn_output"),
                                    q_norm=w("attn_q_norm"), k_norm=w("attn_k_norm")),
                   w("ffn_norm"), w("ffn_gate_inp"), w("exp_probs_b", "bias").float())

    def map(self, fn) -> "MiniMaxM2Layer":
        return MiniMaxM2Layer(fn(self.attn_norm), self.attn.map(fn), fn(self.ffn_norm),
                              fn(self.router), self.bias.float())


class MiniMaxM2(MoeDecoder):
    Layer = MiniMaxM2Layer

    def attend(self, xn, lw: MiniMaxM2Layer, cos, sin, cache, l: int, into=None) -> torch.Tensor:
        # GQA's own attention: its q / k norms over all heads are that function's case
        return attention(xn, lw.attn, self.attn_shape, cos, sin, cache, l, out=into)

    def router(self, lw: MiniMaxM2Layer):
        return sigmoid_router(lw.router, lw.bias, self.shape)
