"""The log-sum-exp merge kernel (strata.kernels.attention.merge.lse_merge) against its plain-torch
twin (lse_merge_torch, the blocked MLA attention's default merge).

- The interpreter on the CPU: random states and blocks, o strided as the kernels hand it over
  (the efficient kernel's [n, H, Hv] transposed, flash's [n, H, hd] cut to Hv), lse_b with a
  padded query stride, first and later blocks, rows not a multiple of the tile's; FIRST copies
  exactly; later blocks within the derived bound below. A layout the kernel does not take goes
  to the twin (the same bits).
- It compiles for sm_90 (tests/kernels/compile_merge.py --quick: no spills).
- On CUDA (gpu mark): DeepSeek-V3's merge (128 heads, 2048 queries, Hv 128, bf16 o) against the
  twin within the same bound.

Bound: each side computes new = logaddexp(l, lb) with absolute error <= 2u·(M + 1), M = max(|l|,
|lb|) of the row (u = 2^-24; the kernel's log(1 + x) against torch's log1p adds at most u), so
each weight exp(l - new), exp(lb - new) carries a relative error <= 4u·(M + 2) (the exp's own
ulps included), and acc·a + o·b adds 3u of |acc·a| + |o·b|: per element the two sides differ by
at most 2·(4u·(M + 2) + 3u)·(|acc| + |o|) <= 16u·(M + 3)·(|acc| + |o|); lse by 4u·(M + 1).
"""
from __future__ import annotations

import pytest
import torch

from strata.kernels.attention.merge import lse_merge, lse_merge_supported, lse_merge_torch
from tests.kernels.compiled import compile_lines

U32 = 2.0 ** -24


def case(H, n, D, W, seed, dtype=torch.float32, device="cpu", spread=8.0):
    """(acc, lse, o, lse_b): o a [H, n, D] view of [n, H, W] (W >= D), lse_b of [H, n + 3]."""
    g = torch.Generator().manual_seed(seed)
    acc = torch.randn(H, n, D, generator=g)
    lse = torch.randn(H, n, generator=g) * spread
    o = torch.randn(n, H, W, generator=g).to(dtype).transpose(0, 1)[..., :D]
    lb = (torch.randn(H, n + 3, generator=g) * spread)[:, :n]
    return tuple(t.to(device) for t in (acc, lse, o, lb))


def check(acc, lse, o, lb, first):
    a1, l1, a2, l2 = acc.clone(), lse.clone(), acc.clone(), lse.clone()
    lse_merge(a1, l1, o, lb, first)
    lse_merge_torch(a2, l2, o, lb, first)
    if first:
        assert torch.equal(a1, a2) and torch.equal(l1, l2)
        return
    M = torch.maximum(lse.abs(), lb.abs())
    tol_a = 16 * U32 * (M + 3)[..., None] * (acc.abs() + o.float().abs())
    assert ((a1 - a2).abs() <= tol_a).all(), float(((a1 - a2).abs() - tol_a).max())
    assert ((l1 - l2).abs() <= 4 * U32 * (M + 1)).all()


@pytest.mark.parametrize("H,n,D,W", [(3, 37, 12, 16), (2, 1, 128, 192), (4, 33, 7, 7),
                                     (1, 70, 16, 24)])
@pytest.mark.parametrize("first", [True, False])
def test_the_kernel_equals_its_twin(H, n, D, W, first):
    assert lse_merge_supported(*case(H, n, D, W, 0))
    for seed in range(3):
        check(*case(H, n, D, W, seed), first)


def test_bf16_blocks_and_far_apart_lse():
    """bf16 o (the kernels' dtype) and lse 40 apart: one side's weight underflows to ~0."""
    acc, lse, o, lb = case(2, 19, 24, 32, 5, dtype=torch.bfloat16, spread=20.0)
    check(acc, lse, o, lb, False)


def test_a_layout_the_kernel_does_not_take_goes_to_the_twin():
    acc, lse, o, lb = case(2, 9, 8, 8, 1)
    strided = torch.empty(9, 2, 8).transpose(0, 1)             # acc [H, n, D], not contiguous
    assert not lse_merge_supported(strided, lse, o, lb)
    a1, a2, l1, l2 = strided.copy_(acc), acc.clone(), lse.clone(), lse.clone()
    lse_merge(a1, l1, o, lb, False)
    lse_merge_torch(a2, l2, o, lb, False)
    assert torch.equal(a1, a2) and torch.equal(l1, l2)


def test_the_merge_kernel_compiles_for_h100():
    """The kernel compiles for sm_90 with triton's passes and ptxas (no GPU), at DeepSeek-V3's
    value width and merge_tile's tile, both FIRSTs, without register spills."""
    lines, out = compile_lines("compile_merge.py", "--quick", timeout=600)
    assert len(lines) == 2, out
    for line in lines:
        assert "spill 0/0" in line, line


@pytest.mark.gpu
@pytest.mark.parametrize("W", [128, 192])
@pytest.mark.parametrize("first", [True, False])
def test_deepseek_merge_on_the_gpu(W, first):
    """CUDA: DeepSeek-V3's merge, 128 heads x 2048 queries x Hv 128, bf16 o as the efficient
    kernel (W 128) or flash (W 192, cut to 128) hands it over, against the twin."""
    check(*case(128, 2048, 128, W, 3, dtype=torch.bfloat16, device="cuda"), first)
