"""The dense SwiGLU FFN: a leading dense layer's FFN, and the shared experts beside the routed
ones (DeepSeek-V3, Kimi-K2, GLM-4.5).

Legend: T tokens, D hidden, F the FFN's width.

    y = down(silu(gate x) * up x)          x [T, D], gate/up [F, D], down [D, F] -> y [T, D]

Shared experts are dense weights that stay resident (counted in the layer's dense bytes,
strata.planning.layer_dense_bytes), not blobs pinned in the expert cache: every token of every
chunk reads them, so streaming them would cost their bytes per layer per chunk, and a pinned
blob would still need a second GEMM launch over all T rows; resident bf16 they are one dense
matmul on the activations' dtype, like the attention projections.

Kept as GGUF blocks on the GPU (strata.models.block_weight), each matrix is decoded just before
its product and dropped after it (`decodes_itself`: a layer's turn leaves them to the FFN), so a
leading dense layer's turn holds one of its three matrices decoded, not all three.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from strata.models.block_weight import dense
from strata.models.layers import buf_view, matmul_into


@dataclass
class DenseFFN:
    gate: torch.Tensor   # [F, D]
    up: torch.Tensor     # [F, D]
    down: torch.Tensor   # [D, F]

    decodes_itself = True    # a layer's turn leaves its BlockWeights to __call__ (decode_phase)

    def __call__(self, x: torch.Tensor, buf: torch.Tensor | None = None,
                 into: torch.Tensor | None = None) -> torch.Tensor:
        """y [T, D] of x [T, D]. `buf` (flat, >= 2·T·F values in x's dtype: the engine's carve,
        strata.planning.DENSE_FFN_BUF) holds the gate and up products, silu(gate)·up computed
        in place, instead of allocating them: the same kernels, the same bits. `into`: where y
        goes when it takes it (layers.into_view; a layer passes x itself, read by then)."""
        T, Fw = x.shape[0], self.gate.shape[0]
        gu = buf_view(buf, (2, T, Fw), x.dtype, x.device)
        if gu is None:   # silu and the product in place: two [T, F] at once, not three
            a = F.silu(x @ dense(self.gate).t(), inplace=True)   # one matrix decoded at a time
            a.mul_(x @ dense(self.up).t())
            return matmul_into(a, dense(self.down), into)
        g, u = gu
        F.silu(torch.matmul(x, dense(self.gate).t(), out=g), inplace=True)
        g.mul_(torch.matmul(x, dense(self.up).t(), out=u))
        return matmul_into(g, dense(self.down), into)

    def map(self, fn) -> "DenseFFN":
        return DenseFFN(fn(self.gate), fn(self.up), fn(self.down))
