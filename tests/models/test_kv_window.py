"""Sliding-window layers keep only their window's KV (strata.models.kv): the count, the plan
against what PromptKV and KVCache allocate, the ring's contents, and one layer's attention over
the ring against the old read that kept every token and only masked.

- The count: a query at position p sees keys p-W+1..p, so a chunk starting at P needs the
  prefix tokens P-W+1..P-1, at most W - 1 whatever the chunk's length; a sliding layer keeps
  min(n, W - 1), all in VRAM, and a full layer splits at the resident window.
- Plan == allocation (property): for mixes of sliding and full layers, bf16 and int8, any
  resident window and prompt length, the Sizes strata.planning hands memory say per layer
  exactly the bytes PromptKV allocates in VRAM and in host memory (and KVCache in bf16), the
  rig's budgets charge their sum, and the layout's kv_stage holds a full layer's host part.
- Attention (property): per chunk, the windowed read against the old full-KV masked read of the
  same keys. The reference (chunk_attention_torch) and the kernel sum the same visible terms,
  the old read with exact zeros (exp(-inf)) for the keys outside the window, in another
  grouping (fewer keys in the row; the kernel's tiles start at other keys): fp32 reduction
  noise, measured <= 4e-7 of max|o|, bounded here by FP32_NOISE. The bf16 outputs are those
  fp32 values rounded once, so they differ by at most that noise plus one bf16 step. While the
  ring has not wrapped (P <= W - 1) it holds the old read's prefix itself: the reference, which
  concatenates its segments, gives the same bits.
"""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from hypothesis import example, given, settings, strategies as st

import strata.kernels.attention as attention
from strata.kernels.attention import (KVSegment, chunk_attention, chunk_attention_torch,
                                      dequantize_kv, kv_token_bytes, quantize_kv)
from strata.memory.rig import budgets
from strata.kernels.attention.kv_int8 import KV_DTYPES
from strata.kernels.attention.kv_int8 import cache_dtype
from strata.models.kv import KVCache, PromptKV, kv_windows, layer_kv_tokens
from strata.models.moe import ffn_named
from strata.planning import KVPolicy, layout_spec, model_sizes, prompt_layout
from strata.shapes import GptOssOptions, ModelShape, Window

FP32_NOISE = 1e-6     # fp32 reduction noise of one attention output, relative to max|o|
H, HKV, HD = 4, 2, 16


def shape_of(n_layer: int, window: int, pattern: int) -> ModelShape:
    return ModelShape("gpt-oss", n_layer=n_layer, d_model=64, n_expert=4, top_k=2, d_expert=32,
                      n_head=H, n_kv_head=HKV, head_dim=HD, vocab=64, opts=GptOssOptions(),
                      window=Window(window, pattern) if window else None)


def nbytes(parts) -> int:
    return sum(t.numel() * t.element_size() for t in parts)


def test_layer_kv_tokens():
    assert layer_kv_tokens(1000, 128) == (127, 0)            # the window's last W - 1
    assert layer_kv_tokens(1000, 128, resident=16) == (127, 0)   # resident: full layers only
    assert layer_kv_tokens(50, 128, resident=16) == (50, 0)  # a prompt shorter than the window
    assert layer_kv_tokens(1000, 1) == (0, 0)                # W = 1: a query sees only itself
    assert layer_kv_tokens(1000, 0, resident=16) == (16, 984)
    assert layer_kv_tokens(1000) == (1000, 0)
    assert kv_windows(shape_of(4, 128, 2)) == (128, 0, 128, 0)
    assert kv_windows(shape_of(3, 0, 2)) == (0, 0, 0)


@given(L=st.integers(1, 5), window=st.integers(0, 40), pattern=st.integers(1, 3),
       kv=st.sampled_from(KV_DTYPES),
       resident=st.one_of(st.none(), st.integers(1, 300)), n=st.integers(1, 300))
