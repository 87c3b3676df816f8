"""The decoder of the DeepSeek / GLM-4.5 family: leading dense layers, shared experts and a
grouped sigmoid router beside the routed experts; the attention is the wiring's own.

Legend: T tokens of the chunk, D hidden, E experts, K top-k, L layers.

Per layer l:
    h = x + attn(rms(x))                                  # glm4moe.py (GQA) / deepseek.py (MLA)
    l <  n_dense_lead:  x = h + ffn(rms(h))               # a dense SwiGLU, no experts (ffn.py)
    l >= n_dense_lead:  x = h + moe(rms(h)) + shared(rms(h))
                        moe: grouped sigmoid top-k (routers.py), experts through the provider's
                        passes (moe_block.py); shared: resident dense SwiGLU (ffn.py)
then logits = W_out rms(x) (Qwen3Moe's embed / head, inherited).

A dense layer still brackets its compute with provider.begin_layer / end_layer (the protocol's
per-layer hooks: observers time it) but asks for no passes: it has no blobs, no cache slots,
and the plan counts its FFN in its dense bytes (strata.planning.layer_dense_bytes).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch

from strata.errors import StrataError
from strata.models.ffn import DenseFFN
from strata.models.layers import on_device, rms_norm, shape_cos_sin
from strata.models.moe import ExpertFFN, moe_ffn_ref
from strata.models.moe_block import moe_block, softmax_topk
from strata.models.provider import ExpertProvider
from strata.models.qwen3moe import Qwen3Moe
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
    shared: DenseFFN | None = None     # the shared experts (n_shared * F wide)

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


class FamilyMoe(Qwen3Moe):
    """A family wiring subclasses this with `attention_weights(get, l)` (its weights of layer l
    from `get(name)`), `attention(xn, lw, cos, sin, cache, l)` and `new_cache(capacity)`;
    FFN_NORM names its pre-FFN norm (llama.cpp's name)."""
    FFN_NORM = "ffn_norm"

    # -- weights -------------------------------------------------------------------------------
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
        if shape.router == "sigmoid":
            lw.bias = get(p + "exp_probs_b.bias").float()   # routing is fp32 (as HF keeps it)
        if shape.n_shared:
            lw.shared = DenseFFN(*(get(f"{p}ffn_{w}_shexp.weight") for w in ("gate", "up", "down")))
        return lw

    @classmethod
    def from_tensors(cls, shape: ModelShape, tensors: Mapping[str, torch.Tensor], *,
                     device="cpu", dtype: torch.dtype = torch.float32,
                     ffn: ExpertFFN | None = None, device_map=None):
        devs = list(device_map) if device_map is not None else [device] * shape.n_layer
        if len(devs) != shape.n_layer:
            raise StrataError(f"device_map names {len(devs)} devices for {shape.n_layer} layers")

        def put(name, dev):
            return tensors[name].to(device=dev, dtype=dtype)
        layers = [cls.layer_weights(shape, lambda n, d=devs[l]: put(n, d), l)
                  for l in range(shape.n_layer)]
        head = "output.weight" if "output.weight" in tensors else "token_embd.weight"
        return cls(shape, put("token_embd.weight", devs[0]), layers,
                   put("output_norm.weight", devs[-1]), put(head, devs[-1]), ffn=ffn)

    @property
    def layer_devices(self) -> list[torch.device]:
        return [lw.attn_norm.device for lw in self.layers]

    # -- forward -------------------------------------------------------------------------------
    def attention(self, xn, lw: FamilyLayer, cos, sin, cache, l: int) -> torch.Tensor:
        raise NotImplementedError

    def router(self, lw: FamilyLayer):
        s = self.shape
        if s.router == "sigmoid":
            return sigmoid_router(lw.router, lw.bias, s)
        route = softmax_topk(lw.router, s.top_k, s.norm_topk_prob)
        if s.routed_scale == 1.0:
            return route
        return lambda h: (lambda ids, w: (ids, w * s.routed_scale))(*route(h))

    def forward_layers(self, x: torch.Tensor, cache, provider: ExpertProvider, layers: range,
                       *, observer=None) -> torch.Tensor:
        s = self.shape
        T, P = x.shape[0], cache.length
        pos = torch.arange(P, P + T, device=x.device)
        rope = {x.device: shape_cos_sin(pos, s)}
        for l in layers:
            lw = self.layers[l]
            provider.begin_layer(l)
            dev = lw.attn_norm.device
            if x.device != dev:  # a layer split: hand the hidden state to the next GPU
                x = x.to(dev)
                if x.device not in rope:
                    rope[x.device] = tuple(t.to(x.device) for t in rope[pos.device])
            cos, sin = rope[x.device]
            with on_device(x.device):
                x = x + self.attention(rms_norm(x, lw.attn_norm, s.rms_eps), lw, cos, sin, cache, l)
                h = rms_norm(x, lw.ffn_norm, s.rms_eps)
                if lw.dense is not None:
                    x = x + lw.dense(h)
                else:
                    y = moe_block(h, l, self.router(lw), self.ffn, provider, observer).to(x.dtype)
                    if lw.shared is not None:
                        y = y + lw.shared(h)
                    x = x + y
            if observer is not None:
                observer.layer_done(l, x)
            provider.end_layer(l)
        return x

    def with_ffn(self, ffn: ExpertFFN) -> "FamilyMoe":
        return type(self)(self.shape, self.tok_embd, self.layers, self.out_norm, self.lm_head,
                          ffn=ffn)

    def reference(self) -> "FamilyMoe":
        """The reference twin: dense weights in fp32, experts through `moe_ffn_ref`."""
        return type(self)(self.shape, self.tok_embd.float(),
                          [lw.map(torch.Tensor.float) for lw in self.layers],
                          self.out_norm.float(), self.lm_head.float(), ffn=moe_ffn_ref)
