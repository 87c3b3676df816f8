"""The decoder of the DeepSeek / GLM-4.5 family: leading dense layers, shared experts and a
grouped sigmoid router beside the routed experts; the attention is the wiring's own.

Legend: T tokens of the chunk, D hidden, E experts, K top-k, L layers.

Per layer l:
    h = x + attn(rms(x))                                  # glm4moe.py (GQA) / deepseek.py (MLA)
    l <  dense.lead:    x = h + ffn(rms(h))               # a dense SwiGLU, no experts (ffn.py)
    l >= dense.lead:    x = h + moe(rms(h)) + shared(rms(h))
                        moe: grouped sigmoid top-k (routers.py), experts through the provider's
                        passes (moe_block.py); shared: resident dense SwiGLU (ffn.py)
then logits = W_out rms(x) (the MoE decoder's, strata.models.moe_decoder).

A dense layer still brackets its compute with provider.begin_layer / end_layer (the protocol's
per-layer hooks: observers time it) but asks for no passes: it has no blobs, no cache slots,
and the plan counts its FFN in its dense bytes (strata.planning.layer_dense_bytes).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from strata.models.ffn import DenseFFN
from strata.models.layers import add_rounded_
from strata.models.moe_block import moe_block, softmax_topk
from strata.models.moe_decoder import MoeDecoder
from strata.models.provider import ExpertProvider
from strata.models.routers import sigmoid_router
from strata.shapes import ModelShape


@dataclass
class FamilyLayer:
    attn_norm: torch.Tensor            # [D]
    attn: object                       # the wiring's attention weights (has .map)
    ffn_norm: torch.Tensor             # [D]
    dense: DenseFFN | None = None      # a leading dense layer's FFN
    router: torch.Tensor | None = None  # [E, D]
    bias: torch.Tensor | None = None   # [E] e_score_correction_bias (sigmoid router)
    shared: DenseFFN | None = None     # the shared experts (dense.shared * F wide)

    def map(self, fn) -> "FamilyLayer":
        opt = (lambda t: None if t is None else t.map(fn) if hasattr(t, "map") else fn(t))
        return FamilyLayer(fn(self.attn_norm), self.attn.map(fn), fn(self.ffn_norm),
                           opt(self.dense), opt(self.router),
                           None if self.bias is None else self.bias.float(), opt(self.shared))


def optional(get, name: str):
    """`get(name)`, or None where the weights lack it (a checkpoint without biases or norms)."""
    try:
        return get(name)
    except KeyError:
        return None


class FamilyMoe(MoeDecoder):
    """A family wiring subclasses this with `attention_weights(get, l)` (its weights of layer l
    from `get(name)`) and `attend(xn, lw, cos, sin, cache, l)`, and where its cache is not the
    GQA one, `new_cache(capacity, kv)`; FFN_NORM names its pre-FFN norm (llama.cpp's name)."""
    FFN_NORM = "ffn_norm"

    @classmethod
    def attention_weights(cls, get, l: int):
        raise NotImplementedError

    @classmethod
    def layer_weights(cls, shape: ModelShape, get, l: int) -> FamilyLayer:
        p = f"blk.{l}."
        lw = FamilyLayer(get(p + "attn_norm.weight"), cls.attention_weights(get, l),
                         get(p + cls.FFN_NORM + ".weight"))
        if not shape.is_moe_layer(l):
            lw.dense = DenseFFN(*(get(f"{p}ffn_{w}.weight") for w in ("gate", "up", "down")))
            return lw
        lw.router = get(p + "ffn_gate_inp.weight")
        if shape.router.kind == "sigmoid":
            lw.bias = get(p + "exp_probs_b.bias").float()   # routing is fp32 (as HF keeps it)
        if shape.dense.shared:
            lw.shared = DenseFFN(*(get(f"{p}ffn_{w}_shexp.weight") for w in ("gate", "up", "down")))
        return lw

    def attend(self, xn, lw: FamilyLayer, cos, sin, cache, l: int, into=None) -> torch.Tensor:
        raise NotImplementedError

    def router(self, lw: FamilyLayer):
        s = self.shape
        if s.router.kind == "sigmoid":
            return sigmoid_router(lw.router, lw.bias, s)
        route = softmax_topk(lw.router, s.top_k, s.norm_topk_prob)
        scale = s.router.scale
        if scale == 1.0:
            return route
        return lambda h: (lambda ids, w: (ids, w * scale))(*route(h))

    def mlp(self, h, lw: FamilyLayer, l: int, provider: ExpertProvider, observer) -> torch.Tensor:
        """A leading dense layer's FFN, or the routed experts plus the shared ones."""
        if lw.dense is not None:   # the carve's dense_gu where the engine planned one
            return lw.dense(h, buf=provider.workspace(l).dense, into=h)
        y = moe_block(h, l, self.router(lw), self.ffn, provider, observer)
        if lw.shared is None:
            return y                                 # the layer adds it rounded (add_rounded_)
        # the shared output plus y rounded to h's dtype (the same bits as y.to(h.dtype) +
        # shared: one rounded block at a time, no [T, D] copy of y nor a third for the sum)
        # its gate and up products in the experts' spare workspace (their passes have run),
        # its output in h, read by then
        return add_rounded_(lw.shared(h, buf=provider.workspace(l).spare(), into=h), y)