@example(L=4, window=128, pattern=2, kv="bf16", resident=16, n=300)   # GPT-OSS's pattern
@example(L=2, window=5, pattern=3, kv="int8", resident=2, n=50)   # every layer slides: no stage
@example(L=3, window=1, pattern=2, kv="bf16", resident=None, n=9)  # W = 1 keeps nothing
@example(L=2, window=40, pattern=2, kv="int8", resident=3, n=20)  # the window past the prompt
def test_plan_equals_allocation(L, window, pattern, kv, resident, n):
    s = shape_of(L, window, pattern)
    pol = KVPolicy(kv, resident, n)
    sizes = model_sizes(s, kv=pol)
    layout = prompt_layout(s, 1 << 16, spec=layout_spec(ffn_named("kernel"), pol), sizes=sizes)
    stage = {p.name: p.nbytes for p in layout.placements(1, 0)}.get("kv_stage", 0)
    buf = torch.empty(stage, dtype=torch.uint8)
    got = PromptKV(L, HKV, HD, n, kv=kv, resident=resident, devices=["cpu"] * L,
                   stages={l: buf for l in range(L)}, windows=kv_windows(s))
    tok = kv_token_bytes(kv, HKV, HD)
    res = n if resident is None else min(n, resident)
    for l, w in enumerate(kv_windows(s)):
        want_vram, want_host = (min(n, w - 1), 0) if w else (res, n - res)
        assert sizes.kv_bytes(n, l) == nbytes(got.resident[l]) == want_vram * tok
        assert sizes.kv_host(n, l) == nbytes(got.hosted[l]) == want_host * tok
    assert sizes.kv_vram(n) == got.vram_bytes and sizes.kv_host_all(n) == got.host_bytes
    assert sum(b.kv for b in budgets(sizes, [1 << 40], kv_tokens=n)) == got.vram_bytes
    # the stage holds one full layer's host part; none when no layer holds host KV
    assert stage == max([nbytes(h) for h in got.hosted], default=0)
    if kv != "int8" and resident is None:    # the model's own cache, in the same KV dtype
        cache = KVCache(L, HKV, HD, capacity=n, dtype=cache_dtype(kv, torch.float32),
                        windows=kv_windows(s))
        assert sum(nbytes([k, v]) for k, v in zip(cache.k, cache.v)) == sizes.kv_vram(n)


# -- one layer's attention over the ring ------------------------------------------------------

schedules = st.lists(st.integers(1, 24), min_size=1, max_size=6)


@dataclass
class Chunk:
    P: int              # the chunk's first position
    new: torch.Tensor   # the windowed read's output [T, H, hd]
    old: torch.Tensor   # the old read's (every token kept, the window only masks)
    ring: list          # the ring's key segments after the chunk (copies)
    keys: torch.Tensor  # every key appended so far [P + T, Hkv, hd]
    args: tuple         # (q, k, v, the whole prefix as one KVSegment, extra) for a reference


def reads(W, chunks, kv, resident, fp32, seed, device="cpu"):
    """One sliding layer read chunk by chunk by a windowed PromptKV and by the old one."""
    n = sum(chunks)
    stage = torch.empty(n * kv_token_bytes(kv, HKV, HD), dtype=torch.uint8, device=device)
    new = PromptKV(1, HKV, HD, n, kv=kv, resident=resident, devices=[device], windows=[W])
    old = PromptKV(1, HKV, HD, n, kv=kv, resident=resident, devices=[device],
                   stages={0: stage})
    g = torch.Generator().manual_seed(seed)
    extra = dict(window=W, sinks=torch.randn(H, generator=g).to(device))
    P, out, keys, vals = 0, [], [], []
    for T in chunks:
        q, k, v = (torch.randn(T, h, HD, generator=g).to(torch.bfloat16).to(device)
                   for h in (H, HKV, HKV))
        pre = whole_prefix(keys, vals, kv)
        o = [kvx.attend(0, q, k, v, **extra,
                        **(dict(out=torch.empty(T, H, HD, device=device)) if fp32 else {}))
             for kvx in (new, old)]
        new.commit(T)
        old.commit(T)
        keys.append(k)
        vals.append(v)
        ring = [x.k.clone() for x in new._ring(0, P + T)]    # views: the next chunk writes
        out.append(Chunk(P, o[0], o[1], ring, torch.cat(keys),
                         (q, *as_kept(k, v, kv), pre, extra)))
        P += T
    assert new.streamed == 0 and new.host_bytes == 0      # never in host memory, never staged
    return out


