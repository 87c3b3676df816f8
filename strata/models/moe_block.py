"""A layer's MoE block: route the tokens, then the expert FFN over each pass the provider yields.

Legend: T tokens of the chunk, D hidden, E experts, K top-k.

    topk_ids, topk_w = router(h)                  # [T, K] int64, [T, K] fp32
    for p in provider.passes(layer, topk_ids):    # strata.models.provider
        y += ffn(h, p.topk_ids, topk_w, p.experts)    # ids outside the pass read -1 (skipped)

A provider that vouches for its slot tables (LayerWorkspace.vouched: the streaming engine, the
resident arena) gets an FFN call with no host sync (check=False), and with a "yk" buffer its
passes leave their per-assignment rows there for one sum over K per layer
(LayerWorkspace.combine), instead of masking and summing T·K·D rows per pass.

The router is a function of h, so an architecture brings its own (softmax then top-k below for
Qwen3-MoE and Mixtral; a biased, grouped or sigmoid router is another function with the same
signature); the expert FFN is one of strata.models.moe's. Shared experts beside the routed ones
would add their dense FFN to y here.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from strata.errors import StrataError
from strata.kernels.moe.router import route_softmax_topk
from strata.models.moe import ExpertFFN
from strata.models.provider import ExpertProvider

Router = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]   # h [T, D] -> ids, w [T, K]


def route(x: torch.Tensor, w_router: torch.Tensor, top_k: int, norm_topk_prob: bool
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, D], w_router [E, D] -> (topk_ids int64 [T, K], topk_w fp32 [T, K]):
    p = softmax(x W^T) in fp32, the K largest, renormalized to sum 1 when norm_topk_prob.
    One kernel on CUDA activations in bf16, the fp32 torch ops elsewhere
    (strata.kernels.moe.router)."""
    return route_softmax_topk(x, w_router, top_k, renormalize=norm_topk_prob)


def softmax_topk(w_router: torch.Tensor, top_k: int, norm_topk_prob: bool) -> Router:
    """The softmax -> top-k router of one layer (Qwen3-MoE, Mixtral)."""
    return lambda h: route(h, w_router, top_k, norm_topk_prob)


def moe_block(h: torch.Tensor, layer: int, router: Router, ffn: ExpertFFN,
              provider: ExpertProvider, observer=None) -> torch.Tensor:
    """h [T, D] (already normed) -> y [T, D]: fp32 when the provider's workspace accumulates
    the passes, else the FFN's output dtype. `observer.routed(layer, topk_ids, topk_w)` sees the
    routing (strata.models.observe)."""
    topk_ids, topk_w = router(h)
    if observer is not None:
        observer.routed(layer, topk_ids, topk_w)
    ws = provider.workspace(layer)
    kw = ws.ffn_kwargs()
    if not ws.accumulate:
        passes = list(provider.passes(layer, topk_ids))
        if len(passes) != 1:
            raise StrataError(f"layer {layer}: a provider that does not accumulate must serve "
                              f"the layer in one pass, it yielded {len(passes)}")
        p = passes[0]
        return ffn(h, p.topk_ids, topk_w, p.experts, combine=ws.combine(p), **kw)
    y = ws.output(h)                                                   # fp32 [T, D]
    for p in provider.passes(layer, topk_ids):
        ffn(h, p.topk_ids, topk_w, p.experts, out=y, combine=ws.combine(p), **kw)
    return y
