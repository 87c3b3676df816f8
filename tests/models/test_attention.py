"""The shared attention of a chunk against the KV cache, against explicit softmax attention.

The reference below spells the math out (K/V repeated per query head, a dense causal mask over
absolute positions, softmax in fp32), so the optional pieces of `AttentionWeights` are checked on
their own: with q/k norms (Qwen3) and without (the Mixtral wiring's case), in one chunk and cut
into chunks against the cache. ATTN_REL = 1e-5: fp32 on both sides, only the order of sums
differs (measured ~1e-7).
"""
import math

import pytest
import torch
from hypothesis import example, given, settings, strategies as st

from strata.models.attention import AttentionShape, AttentionWeights, attention
from strata.models.kv import KVCache
from strata.models.layers import apply_rope, rms_norm, rope_cos_sin

ATTN_REL = 1e-5
S = AttentionShape(n_head=4, n_kv_head=2, head_dim=16, norm_eps=1e-6)
D = 32


def weights(seed: int, norms: bool) -> AttentionWeights:
    g = torch.Generator().manual_seed(seed)
    r = lambda *shape, s=0.2: torch.randn(*shape, generator=g) * s  # noqa: E731
    H, Hkv, hd = S.n_head, S.n_kv_head, S.head_dim
    return AttentionWeights(r(H * hd, D), r(Hkv * hd, D), r(Hkv * hd, D), r(D, H * hd),
                            q_norm=1 + r(hd) if norms else None,
                            k_norm=1 + r(hd) if norms else None)


def explicit(x: torch.Tensor, w: AttentionWeights, theta: float = 10000.0) -> torch.Tensor:
    """x [T, D] from position 0 -> [T, D], every step written out."""
    T, H, Hkv, hd = x.shape[0], S.n_head, S.n_kv_head, S.head_dim
    q = (x @ w.wq.t()).view(T, H, hd)
    k = (x @ w.wk.t()).view(T, Hkv, hd)
    v = (x @ w.wv.t()).view(T, Hkv, hd)
    if w.q_norm is not None:
        q, k = rms_norm(q, w.q_norm, S.norm_eps), rms_norm(k, w.k_norm, S.norm_eps)
    cos, sin = rope_cos_sin(torch.arange(T), hd, theta)
    q, k = apply_rope(q.transpose(0, 1), cos, sin), apply_rope(k.transpose(0, 1), cos, sin)
    rep = H // Hkv
    k, v = k.repeat_interleave(rep, 0), v.transpose(0, 1).repeat_interleave(rep, 0)  # [H, T, hd]
    score = q @ k.transpose(1, 2) / math.sqrt(hd)                                     # [H, T, T]
    score = score.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    o = torch.softmax(score, -1) @ v                                                  # [H, T, hd]
    return o.transpose(0, 1).reshape(T, H * hd) @ w.wo.t()


def chunked(x: torch.Tensor, w: AttentionWeights, sizes, capacity) -> torch.Tensor:
    cache = KVCache(1, S.n_kv_head, S.head_dim, capacity=capacity)
    outs, start = [], 0
    for n in sizes:
        cos, sin = rope_cos_sin(torch.arange(start, start + n), S.head_dim, 10000.0)
        outs.append(attention(x[start:start + n], w, S, cos, sin, cache, 0))
        cache.commit(n)
        start += n
    return torch.cat(outs)


def rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


@settings(max_examples=20)
@given(sizes=st.lists(st.integers(1, 9), min_size=1, max_size=4), norms=st.booleans(),
       grow=st.booleans())
@example(sizes=[1], norms=False, grow=False).via("one token: attends only to itself")
@example(sizes=[5, 1, 1], norms=True, grow=True).via("single-token chunks after a prefix")
def test_attention_matches_explicit(sizes, norms, grow):
    x = torch.randn(sum(sizes), D, generator=torch.Generator().manual_seed(len(sizes)))
    w = weights(sum(sizes), norms)
    got = chunked(x, w, sizes, None if grow else sum(sizes))
    assert rel(got, explicit(x, w)) < ATTN_REL


def test_norms_are_applied_when_given():
    """With q/k norms the output differs from the same weights without them (the optional step is
    not silently skipped)."""
    x = torch.randn(6, D, generator=torch.Generator().manual_seed(0))
    w = weights(1, norms=True)
    bare = AttentionWeights(w.wq, w.wk, w.wv, w.wo)
    assert rel(chunked(x, w, [6], 6), chunked(x, bare, [6], 6)) > 1e-2