def as_kept(k, v, kv):
    """The chunk's own k, v as its attention sees them: as the cache keeps them (int8: the
    values of their codes, in k's dtype)."""
    if kv != "int8":
        return k, v
    return tuple(dequantize_kv(*quantize_kv(x)).to(x.dtype) for x in (k, v))


def whole_prefix(keys, vals, kv) -> list[KVSegment]:
    """Every earlier token as one segment, as the cache holds it (int8: its codes and scales)."""
    if not keys:
        return []
    k, v = torch.cat(keys), torch.cat(vals)
    if kv == "int8":
        (kq, ks), (vq, vs) = quantize_kv(k), quantize_kv(v)
        return [KVSegment(kq, vq, ks, vs)]
    return [KVSegment(k, v)]


def check_ring(W, kv, c: Chunk):
    """The ring's keys, read in order, are the last min(P, W - 1) keys (their int8 codes)."""
    P = c.P + c.new.shape[0]
    m = min(P, W - 1)
    assert sum(x.shape[0] for x in c.ring) == m and len(c.ring) <= 2
    if not m:
        return
    want = c.keys[P - m:P]
    assert torch.equal(torch.cat(c.ring), quantize_kv(want)[0] if kv == "int8" else want)


def bf16_step(x: torch.Tensor) -> torch.Tensor:
    """One bf16 rounding step at |x| (the spacing of bf16 values there)."""
    e = torch.frexp(x.float().abs().clamp_min(2.0 ** -126))[1]
    return torch.ldexp(torch.ones_like(x, dtype=torch.float32), e - 8)


@settings(max_examples=25)     # each example reads up to 6 chunks twice: keep CI's share small
@given(W=st.integers(1, 20), chunks=schedules, kv=st.sampled_from(["bf16", "int8"]),
       resident=st.one_of(st.none(), st.integers(1, 30)), fp32=st.booleans())
@example(W=5, chunks=[3, 3, 3, 3], kv="bf16", resident=None, fp32=True)   # chunks < window
@example(W=5, chunks=[5, 5, 5], kv="int8", resident=2, fp32=False)       # chunks = window
@example(W=5, chunks=[9, 1, 12, 2], kv="bf16", resident=4, fp32=True)   # larger, uneven
@example(W=8, chunks=[7, 7, 1], kv="int8", resident=None, fp32=True)    # ring wraps at slot 0
def test_ring_attention_equals_masked_full_kv(W, chunks, kv, resident, fp32):
    """The reference (chunk_attention_torch, what PromptKV runs on the CPU): within fp32
    noise, and after the bf16 rounding within that noise plus one bf16 step (module doc)."""
    for c in reads(W, chunks, kv, resident, fp32, seed=sum(chunks) + W):
        check_ring(W, kv, c)
        a, b = c.new, c.old
        assert torch.isfinite(a).all()
        noise = FP32_NOISE * float(b.abs().max())
        lim = noise if fp32 else noise + bf16_step(torch.maximum(a.abs(), b.abs()))
        assert ((a.float() - b.float()).abs() <= lim).all()
        if c.P <= W - 1:       # the ring is the old read's prefix: the reference's same bits
            assert torch.equal(a, b)


@pytest.fixture
def kernel_on_cpu():
    """PromptKV picks the torch reference on the CPU; pin it to the kernel (interpreter)."""
    with attention.pin_attention("triton"):
        yield


