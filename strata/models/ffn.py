"""The dense SwiGLU FFN: a leading dense layer's FFN, and the shared experts beside the routed
ones (DeepSeek-V3, Kimi-K2, GLM-4.5).

Legend: T tokens, D hidden, F the FFN's width.

    y = down(silu(gate x) * up x)          x [T, D], gate/up [F, D], down [D, F] -> y [T, D]

Shared experts are dense weights that stay resident (counted in the layer's dense bytes,
strata.planning.layer_dense_bytes), not blobs pinned in the expert cache: every token of every
chunk reads them, so streaming them would cost their bytes per layer per chunk, and a pinned
blob would still need a second GEMM launch over all T rows; resident bf16 they are one dense
matmul on the activations' dtype, like the attention projections.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class DenseFFN:
    gate: torch.Tensor   # [F, D]
    up: torch.Tensor     # [F, D]
    down: torch.Tensor   # [D, F]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return (F.silu(x @ self.gate.t()) * (x @ self.up.t())) @ self.down.t()

    def map(self, fn) -> "DenseFFN":
        return DenseFFN(fn(self.gate), fn(self.up), fn(self.down))