def test_map_keeps_absent_norms_absent():
    w = weights(0, norms=False).map(lambda t: t.double())
    assert w.q_norm is None and w.k_norm is None and w.wq.dtype == torch.float64


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the flash route runs on CUDA")
@pytest.mark.parametrize("T,P", [(1, 7), (64, 100), (257, 3000)])
def test_lower_right_causal_is_torchs_route_on_the_gpu(T, P):
    """The direct flash call gives what torch's causal_lower_right gives, bit for bit (the same
    kernel), GQA as Qwen3's 32 query heads on 4 KV heads, a later chunk's T queries against
    P + T keys; and the explicit masked softmax within bf16 attention noise."""
    from torch.nn.attention.bias import causal_lower_right

    from strata.models.attention import lower_right_causal
    g = torch.Generator(device="cuda").manual_seed(T + P)
    H, Hkv, hd = 32, 4, 128
    q = torch.randn(1, H, T, hd, device="cuda", generator=g, dtype=torch.bfloat16)
    k = torch.randn(1, Hkv, P + T, hd, device="cuda", generator=g, dtype=torch.bfloat16)
    v = torch.randn(1, Hkv, P + T, hd, device="cuda", generator=g, dtype=torch.bfloat16)
    got = lower_right_causal(q, k, v)
    want = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=causal_lower_right(T, P + T), enable_gqa=True)
    assert got.shape == want.shape == (1, H, T, hd)
    assert torch.equal(got, want)
    kk, vv = (t.float().repeat_interleave(H // Hkv, dim=1) for t in (k, v))
    s = (q.float() @ kk.transpose(-1, -2)) / math.sqrt(hd)
    keep = torch.arange(P + T, device="cuda")[None, :] <= P + torch.arange(T, device="cuda")[:, None]
    ref = torch.softmax(s.masked_fill(~keep, float("-inf")), -1) @ vv
    assert (got.float() - ref).abs().max().item() < 2e-2 * ref.abs().max().item()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the flash route runs on CUDA")
@pytest.mark.parametrize("kv", ["bf16", "int8"])
def test_the_first_chunk_takes_flash_and_later_chunks_the_kernel(kv):
    """PromptKV's first chunk (no keys before it) is torch's flash causal attention, bit for
    bit, on the keys and values as stored (bf16: the chunk's own; int8: their codes dequantized,
    as a later chunk reads them); the next chunk reads the stored prefix through
    chunk_attention, within the kernel's own bound of the explicit math."""
    from strata.kernels.attention import chunk_attention_torch
    from strata.kernels.attention.flash import first_chunk_attention
    from strata.models.kv import PromptKV
    g = torch.Generator(device="cuda").manual_seed(3)
    H, Hkv, hd, T1, T2 = 32, 4, 128, 96, 40
    r = lambda *s: torch.randn(*s, device="cuda", generator=g, dtype=torch.bfloat16)  # noqa: E731
    q1, k1, v1 = r(T1, H, hd), r(T1, Hkv, hd), r(T1, Hkv, hd)
    q2, k2, v2 = r(T2, H, hd), r(T2, Hkv, hd), r(T2, Hkv, hd)
    cache = PromptKV(1, Hkv, hd, T1 + T2, kv=kv, devices=["cuda"])
    o1 = cache.attend(0, q1, k1, v1)
    cache.commit(T1)
    if kv == "int8":
        k1, v1 = (x.to(torch.bfloat16) for x in
                  cache._segment(cache.resident[0], T1).dequantized())
    want1 = torch.nn.functional.scaled_dot_product_attention(
        q1.transpose(0, 1)[None], k1.transpose(0, 1)[None], v1.transpose(0, 1)[None],
        is_causal=True, enable_gqa=True)[0].transpose(0, 1)
    assert torch.equal(o1, want1) and torch.equal(first_chunk_attention(q1, k1, v1), want1)
    o2 = cache.attend(0, q2, k2, v2)
    ref2 = chunk_attention_torch(q2, k2, v2, [cache._segment(cache.resident[0], T1)])
    assert o2.shape == (T2, H, hd) and torch.isfinite(o2).all()
    assert (o2.float() - ref2.float()).abs().max().item() < 2e-2 * ref2.float().abs().max().item()
