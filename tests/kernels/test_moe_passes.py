"""Passes over subsets of a layer's experts (the streaming engine's batches) add up to the whole.

An id of -1 skips an assignment; `out` accumulates passes in fp32; `workspace` buffers replace
the launch's own allocations. Why each case: the engine runs a layer as cached experts first,
then ring batches; a pass can hold experts nobody routed to (an empty launch); a workspace too
small must be refused, never overrun.
"""
import pytest
import torch

from strata.errors import StrataError
from strata.kernels import moe_ffn, moe_ffn_torch
from strata.kernels.moe.grouping import group_blocked
from strata.kernels.moe.random_experts import random_expert_set

FP32_PASSES_REL = 1e-5   # fp32 sums of the same products in another order
BF16_REL = 1e-2          # the Triton GEMM against the fp32 torch reference (its test file's bound)


def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def split_ids(ids, groups):
    return [torch.where(torch.isin(ids, torch.tensor(g)), ids, -1) for g in groups]


@pytest.mark.parametrize("fn", [moe_ffn, moe_ffn_torch], ids=["triton", "torch"])
def test_passes_sum_to_the_whole(fn):
    g = torch.Generator().manual_seed(3)
    E, D, F, T, K = 7, 64, 32, 19, 3
    experts = random_expert_set(E, D, F, "Q8_0", up="Q4_0", down="BF16", seed=5)
    x = torch.randn(T, D, generator=g).bfloat16()
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    w = torch.softmax(torch.randn(T, K, generator=g), -1)
    whole = torch.zeros(T, D)
    fn(x, ids, w, experts, out=whole)
    acc = torch.zeros(T, D)
    for part in split_ids(ids, [[0, 3], [1, 2, 6], [4], [5]]):
        fn(x, part, w, experts, out=acc)
    assert rel(acc, whole) < FP32_PASSES_REL
    assert rel(whole, moe_ffn_torch(x, ids, w, experts).float()) < BF16_REL


def test_a_pass_nobody_routed_to_adds_nothing():
    experts = random_expert_set(4, 64, 32, "BF16")
    x = torch.randn(5, 64).bfloat16()
    ids = torch.full((5, 2), -1)
    acc = torch.ones(5, 64)
    moe_ffn(x, ids, torch.full((5, 2), 0.5), experts, out=acc)
    assert torch.equal(acc, torch.ones(5, 64))


def test_workspace_is_used_and_checked():
    experts = random_expert_set(4, 64, 32, "Q8_0")
    x = torch.randn(9, 64).bfloat16()
    ids = torch.randint(0, 4, (9, 2))
    w = torch.full((9, 2), 0.5)
    ws = {"h": torch.full((9 * 2 + 4 * 15, 32), float("nan")).bfloat16(),
          "yk": torch.full((18, 64), float("nan"))}
    y = moe_ffn(x, ids, w, experts, workspace=ws)
    assert not torch.isnan(ws["yk"]).any(), "the launch wrote its rows into the workspace"
    assert rel(y, moe_ffn_torch(x, ids, w, experts)) < 1.5e-2
    with pytest.raises(StrataError, match="workspace\\['yk'\\]"):
        moe_ffn(x, ids, w, experts, workspace={"h": ws["h"], "yk": ws["yk"][:5]})


def test_group_blocked_skips_negative_ids():
    ids = torch.tensor([[0, -1], [2, 0], [-1, -1], [2, 1]])
    grp = group_blocked(ids, 3, 4, skip_negative=True)
    assert grp.n_skipped == 3 and grp.counts.tolist() == [2, 1, 2]
    rows = grp.sorted_ids[grp.sorted_ids < grp.n_assign].tolist()
    assert sorted(rows) == [i for i, e in enumerate(ids.flatten().tolist()) if e >= 0]
    with pytest.raises(StrataError, match="outside"):
        group_blocked(ids, 3, 4)                       # without the flag -1 is an error
