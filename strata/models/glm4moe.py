"""GLM-4.5 / 4.6 (`glm4moe`, Glm4MoeForCausalLM): GQA with q/k/v biases, partial RoPE (NEOX on
the first attn.rope_dim dims of each head), optional q/k norms, then the family's dense-lead /
shared-expert / grouped sigmoid MoE (strata.models.family).

Legend: T tokens, D hidden, H query heads, Hkv kv heads, hd head dim, R rope dims.

    q = Wq x + bq, k = Wk x + bk, v = Wv x + bv     # [T, H, hd], [T, Hkv, hd], [T, Hkv, hd]
    q, k = qnorm(q), knorm(k)                       # when the checkpoint has them (use_qk_norm)
    q, k = rope on dims [0, R), dims [R, hd) as they are
    o = causal softmax(q k^T / sqrt(hd)) v; y = Wo o (strata.models.attention.attend)

GLM-4.5's MTP (NextN) layers past block_count - nextn_predict_layers are not read.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from strata.models.attention import attend as attend_cached, project
from strata.models.family import FamilyLayer, FamilyMoe, optional
from strata.models.layers import matmul_into, norm_rope


@dataclass
class GQAWeights:
    wq: torch.Tensor                 # [H*hd, D]
    wk: torch.Tensor                 # [Hkv*hd, D]
    wv: torch.Tensor                 # [Hkv*hd, D]
    wo: torch.Tensor                 # [D, H*hd]
    bq: torch.Tensor | None = None   # [H*hd]
    bk: torch.Tensor | None = None   # [Hkv*hd]
    bv: torch.Tensor | None = None   # [Hkv*hd]
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None

    def map(self, fn) -> "GQAWeights":
        return GQAWeights(**{k: None if t is None else fn(t) for k, t in vars(self).items()})


class Glm4Moe(FamilyMoe):
    FFN_NORM = "post_attention_norm"   # llama.cpp's name of GLM-4.5's pre-FFN norm

    @classmethod
    def attention_weights(cls, get, l: int) -> GQAWeights:
        p = f"blk.{l}."

        def opt(n):
            return optional(get, p + n)
        return GQAWeights(get(p + "attn_q.weight"), get(p + "attn_k.weight"),
                          get(p + "attn_v.weight"), get(p + "attn_output.weight"),
                          opt("attn_q.bias"), opt("attn_k.bias"), opt("attn_v.bias"),
                          opt("attn_q_norm.weight"), opt("attn_k_norm.weight"))

    def attend(self, xn, lw: FamilyLayer, cos, sin, cache, l: int, into=None) -> torch.Tensor:
        s, w = self.shape, lw.attn
        T = xn.shape[0]
        q = project(xn, w.wq, w.bq).view(T, s.n_head, s.head_dim)
        k = project(xn, w.wk, w.bk).view(T, s.n_kv_head, s.head_dim)
        v = project(xn, w.wv, w.bv).view(T, s.n_kv_head, s.head_dim)
        # the optional per-head norm (None: none) and the partial RoPE in one pass
        q = norm_rope(q, w.q_norm, cos, sin, s.rms_eps)             # [H, T, hd]
        k = norm_rope(k, w.k_norm, cos, sin, s.rms_eps)             # [Hkv, T, hd]
        return matmul_into(attend_cached(q, k, v, cache, l).reshape(T, s.n_head * s.head_dim),
                           w.wo, into)
