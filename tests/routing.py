"""Whether a test prompt routes clear of ties: the smallest gap, over every layer and token,
between the K-th and the (K+1)-th router logit, and the experts picked, in a read of the pack.

A test that compares a bf16 read with another read (or with the fp32 reference) holds them to a
bf16-level bound. Top-K routing is not continuous: where two experts' logits nearly tie, a bf16
rounding of the hidden state picks the other expert, and that token's output moves by a whole
expert's share, far past any such bound. A random draw can hold such a tie: tiny gpt-oss, seed
0, has a gap of 0.0006 (layer 1), and its bf16 read differs from the fp32 one by 0.49 at one
token against 0.01 at the others. On these tiny models (logits up to ~3) bf16 moves a logit by
up to ~0.03, so a gap alone does not settle it: a fixture that feeds a bf16 comparison takes a
draw whose fp32 and bf16 reads (on the CPU, torch's ops) pick the same experts with at least
ROUTING_GAP to spare, and asserts so. A later change of the draws then fails there, by name,
instead of as a tolerance miss in the comparison.

    assert clear_routing(pack, tokens)

Softmax routers with an optional bias (the layer's `router` [E, D], `router_bias` [E]): the
logits the top-K selection orders.
"""
from __future__ import annotations

import torch

from strata.engine.load import load_model, resident_provider
from strata.models.moe import expert_ffn
from strata.models.moe_decoder import MoeDecoder

ROUTING_GAP = 0.015     # logit units, in both reads


def routing(pack, tokens: torch.Tensor, dtype: torch.dtype) -> tuple[float, list]:
    """(the least K-th minus (K+1)-th router logit, each layer's picked experts [T, K] sorted)
    over the layers and `tokens` of the pack's read in `dtype` on the CPU (one chunk)."""
    model = load_model(pack, dtype=dtype, ffn=expert_ffn("ref"))
    K, gaps, picks = model.shape.top_k, [], []

    class Watched(type(model)):
        def mlp(self, h, lw, l, provider, observer):
            logits = h.float() @ lw.router.float().t()
            if getattr(lw, "router_bias", None) is not None:
                logits = logits + lw.router_bias.float()
            top = logits.topk(K + 1, dim=-1)
            gaps.append(float((top.values[:, K - 1] - top.values[:, K]).min()))
            picks.append(top.indices[:, :K].sort(dim=-1).values)
            return super().mlp(h, lw, l, provider, observer)

    assert isinstance(model, MoeDecoder)
    model.__class__ = Watched
    model.prefill(tokens, resident_provider(pack), chunk=len(tokens))
    return min(gaps), picks


def clear_routing(pack, tokens: torch.Tensor) -> bool:
    """The fp32 and bf16 reads pick the same experts, each with ROUTING_GAP to spare."""
    (g32, p32), (g16, p16) = (routing(pack, tokens, d) for d in (torch.float32, torch.bfloat16))
    return (min(g32, g16) >= ROUTING_GAP
            and all(torch.equal(a, b) for a, b in zip(p32, p16)))
