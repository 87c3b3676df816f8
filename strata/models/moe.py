"""The expert FFNs a model's MoE block can run (strata.models.moe_block routes, then calls one).

Legend: T tokens of the chunk, D hidden, F expert width, E experts, K top-k.

    y[t] = sum_k w[t, k] * down_e(silu(gate_e x_t) * up_e x_t),   e = ids[t, k]

All are `(x, topk_ids, topk_w, experts, *, out=None, scratch_alloc=None, workspace=None) -> y`
with y in x's dtype, or added into `out` (fp32) when given (scratch_alloc and workspace: what the
provider lends, strata.models.provider.LayerWorkspace):
- "kernel": the Triton expert GEMM `strata.kernels.moe_ffn` (bf16 in, fp32 accumulate, bf16 h and y)
- "decoded": decode the pass's experts once, then the same GEMM on BF16 (strata.kernels.moe.decoded)
- "auto":   "decoded" when an expert averages >= decoded_min_rows(experts) rows, else "kernel"
- "plane":  the plane-layout GEMM `strata.kernels.moe.plane.plane_ffn` (Q8_0/Q4_0/Q4_K experts whose
            blobs were re-laid into code and scale planes as they landed: the engine's
            strata.planes.Landing; it takes PlaneSets, an ExpertSet is a StrataError)
- "torch":  its plain-torch twin `strata.kernels.moe_ffn_torch` (same bf16 contract)
- "ref":    `moe_ffn_ref` below: every product in fp32, x not rounded (the reference forward)
Block decoding is the kernels' own (`dequantize_matrix`).
"""
from __future__ import annotations

from typing import Callable

import torch

from strata.errors import StrataError
from strata.experts import ExpertSet
from strata.kernels.moe.ffn import expert_forward

ExpertFFN = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, ExpertSet], torch.Tensor]
FFN_CHOICES = ("auto", "kernel", "decoded", "plane", "torch", "ref")


def moe_ffn_ref(x: torch.Tensor, topk_ids: torch.Tensor, topk_w: torch.Tensor,
                experts: ExpertSet, *, out: torch.Tensor | None = None, **_) -> torch.Tensor:
    """fp32 reference expert FFN: x [T, D] (any float dtype), topk [T, K] -> y [T, D] in x's
    dtype. Decodes only the experts with tokens; an absent routed expert is a StrataError; an id of
    -1 skips that assignment (it belongs to another pass over the layer's experts).
    `scratch_alloc` is accepted and ignored (no stream-k here)."""
    T, D = x.shape
    y = torch.zeros(T, D, dtype=torch.float32, device=x.device)
    xf = x.float()
    for e in torch.unique(topk_ids).tolist():
        if e < 0:  # an assignment outside this pass of experts (the streaming engine's batches)
            continue
        tok, slot = torch.nonzero(topk_ids == e, as_tuple=True)      # [n], [n]
        ye = expert_forward(xf[tok], experts, e)                     # [n, D] (biases, act)
        y.index_add_(0, tok, ye * topk_w[tok, slot].float()[:, None])
    if out is not None:   # a pass of the streaming engine: add into the fp32 accumulator
        return out.add_(y)
    return y.to(x.dtype)


def _bf16(fn) -> ExpertFFN:
    """Adapt a bf16-contract expert FFN to any activation dtype (bf16 in, y back in x's dtype)."""
    def ffn(x, topk_ids, topk_w, experts, **kw):
        y = fn(x.to(torch.bfloat16), topk_ids, topk_w, experts, **kw)
        return y if kw.get("out") is not None else y.to(x.dtype)
    ffn.__name__ = fn.__name__
    return ffn


# "auto" decodes a pass's experts once (then the BF16 GEMM) when an expert averages at least this
# many rows: below it, decoding whole experts for a handful of tokens costs more than the fused
# kernel's in-loop decode. Measured on the H200 (experiments/results/kernel_bench_full.csv,
# d167d62): formats without a fast fused path (Q4_K, Q2_0, IQ3_S, ...) gain from 32 rows on
# (qwen3-30b-a3b T=512: IQ3_S 7.4 vs 2.4 TFLOP/s); Q8_0/Q4_0's fused kernel wins at 32-40 rows
# (seed-512e T=2048: 52.3 vs 34.8) and ties at 128 (qwen3 T=2048: 54.5 vs 56.7).
DECODED_MIN_ROWS = 32
DECODED_MIN_ROWS_FAST = 128


def decoded_min_rows(experts: ExpertSet) -> int:
    """Rows per expert from which "auto" decodes first, for this expert set's formats."""
    from strata.kernels.decode import FAST_CODE_FORMATS
    fast = all(m.fmt.name in FAST_CODE_FORMATS + ("BF16",) for m in experts.layout.matrices)
    return DECODED_MIN_ROWS_FAST if fast else DECODED_MIN_ROWS


def _auto(x, topk_ids, topk_w, experts, **kw):
    from strata.kernels.moe.decoded import moe_ffn_decoded
    from strata.kernels.moe.ffn import moe_ffn
    rows = topk_ids.numel() / max(1, experts.n_expert)
    # the decoded path's BF16 experts have no bias slot: biased experts take the fused kernel
    fn = (moe_ffn_decoded if experts.layout.plain and rows >= decoded_min_rows(experts)
          else moe_ffn)  # moe_ffn ignores wdec
    return fn(x, topk_ids, topk_w, experts, **kw)


def plane_landing(name: str, layouts):
    """The strata.planes.Landing an engine runs on each blob as it lands when its experts run
    through FFN `name` ("plane"), else None. A StrataError names a layer the plane GEMM cannot
    read."""
    if name != "plane":
        return None
    from strata.kernels.moe.plane import KERNEL_FORMATS
    from strata.planes import Landing
    return Landing(layouts, KERNEL_FORMATS)


def expert_ffn(name: str = "kernel") -> ExpertFFN:
    """The expert FFN called `name` (one of FFN_CHOICES)."""
    if name == "kernel":
        from strata.kernels.moe.ffn import moe_ffn
        return _bf16(moe_ffn)
    if name == "decoded":
        from strata.kernels.moe.decoded import moe_ffn_decoded
        return _bf16(moe_ffn_decoded)
    if name == "auto":
        return _bf16(_auto)
    if name == "plane":
        from strata.kernels.moe.plane import plane_ffn
        return _bf16(plane_ffn)
    if name == "torch":
        from strata.kernels.moe.ffn import moe_ffn_torch
        return _bf16(moe_ffn_torch)
    if name == "ref":
        return moe_ffn_ref
    raise StrataError(f"unknown expert FFN {name!r}; choose one of {', '.join(FFN_CHOICES)}")
