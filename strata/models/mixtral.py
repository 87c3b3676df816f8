"""Mixtral (HF MixtralForCausalLM; GGUF arch `llama` with expert_count): the MoE decoder
(strata.models.moe_decoder) with GQA layers without per-head q/k norms.

Legend: T tokens, D hidden, E experts, K top-k (2 in Mixtral 8x7B / 8x22B).

Per layer:
    h = x + Wo . attn(rope(Wq rms(x)), rope(Wk rms(x)), Wv rms(x))   # no QK-norm
    x = h + moe(rms(h))         # softmax over the E router logits, top-K, renormalized to sum 1
RoPE is NEOX style, as HF Mixtral computes it (a llama GGUF stores q/k permuted for ggml's
interleaved RoPE; strata.archs.mixtral undoes that on import). Mixtral's router is
Qwen3-MoE's with norm_topk_prob = True (HF Mixtral renormalizes the top-k weights).
"""
from __future__ import annotations

from strata.models.moe_decoder import GqaLayer, MoeDecoder


class MixtralLayer(GqaLayer):
    QK_NORM = False


class Mixtral(MoeDecoder):
    Layer = MixtralLayer
