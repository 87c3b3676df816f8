"""MLA chunked-prefill attention (strata.models.mla): the expanded form the model runs (keys
decompressed a block at a time, blocks merged by log-sum-exp) equals the absorbed form (attend
in the latent space, fp64) on fresh random data, for any chunk position, block size and width;
and the model's MLA cache holds Lkv + R values per token (what the plan counts).

Bound: 1e-5 relative to max |o| (fp32 against fp64: sums over <= 64 keys of O(1) terms).
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings, strategies as st

from strata.models.mla import mla_chunk_attention, mla_chunk_attention_absorbed, whole_q
from strata.models.mla_launch import BACKENDS, MLALaunch, pin_mla_launch
from strata.shapes import get_preset, mla_token_bytes

REL = 1e-5


def draw(H, T, P, N, R, Hv, L, seed):
    g = torch.Generator().manual_seed(seed)
    S = P + T
    return (torch.randn(H, T, N, generator=g), torch.randn(H, T, R, generator=g),
            torch.randn(S, L, generator=g), torch.randn(S, R, generator=g),
            torch.randn(H * (N + Hv), L, generator=g) / L ** 0.5)


@settings(max_examples=40, deadline=None)
@given(H=st.integers(1, 4), T=st.integers(1, 9), P=st.integers(0, 40), N=st.integers(1, 8),
       R=st.sampled_from([2, 4, 8]), Hv=st.integers(1, 8), L=st.integers(1, 16),
       block=st.integers(1, 50), sdpa=st.booleans(), seed=st.integers(0, 999))
@example(H=2, T=5, P=0, N=4, R=2, Hv=3, L=8, block=1, sdpa=False, seed=0).via(
    "one key and one query a block, first chunk")
@example(H=2, T=1, P=33, N=4, R=4, Hv=4, L=8, block=7, sdpa=False, seed=1).via(
    "one query after several key blocks")
@example(H=2, T=9, P=3, N=4, R=4, Hv=4, L=8, block=4, sdpa=False, seed=2).via(
    "query blocks that end inside the chunk")
@example(H=2, T=6, P=0, N=4, R=2, Hv=3, L=8, block=4, sdpa=True, seed=3).via(
    "the fused path on a first chunk (is_causal)")
def test_expanded_equals_absorbed(H, T, P, N, R, Hv, L, block, sdpa, seed):
    q_nope, q_pe, c, k_pe, wkvb = draw(H, T, P, N, R, Hv, L, seed)
    kw = dict(v_head_dim=Hv, scale=(N + R) ** -0.5)
    got = mla_chunk_attention(q_nope, q_pe, c, k_pe, wkvb, block=block, sdpa=sdpa, **kw)
    want = mla_chunk_attention_absorbed(q_nope, q_pe, c, k_pe, wkvb, **kw)
    assert got.shape == (T, H, Hv) and torch.isfinite(got).all()
    assert float((got - want).abs().max() / want.abs().max()) < REL


def test_causal_within_the_chunk():
    """Query t of the chunk does not see key P+t+1: changing later keys leaves it alone."""
    q_nope, q_pe, c, k_pe, wkvb = draw(2, 4, 3, 4, 2, 4, 8, 5)
    kw = dict(v_head_dim=4, scale=0.3, block=2, sdpa=False)
    a = mla_chunk_attention(q_nope, q_pe, c, k_pe, wkvb, **kw)
    c2, k2 = c.clone(), k_pe.clone()
    c2[-1] += 5
    k2[-1] -= 5
    b = mla_chunk_attention(q_nope, q_pe, c2, k2, wkvb, **kw)
    assert torch.equal(a[:3], b[:3]) and not torch.equal(a[3], b[3])


def test_whole_q_is_the_one_tensor_when_the_parts_are_its_columns():
    """mla_attention's q_nope and q_pe are the column ranges of one [H, T, hd] view (rotated in
    place): whole_q hands that tensor back, no copy; parts that are not side by side in one
    storage (apart, swapped, another dtype) are joined, the same values."""
    H, T, N, R = 3, 5, 4, 2
    q = torch.randn(T, H, N + R).transpose(0, 1)                              # [H, T, hd]
    got = whole_q(q[..., :N], q[..., N:])
    assert got.data_ptr() == q.data_ptr() and got.stride() == q.stride() and torch.equal(got, q)
    assert whole_q(q[:, 1:4, :N], q[:, 1:4, N:]).data_ptr() == q[:, 1:4].data_ptr()
    apart = [q[..., :N].clone(), q[..., N:].clone()]
    for a, b in (apart, (q[..., N:N + 2], q[..., :N]), (q[..., :N], q[..., N:].double())):
        j = whole_q(a, b)
        assert j.data_ptr() not in (q.data_ptr(), a.data_ptr()) and j.is_contiguous()
        assert torch.equal(j, torch.cat([a, b.to(j.dtype)], -1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_q_as_one_tensor_reads_as_q_in_two(backend):
    """The blocked attention given q_nope and q_pe as views of one q (no join) gives the bits
    it gives them as two tensors, under every backend."""
    q_nope, q_pe, c, k_pe, wkvb = draw(2, 9, 6, 4, 2, 3, 8, 7)
    one = torch.cat([q_nope, q_pe], -1).transpose(0, 1).contiguous().transpose(0, 1)
    kw = dict(v_head_dim=3, scale=0.4, block=4, sdpa=True)
    with pin_mla_launch(MLALaunch(backend, 4)):
        two = mla_chunk_attention(q_nope, q_pe, c, k_pe, wkvb, **kw)
        views = mla_chunk_attention(one[..., :4], one[..., 4:], c, k_pe, wkvb, **kw)
    assert torch.equal(two, views)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_q_as_one_tensor_on_the_gpu(backend):
    """On the GPU, DeepSeek-V3's widths (H 16 of 128, N 128, R 64, Hv 128), a later chunk: q as
    mla_attention hands it (the column ranges of one [T, H, hd] buffer, seen head-major) reads
    as the joined q. The kernels take any head stride; a layout may pick another cuDNN engine, so
    cuDNN's outputs are held to two bf16 steps of max |o| and the others to the bit."""
    q_nope, q_pe, c, k_pe, wkvb = (t.cuda().bfloat16() for t in draw(16, 1024, 2048, 128, 64,
                                                                       128, 512, 3))
    one = torch.cat([q_nope, q_pe], -1).transpose(0, 1).contiguous().transpose(0, 1)
    kw = dict(v_head_dim=128, scale=192 ** -0.5, block=512)
    with pin_mla_launch(MLALaunch(backend, 512)):
        two = mla_chunk_attention(q_nope, q_pe, c, k_pe, wkvb, **kw).float()
        views = mla_chunk_attention(one[..., :128], one[..., 128:], c, k_pe, wkvb, **kw).float()
    if backend == "cudnn":
        assert float((views - two).abs().max()) <= 2 ** -7 * float(two.abs().max())
    else:
        assert torch.equal(views, two)


def test_the_kv_the_plan_counts_is_latent_plus_rope_key():
    s = get_preset("deepseek-v3")
    assert mla_token_bytes(s) == (512 + 64) * 2 == 1152
    assert s.kv_bytes(32768) == 32768 * 1152


@pytest.mark.gpu
def test_expanded_on_the_gpu_at_deepseek_widths():
    """CUDA, bf16 in, DeepSeek-V3's head widths (H 16 of its 128, N 128, R 64, Hv 128, Lkv 512),
    a later chunk: the fused expanded path against the fp64 absorbed form. Bound 2e-2: bf16 q, K
    and V (u = 2^-9 each) through a softmax over 1536 keys."""
    q_nope, q_pe, c, k_pe, wkvb = (t.cuda().bfloat16() for t in draw(16, 512, 1024, 128, 64,
                                                                       128, 512, 11))
    kw = dict(v_head_dim=128, scale=192 ** -0.5)
    got = mla_chunk_attention(q_nope, q_pe, c, k_pe, wkvb, **kw).float()
    want = mla_chunk_attention_absorbed(q_nope, q_pe, c, k_pe, wkvb, **kw).float()
    assert float((got - want).abs().max() / want.abs().max()) < 2e-2
