"""DeepSeek-V3 / R1 and Kimi-K2 (`deepseek2`, DeepseekV3ForCausalLM): MLA attention
(strata.models.mla) in the family's dense-lead / shared-expert / grouped sigmoid MoE
(strata.models.family). RoPE is the interleaved-pairs form on the rope dims (HF's
rope_interleave, llama.cpp's NORM rope for deepseek2), with YaRN when the checkpoint has it (the
frequencies and the cos/sin factor in strata.models.layers.shape_cos_sin, the softmax scale's
mscale² as ModelShape.yarn.kq in strata.models.mla). Dense weights use llama.cpp's names
(strata.archs.family_names).
"""
from __future__ import annotations

import torch

from strata.models.family import FamilyLayer, FamilyMoe, optional
from strata.models.mla import MLACache, MLAWeights, mla_attention


class DeepSeek2(FamilyMoe):
    @classmethod
    def attention_weights(cls, get, l: int) -> MLAWeights:
        p = f"blk.{l}."

        def opt(n):
            return optional(get, p + n)
        return MLAWeights(get(p + "attn_kv_a_mqa.weight"), get(p + "attn_kv_a_norm.weight"),
                          get(p + "attn_kv_b.weight"), get(p + "attn_output.weight"),
                          wq=opt("attn_q.weight"), wqa=opt("attn_q_a.weight"),
                          q_norm=opt("attn_q_a_norm.weight"), wqb=opt("attn_q_b.weight"))

    def new_cache(self, capacity: int | None = None, kv: str | None = None) -> MLACache:
        """The MLA cache (kv: None the model's dtype, bf16 / fp32, or int8 codes + per-token
        scales)."""
        s = self.shape
        return MLACache(s.n_layer, s.mla.kv_lora, s.mla.qk_rope, capacity=capacity,
                        dtype=self.dtype, device=self.layer_devices, kv=kv)

    def attend(self, xn, lw: FamilyLayer, cos, sin, cache, l: int, into=None) -> torch.Tensor:
        return mla_attention(xn, lw.attn, self.shape, cos, sin, cache, l, eps=self.shape.rms_eps,
                             out=into)