def kernel_bound(q, k, v, pre, ref, extra):
    """test_chunk_attention_window's bound (bf16 probabilities and output, fp32 score noise),
    plus, for an int8 prefix on the "dequant" path, test_chunk_attention's term for the one
    bf16 rounding of each dequantized K and V element."""
    from tests.kernels.test_chunk_attention import U
    from tests.kernels.test_chunk_attention_window import _bound
    from strata.kernels.attention import AttnProblem, resolve_attn_tile
    bound = _bound(q, k, v, pre, ref, **extra)
    T, _, hd = q.shape
    if pre and pre[0].int8 and resolve_attn_tile(AttnProblem(T * H // HKV, hd)).int8 == "dequant":
        kmax = max(x.norm(dim=-1).max().item() for x in (pre[0].dequantized()[0], k.float()))
        rounding = U + 4 * U * hd ** -0.5 * q.float().norm(dim=-1).max().item() * kmax
        absv = [KVSegment(x.k, x.v.abs(), x.k_scale, x.v_scale) for x in pre]
        bound = bound + rounding * chunk_attention_torch(
            q, k, v.abs(), absv, out=torch.zeros(q.shape, device=q.device), **extra)
    return bound


def check_kernel(W, kv, chunks_out):
    """The kernel rounds its probabilities to bf16 against the running max of the tiles it has
    visited, and the ring's tiles start at other keys than the old read's: the two kernel reads
    differ at bf16 level, so each is held to the kernel's own bound against the reference over
    every earlier token, window-masked."""
    for c in chunks_out:
        check_ring(W, kv, c)
        q, k, v, pre, extra = c.args
        ref = chunk_attention_torch(q, k, v, pre, out=torch.zeros(q.shape, device=q.device),
                                    **extra)
        bound = kernel_bound(q, k, v, pre, ref, extra)
        for got in (c.new, c.old):
            assert torch.isfinite(got).all()
            worst = ((got.float() - ref).abs() / bound).max().item()
            assert worst <= 1.0, f"P={c.P}: {worst:.2f}x the bound"


@pytest.mark.parametrize("W,chunks,kv,resident", [
    (5, [3, 3, 2], "bf16", None),          # chunks smaller than the window, ring wraps mid-way
    (5, [5, 5, 6], "int8", 3),             # chunk = window, then larger; the old read staged
    (6, [13, 2, 4], "int8", None),         # a chunk larger than the window first
])
def test_ring_attention_kernel(kernel_on_cpu, W, chunks, kv, resident):
    """Through the Triton kernel (interpreter), whose window mask goes by positions counted
    from the first segment's first key: the ring's two segments read in order."""
    for fp32 in (True, False):
        check_kernel(W, kv, reads(W, chunks, kv, resident, fp32, seed=W))


@pytest.mark.gpu
@pytest.mark.parametrize("kv", ["bf16", "int8"])
def test_ring_attention_gpu(kv):
    """On CUDA, where PromptKV calls chunk_attention itself (window 128, GPT-OSS's), with the
    engine's bf16 dense math (the fp32 reads run on the CPU)."""
    check_kernel(128, kv, reads(128, [100, 64, 1, 200, 37], kv, 60, False, seed=2,
                                device=torch.device("cuda")))


def test_sliding_layer_must_mask_with_its_window():
    from strata.errors import StrataError
    kv = PromptKV(1, HKV, HD, 10, devices=["cpu"], windows=[4])
    q, k, v = (torch.zeros(2, h, HD, dtype=torch.bfloat16) for h in (H, HKV, HKV))
    with pytest.raises(StrataError, match="window=4"):
        kv.attend(0, q, k, v)


@given(W=st.integers(1, 12), chunks=schedules, grow=st.booleans())
@example(W=5, chunks=[2, 9, 1, 5], grow=False)
def test_kvcache_window_keeps_the_tail(W, chunks, grow):
    """The model's KVCache: a sliding layer returns [its last min(P, W - 1) keys, the chunk's]
    in order and keeps no more (preallocated or growing)."""
    n = sum(chunks)
    cache = KVCache(1, HKV, HD, capacity=None if grow else n, windows=[W])
    g = torch.Generator().manual_seed(n)
    keys, P = [], 0
    for T in chunks:
        k = torch.randn(HKV, T, HD, generator=g)
        keys.append(k)
        k_all, v_all = cache.extend(0, k, -k)
        m = min(P, W - 1)
        assert torch.equal(k_all, torch.cat(keys, 1)[:, P - m:]) and torch.equal(v_all, -k_all)
        cache.commit(T)
        P += T
    assert cache.k[0].shape[1] == (min(n, W - 1))
