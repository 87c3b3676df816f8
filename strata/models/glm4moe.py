"""GLM-4.5 / 4.6 (`glm4moe`, Glm4MoeForCausalLM): GQA with q/k/v biases, partial RoPE (NEOX on
the first attn.rope_dim dims of each head), optional q/k norms, then the family's dense-lead /
shared-expert / grouped sigmoid MoE (strata.models.family).

Legend: T tokens, D hidden, H query heads, Hkv kv heads, hd head dim, R rope dims.

    q = Wq x + bq, k = Wk x + bk, v = Wv x + bv     # [T, H, hd], [T, Hkv, hd], [T, Hkv, hd]
    q, k = qnorm(q), knorm(k)                       # when the checkpoint has them (use_qk_norm)
    q, k = rope on dims [0, R), dims [R, hd) as they are
    o = causal softmax(q k^T / sqrt(hd)) v; y = Wo o (strata.models.attention.attention)

GLM-4.5's MTP (NextN) layers past block_count - nextn_predict_layers are not read.
"""
from __future__ import annotations

import torch

from strata.models.attention import AttentionWeights, attention
from strata.models.family import FamilyLayer, FamilyMoe, optional


class Glm4Moe(FamilyMoe):
    FFN_NORM = "post_attention_norm"   # llama.cpp's name of GLM-4.5's pre-FFN norm

    @classmethod
    def attention_weights(cls, get, l: int) -> AttentionWeights:
        p = f"blk.{l}."

        def opt(n):
            return optional(get, p + n)
        return AttentionWeights(get(p + "attn_q.weight"), get(p + "attn_k.weight"),
                                get(p + "attn_v.weight"), get(p + "attn_output.weight"),
                                bq=opt("attn_q.bias"), bk=opt("attn_k.bias"),
                                bv=opt("attn_v.bias"), q_norm=opt("attn_q_norm.weight"),
                                k_norm=opt("attn_k_norm.weight"))

    def attend(self, xn, lw: FamilyLayer, cos, sin, cache, l: int, into=None) -> torch.Tensor:
        # GQA's own attention: the biases, the optional per-head norm and the partial RoPE (cos /
        # sin of R < hd dims) are its cases, and its q, k, v go to the engine's carve
        return attention(xn, lw.attn, self.attn_shape, cos, sin, cache, l, out=into)
