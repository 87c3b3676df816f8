"""The log-sum-exp merge of attention blocks: fold one key block's (o, lse_b) into a query
block's fp32 state (acc, kept normalized, and lse), as MLA's blocked attention does after each
key block (strata.models.mla).

    lse_merge_torch(acc, lse, o, lse_b, first)   plain torch, the twin (and today's default)
    lse_merge(acc, lse, o, lse_b, first)         one Triton launch (strata.kernels.attention.
                                                 _merge_kernel), the same signature

Legend: H heads, n queries, D value width. acc fp32 [H, n, D], lse fp32 [H, n] (contiguous),
o [H, n, D] (last dim contiguous; any head and query strides), lse_b fp32 [H, n]:
    acc <- (acc e^lse + o e^lse_b) / e^new,  lse <- new = log(e^lse + e^lse_b);  first: o, lse_b.
The twin takes a logaddexp, two exps and two [H, n] differences over the small [H, n] rows and
two passes over acc (mul_, then addcmul_: 18 bytes an element of traffic); the kernel one pass
(acc read and written, o read: 10 bytes an element with bf16 o). Off CUDA the kernel runs
through Triton's interpreter (the CPU tests), or the twin where there is none.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from strata._backend import INTERPRET


def lse_merge_torch(acc: torch.Tensor, lse: torch.Tensor, o: torch.Tensor, lse_b: torch.Tensor,
                    first: bool) -> None:
    """Fold one key block's (o [H, n, D], lse_b [H, n]) into the fp32 state in place:
    acc <- (acc e^lse + o e^lse_b) / e^new, lse <- new = log(e^lse + e^lse_b)."""
    if first:
        acc.copy_(o)
        lse.copy_(lse_b)
        return
    new = torch.logaddexp(lse, lse_b)
    acc.mul_((lse - new).exp_().unsqueeze(-1))
    acc.addcmul_(o, (lse_b - new).exp_().unsqueeze(-1))
    lse.copy_(new)


@dataclass(frozen=True)
class MergeTile:
    block_m: int        # rows a program
    num_warps: int


def merge_tile(width: int) -> MergeTile:
    """~4K elements a program (32 rows of 128: DeepSeek's value heads), 4 warps."""
    return MergeTile(max(1, 4096 // triton.next_power_of_2(width)), 4)


def lse_merge_supported(acc, lse, o, lse_b) -> bool:
    """The kernel's layout: acc and lse contiguous fp32, o and lse_b last dim contiguous, on
    CUDA or under the interpreter."""
    return ((acc.is_cuda or INTERPRET) and acc.dtype == lse.dtype == lse_b.dtype == torch.float32
            and acc.is_contiguous() and lse.is_contiguous() and o.stride(-1) == 1
            and lse_b.stride(-1) == 1 and o.shape == acc.shape and lse_b.shape == lse.shape)


def lse_merge(acc: torch.Tensor, lse: torch.Tensor, o: torch.Tensor, lse_b: torch.Tensor,
              first: bool) -> None:
    """lse_merge_torch's meaning in one launch (the twin where the layout does not fit)."""
    if not lse_merge_supported(acc, lse, o, lse_b):
        return lse_merge_torch(acc, lse, o, lse_b, first)
    from strata.kernels.attention._merge_kernel import _lse_merge_kernel
    H, n, D = acc.shape
    t = merge_tile(D)
    rows = H * n
    if rows == 0:
        return
    _lse_merge_kernel[(triton.cdiv(rows, t.block_m),)](
        acc, lse, o, lse_b, rows, n, o.stride(0), o.stride(1), lse_b.stride(0), D=D,
        BM=t.block_m, BD=triton.next_power_of_2(D), FIRST=first, num_warps=t.num_warps)


__all__ = ["MergeTile", "lse_merge", "lse_merge_supported", "lse_merge_torch", "merge_tile"]
