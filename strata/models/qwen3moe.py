"""Qwen3-MoE: the MoE decoder (strata.models.moe_decoder) with its defaults, as vLLM's
qwen3_moe wires the shared layers.

Legend: T tokens in the chunk, D hidden, E experts, K top-k, H query heads, Hkv kv heads,
hd head dim.

Per layer (all sparse, as Qwen3-MoE ships):
    h = x + Wo . attn(rope(qnorm(Wq rms(x))), rope(knorm(Wk rms(x))), Wv rms(x))  # attention.py
    x = h + moe(rms(h))                          # moe_block.py: softmax top-k, passes, expert FFN
then logits = W_out rms(x). RoPE is NEOX style (rotate halves), as HF Qwen3 and llama.cpp qwen3moe.
Dense weights use llama.cpp's GGUF tensor names (strata.archs.qwen3moe).
"""
from __future__ import annotations

import torch

from strata.models.moe_decoder import GqaLayer, MoeDecoder
from strata.models.provider import ExpertProvider

class Qwen3Moe(MoeDecoder):
    Layer = GqaLayer   # q/k norms, softmax router


def forward_torch(model: MoeDecoder, provider: ExpertProvider, tokens) -> torch.Tensor:
    """Reference: the whole prompt as one chunk through `model.reference()`. Logits fp32 [T, V]."""
    return model.reference().prefill(tokens, provider, chunk=None)
