"""What the expert-GEMM experiments share: their shapes, their inputs, the dense baseline and the
check every timed arm passes first.

Legend: T tokens, D hidden, F expert width, E experts, K top-k.

    experts = make_experts(shape, "Q8_0", device, distinct=8)      # E blobs in one arena
    wg, wu, wd = dense_weights(experts)                             # bf16 [E, out, in] each
    y = grouped_mm_ffn(x, topk_ids, topk_weights, wg, wu, wd)       # the dense ceiling, [T, D]
    rel_err(y, moe_ffn_torch(x, topk_ids, topk_weights, experts)) < DECODED_REL
"""
from __future__ import annotations

import torch

from strata.kernels.moe.ffn import dequantize_matrix
from strata.kernels.moe.grouping import group_ragged
from strata.kernels.moe.random_experts import random_expert_set
from strata.shapes import get_preset

# The normalized-error bounds of the check, the kernel tests' own (tests/kernels/test_moe_ffn.py
# explains them): a timed arm must be as right as the tested kernel.
BF16_REL = 1e-2
DECODED_REL = 1.5e-2
# the int8 path quantizes x and h to q8_1 besides: tests/kernels/test_moe_int8.py's FFN_REL
# (3.1 times a q8_1 block's worst relative error sqrt(32)/254, with the fp16 d's share)
INT8_REL = 3.1 * 32 ** 0.5 / 254 * (1 + 2.0 ** -3)

SHAPES = {"qwen3-30b-a3b": get_preset("qwen3-30b-a3b"), "seed-512e": get_preset("seed-512e")}
SMOKE_SHAPES = {"tiny": get_preset("tiny").with_(n_expert=5, top_k=2)}   # the CPU interpreter's


def make_experts(shape, fmt: str, device, distinct: int):
    """E experts whose blobs are `distinct` random ones repeated (quantizing 512 experts on the
    host would dominate the run); every expert still has its own bytes in the arena, so the
    kernel reads E different blobs."""
    base = random_expert_set(min(distinct, shape.n_expert), shape.d_model, shape.d_expert, fmt,
                             device="cpu", seed=0, shuffle=False)
    size = base.layout.size
    reps = -(-shape.n_expert // base.n_expert)
    arena = base.arena[:base.n_expert * size].to(device).repeat(reps)[:shape.n_expert * size]
    slot = torch.arange(shape.n_expert, dtype=torch.int64, device=device) * size
    return type(base)(arena.contiguous(), slot, base.layout)


def dense_weights(experts, names=("gate", "up", "down")) -> list[torch.Tensor]:
    """The experts' matrices decoded once to bf16, [E, out, in] per name."""
    return [torch.stack([dequantize_matrix(experts, e, n).to(torch.bfloat16)
                         for e in range(experts.n_expert)]) for n in names]


def grouped_mm_ffn(x, topk_ids, topk_weights, w_gate, w_up, w_down):
    """The dense baseline: ragged grouping, torch._grouped_mm on bf16 [E, out, in] weights, the
    weighted sum over K. x [T, D] -> [T, D] bf16."""
    T, K = topk_ids.shape
    rag = group_ragged(topk_ids, w_gate.shape[0])
    xs = x[rag.order // K]                                                     # [T·K, D]
    offs = rag.offsets[1:].to(torch.int32)
    if hasattr(torch, "_grouped_mm") and x.is_cuda:
        mm = lambda a, w: torch._grouped_mm(a, w.transpose(-2, -1), offs=offs)  # noqa: E731
    else:  # the CPU (smoke runs): a loop over experts with the same meaning
        def mm(a, w):
            out = a.new_empty(a.shape[0], w.shape[1])
            bounds = [0] + offs.tolist()
            for e in range(w.shape[0]):
                out[bounds[e]:bounds[e + 1]] = (a[bounds[e]:bounds[e + 1]].float()
                                                @ w[e].float().T).to(a.dtype)
            return out
    h = torch.nn.functional.silu(mm(xs, w_gate).float()) * mm(xs, w_up).float()  # [T·K, F]
    yk = mm(h.to(torch.bfloat16), w_down).float()                              # [T·K, D]
    yk = yk * topk_weights.reshape(-1)[rag.order, None]
    return yk[rag.inverse].view(T, K, -1).sum(1).to(torch.bfloat16)


def rel_err(y, ref) -> float:
    """Normalized error ‖y − ref‖ / ‖ref‖ (the check's measure)."""
    return ((y.float() - ref.float()).norm() / ref.float().norm()).item()
