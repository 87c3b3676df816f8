"""The MoE layer's two halves: the router and the expert FFN.

Legend: T tokens of the chunk, D hidden, F expert width, E experts, K top-k.

    logits = x @ W_router^T                      # [T, E], fp32
    p = softmax(logits); w, ids = topk(p, K)     # [T, K]; renormalized when norm_topk_prob
    y[t] = sum_k w[t, k] * down_e(silu(gate_e x_t) * up_e x_t),   e = ids[t, k]

The expert FFN reads each expert from an ExpertSet (arena + slot table). `expert_ffn()` picks the
implementation: the Triton `strata.kernels.moe_ffn` when it is importable, else the plain-torch
`moe_ffn_torch` below (same signature: (x, topk_ids, topk_w, experts) -> y).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from strata.experts import ExpertSet
from strata.models.dequant import dequant_matrix

ExpertFFN = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, ExpertSet], torch.Tensor]


def route(x: torch.Tensor, w_router: torch.Tensor, top_k: int, norm_topk_prob: bool
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, D], w_router [E, D] -> (topk_ids int64 [T, K], topk_w fp32 [T, K])."""
    logits = x.float() @ w_router.float().t()                         # [T, E]
    probs = torch.softmax(logits, dim=-1)
    topk_w, topk_ids = torch.topk(probs, top_k, dim=-1)               # [T, K]
    if norm_topk_prob:
        topk_w = topk_w / topk_w.sum(dim=-1, keepdim=True)
    return topk_ids, topk_w


def expert_weights(experts: ExpertSet, e: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp32 (gate [F, D], up [F, D], down [D, F]) of expert e, decoded from its blob."""
    off = int(experts.slot_offset[e])
    if off < 0:
        raise RuntimeError(f"expert {e} is routed to but absent from the expert set "
                           f"(the provider must make every routed expert resident)")
    blob = experts.arena[off:off + experts.layout.size]
    return tuple(dequant_matrix(blob, m) for m in experts.layout.matrices)  # type: ignore[return-value]


def moe_ffn_torch(x: torch.Tensor, topk_ids: torch.Tensor, topk_w: torch.Tensor,
                  experts: ExpertSet) -> torch.Tensor:
    """Plain-torch expert FFN: x [T, D], topk_ids/topk_w [T, K] -> y [T, D] in x's dtype.
    Decodes only the experts with tokens, computes in fp32."""
    T, D = x.shape
    y = torch.zeros(T, D, dtype=torch.float32, device=x.device)
    xf = x.float()
    for e in torch.unique(topk_ids).tolist():
        tok, slot = torch.nonzero(topk_ids == e, as_tuple=True)      # [n], [n]
        gate, up, down = expert_weights(experts, e)
        xe = xf[tok]                                                 # [n, D]
        h = F.silu(xe @ gate.t()) * (xe @ up.t())                    # [n, F]
        y.index_add_(0, tok, (h @ down.t()) * topk_w[tok, slot].float()[:, None])
    return y.to(x.dtype)


def expert_ffn(prefer: str = "auto") -> ExpertFFN:
    """The expert FFN to use: 'kernel' (Triton, must exist), 'torch', or 'auto' (kernel if built)."""
    if prefer == "torch":
        return moe_ffn_torch
    try:
        from strata.kernels.moe_ffn import moe_ffn  # type: ignore[import-not-found]
    except ImportError:
        if prefer == "kernel":
            from strata.errors import StrataError
            raise StrataError("the Triton expert GEMM strata.kernels.moe_ffn is not available in "
                              "this checkout; use the torch expert path") from None
        return moe_ffn_torch
    return moe_ffn
