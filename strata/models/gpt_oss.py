"""GPT-OSS (HF GptOssForCausalLM; GGUF arch `gpt-oss`): the MoE decoder
(strata.models.moe_decoder) with its own layer weights (attention biases and sinks, a biased
router), router and experts (the shape's options); its RoPE is the shape's (YaRN).

Legend: T tokens, D hidden, E experts, K top-k (4), H query heads, Hkv kv heads, hd head dim.

Per layer l:
    h = x + Wo . attn(rope(Wq rms(x) + bq), rope(Wk rms(x) + bk), Wv rms(x) + bv) + bo
          # learned sink logit per head in the softmax; even layers slide (window 128:
          # shape.layer_window), odd ones attend to every earlier token; no QK-norm
    x = h + moe(rms(h))
          # router: logits = Wr h + br, the K largest, softmax over those K (equal to a
          # softmax over all E renormalized over the chosen K, computed as HF does)
          # experts: y_e = down(act(gate x + bg, up x + bu)) + bd, act the clamped SwiGLU
          # (strata.blob.ExpertAct swiglu_oai): biases and activation live in the blob layout,
          # so every expert FFN (Triton epilogue, torch twin, fp32 reference) applies them
RoPE: NEOX halves with YaRN frequencies and attention factor (strata.models.layers.yarn_*).
KV: a sliding layer keeps only the last W - 1 tokens before the chunk, in VRAM, in the model's
KVCache and the engine's PromptKV alike; the plan counts the same (strata.models.kv.kv_windows
reads shape.layer_window, layer_kv_tokens the tokens each layer keeps).
Dense weights use llama.cpp's gpt-oss names (strata.archs.gpt_oss); the pre-FFN norm is
`post_attention_norm`, as llama.cpp names it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from strata.kernels.moe.router import route_logits
from strata.models.attention import AttentionWeights
from strata.models.moe_decoder import MoeDecoder


def topk_softmax(w_router: torch.Tensor, b_router: torch.Tensor, top_k: int):
    """GPT-OSS's router of one layer: h [T, D] -> (ids int64 [T, K], w fp32 [T, K]): logits
    h Wr^T + br in fp32 (the GEMM: strata.kernels.moe.router.route_logits), the K largest, softmax
    over them."""
    def route(h: torch.Tensor):
        logits = route_logits(h, w_router) + b_router.float()            # [T, E]
        vals, ids = torch.topk(logits, top_k, dim=-1)
        return ids, torch.softmax(vals, dim=-1)
    return route


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor    # [D]
    attn: AttentionWeights     # q, k, v, o with biases, and the sinks
    ffn_norm: torch.Tensor     # [D]  (llama.cpp's post_attention_norm)
    router: torch.Tensor       # [E, D]
    router_bias: torch.Tensor  # [E]

    @classmethod
    def from_tensors(cls, get, l: int) -> "LayerWeights":
        """`get(name)`: the tensor named (strata.archs.gpt_oss)."""
        def t(n):
            return get(f"blk.{l}.{n}")
        attn = AttentionWeights(t("attn_q.weight"), t("attn_k.weight"), t("attn_v.weight"),
                                t("attn_output.weight"), bq=t("attn_q.bias"),
                                bk=t("attn_k.bias"), bv=t("attn_v.bias"),
                                bo=t("attn_output.bias"), sinks=t("attn_sinks.weight"))
        return cls(t("attn_norm.weight"), attn, t("post_attention_norm.weight"),
                   t("ffn_gate_inp.weight"), t("ffn_gate_inp.bias"))

    def map(self, fn) -> "LayerWeights":
        return LayerWeights(fn(self.attn_norm), self.attn.map(fn), fn(self.ffn_norm),
                            fn(self.router), fn(self.router_bias))


class GptOss(MoeDecoder):
    Layer = LayerWeights

    def router(self, lw: LayerWeights):
        return topk_softmax(lw.router, lw.router_bias, self.shape.top_k)
