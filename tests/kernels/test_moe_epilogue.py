"""The expert GEMM's bias and activation epilogue (GPT-OSS experts) against its torch twin.

A biased layout adds fp32 gate/up/down biases from the blob (strata.blob.BiasSlot); the
swiglu_oai activation clamps gate from above and up on both sides at `limit`, then
g·sigmoid(alpha·g)·(up + 1). Cases use a small limit (0.75) so that a good share of the
pre-activations is clamped and a kernel that skipped a clamp (or clamped the wrong side) misses.

Bound: BF16_REL as for the plain FFN (strata tests/kernels/test_moe_ffn.py): the kernel rounds h
and y to bf16, the reference keeps fp32; decoded formats (MXFP4, GPT-OSS's) add one bf16
rounding of the weights (DECODED_REL). The biases are added in fp32 on both sides.
Outputs start NaN-poisoned (tests/conftest.py), so an unwritten row fails.
"""
from __future__ import annotations

import zlib

import pytest
import torch

from strata.blob import ExpertAct
from strata.kernels import moe_ffn, moe_ffn_torch, pin_tile, topk_route
from strata.kernels.moe.ffn import expert_biases, glu
from strata.kernels.moe.random_experts import random_expert_set

BF16_REL = 1e-2
DECODED_REL = 1.5e-2
OAI = ExpertAct("swiglu_oai", alpha=1.702, limit=0.75)


def rel_err(y, ref):
    return ((y.float() - ref.float()).norm() / ref.float().norm()).item()


CASES = [  # id, T, E, K, fmts, bias, act, schedule, programs
    ("bias-silu-bf16", 7, 4, 2, ("BF16",), True, None, "dp", 4),
    ("oai-nobias-bf16", 7, 4, 2, ("BF16",), False, OAI, "dp", 4),
    ("oai-bias-bf16", 9, 5, 2, ("BF16",), True, OAI, "dp", 4),
    ("oai-bias-bf16-stream-k", 9, 5, 2, ("BF16",), True, OAI, "stream_k", 3),
    ("oai-bias-mxfp4", 6, 4, 2, ("MXFP4",), True, OAI, "dp", 4),
    ("oai-bias-mxfp4-q8-sk", 6, 4, 2, ("MXFP4", "MXFP4", "Q8_0"), True, OAI, "stream_k", 5),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_epilogue_matches_torch_twin(case):
    cid, T, E, K, fmts, bias, act, sched, progs = case
    seed = zlib.crc32(cid.encode())
    gen = torch.Generator().manual_seed(seed)
    ex = random_expert_set(E, 64, 32, *fmts, seed=seed, bias=bias, act=act)
    x = torch.randn(T, 64, generator=gen).bfloat16()
    ids, w = topk_route(torch.randn(T, E, generator=gen), K)
    ref = moe_ffn_torch(x, ids, w, ex)
    with pin_tile(schedule=sched, programs=progs, BLOCK_N=16, BLOCK_K=32):
        y = moe_ffn(x, ids, w, ex)
    assert not torch.isnan(y).any(), "output not fully written (NaN poison survived)"
    bound = BF16_REL if fmts == ("BF16",) else DECODED_REL
    assert rel_err(y, ref) < bound
    # the case means something: the biases and the activation change the result
    plain = random_expert_set(E, 64, 32, *fmts, seed=seed)
    assert rel_err(moe_ffn_torch(x, ids, w, plain), ref) > 10 * bound


def test_clamps_are_exercised_and_one_sided():
    """glu (the epilogue's twin) clamps gate only from above and up on both sides."""
    g = torch.tensor([-3.0, -0.5, 0.5, 3.0])
    u = torch.tensor([-3.0, -0.5, 0.5, 3.0])
    h = glu(g, u, OAI)
    lim = OAI.limit
    gc = torch.tensor([-3.0, -0.5, 0.5, lim])
    uc = torch.tensor([-lim, -0.5, 0.5, lim])
    assert torch.allclose(h, gc * torch.sigmoid(OAI.alpha * gc) * (uc + 1))
    assert torch.equal(glu(g, u, ExpertAct()), torch.nn.functional.silu(g) * u)


def test_bias_slot_is_read_per_expert():
    """Expert biases come from each expert's own blob (a shuffled arena): the torch twin's
    per-expert read is what the kernel is checked against, so check it here directly."""
    ex = random_expert_set(3, 64, 32, "BF16", seed=3, bias=True)
    seen = [expert_biases(ex, e) for e in range(3)]
    assert all(b[0].shape == (32,) and b[1].shape == (32,) and b[2].shape == (64,) for b in seen)
    assert not torch.equal(seen[0][0], seen[1][0])
    assert ex.layout.size >= ex.layout.bias.offset + 4 * (2 * 32 + 64)


def test_decoded_ffn_runs_biased_experts():
    """Decode-once carries the biases into its BF16 blobs and runs this same epilogue: the fused
    kernel's result at one tile and the decode dot (tests/kernels/test_moe_decoded_biased.py)."""
    from strata.kernels.moe.decoded import moe_ffn_decoded
    ex = random_expert_set(3, 64, 32, "Q8_0", seed=1, bias=True, act=OAI)
    x = torch.randn(2, 64).bfloat16()
    ids, w = topk_route(torch.randn(2, 3), 2)
    with pin_tile(schedule="dp", BLOCK_N=16, BLOCK_K=32, dot="decode"):
        y = moe_ffn_decoded(x, ids, w, ex)
        assert torch.equal(y, moe_ffn(x, ids, w, ex))
    assert rel_err(y, moe_ffn_torch(x, ids, w, ex)) < DECODED_REL


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_epilogue_matches_torch_twin_gpu(case):
    cid, T, E, K, fmts, bias, act, sched, progs = case
    seed = zlib.crc32(cid.encode())
    gen = torch.Generator().manual_seed(seed)
    ex = random_expert_set(E, 64, 32, *fmts, seed=seed, bias=bias, act=act, device="cuda")
    x = torch.randn(T, 64, generator=gen).bfloat16().cuda()
    ids, w = topk_route(torch.randn(T, E, generator=gen), K)
    ids, w = ids.cuda(), w.cuda()
    ref = moe_ffn_torch(x, ids, w, ex)
    with pin_tile(schedule=sched, programs=progs):
        y = moe_ffn(x, ids, w, ex)
    assert not torch.isnan(y).any()
    assert rel_err(y, ref) < (BF16_REL if fmts == ("BF16",) else DECODED_REL)
