"""MLA's blocked attention in its planned scratch (strata.models.mla, strata.models.mla_scratch).

- The blocked path (query blocks, key blocks decompressed into the scratch, merged by their
  log-sum-exp) equals the fp64 absorbed form and the fp32 expanded reference of the same
  signature, in a scratch of exactly mla_scratch_rows(T, S) poisoned with NaN, into a
  NaN-poisoned output: odd lengths, T = 1, prefix 0, blocks of one key.
- key_blocks tiles a query block's keys exactly once, the last block masked bottom-right.
- The plan's mla_k / mla_v / mla_state bytes equal the most the launcher takes from the scratch
  over a whole prompt read in chunks, for any (T, S, dims), under each backend of the launch
  (strata.models.mla_launch: flash's values padded to the q/k width).
- The engine hands each layer's attention views of its carve (inside the loan, of the
  planned sizes), under each backend.
- On CUDA (gpu mark): attend_block (torch's memory-efficient kernel with its log-sum-exp)
  against attend_block_ref, the whole path at DeepSeek-V3's head widths against the absorbed
  form, and under every launch (backend and merge) its transient memory beyond the scratch
  bounded by one block's launch (transient_bound, each backend's from what its kernels allocate).

CPU bound REL = 1e-5 relative to max |v| over the keys (fp32 against fp64): o is a softmax average
of the values and fp32 rounds relative to them, so an o that cancels to far below them (one head,
one value column: 0.0034 from values near 1) holds its error to |v|, not to |o|.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
import torch
from hypothesis import example, given, settings, strategies as st

from strata.errors import StrataError
from strata.kernels.attention.kv_int8 import quantize_kv
from strata.memory.layout import PromptLayout
from strata.models.mla import (attend_block, attend_block_cudnn, attend_block_ref, key_blocks,
                               merge_block,
                               mla_chunk_attention, mla_chunk_attention_absorbed)
from strata.models.mla_launch import (BACKENDS, DEFAULT, MERGES, MLALaunch,
                                      pin_mla_launch)
from strata.models.mla_scratch import MLA_BLOCK, MLAScratch, mla_scratch_rows, mla_state_floats
from strata.models.moe import ffn_named
from strata.planning import KVPolicy, layout_spec, model_sizes
from strata.shapes import DenseFfn, Mla, ModelShape

REL = 1e-5


def draw(H, T, P, N, R, Hv, L, seed, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    S = P + T
    ts = (torch.randn(H, T, N, generator=g), torch.randn(H, T, R, generator=g),
          torch.randn(S, L, generator=g), torch.randn(S, R, generator=g),
          torch.randn(H * (N + Hv), L, generator=g) / L ** 0.5)
    return tuple(t.to(device, dtype) for t in ts)


def value_scale(c, wkvb, H, N, Hv) -> float:
    """max |v| over every key and head: v = c Wuv^T, Wuv the last Hv rows of each head's N + Hv."""
    wuv = wkvb.double().view(H, N + Hv, -1)[:, N:]
    return float((c.double() @ wuv.reshape(H * Hv, -1).T).abs().max())


def transient_beyond(ins, kw) -> int:
    """CUDA bytes a second mla_chunk_attention(*ins, **kw) allocates beyond what is live before
    it (the first call warms the compiles, cuBLAS's workspaces and the kernel selection)."""
    mla_chunk_attention(*ins, **kw)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    mla_chunk_attention(*ins, **kw)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def flash_splits(H: int, n: int, m: int, hd: int, sms: int) -> int:
    """The key splits torch's flash forward takes for one launch of H heads, n queries, m keys at
    q/k/v width hd on a GPU of `sms` SMs: FlashAttention-2's mha_fwd (vendored in torch's
    aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp) calls set_params_splitkv with
    num_splits 0, so num_splits_heuristic picks; above 1 the launch allocates fp32 out_accum
    [splits, 1, H, n, hd rounded] and softmax_lse_accum [splits, 1, H, n]. The heuristic, as
    written there (in doubles where it has floats): one split once the programs
    H·ceil(n / 64) reach 0.8 of twice the SMs; else the fewest eligible splits (up to min(128,
    2·sms, ceil(m / block_n))) whose wave efficiency is within 0.85 of the best."""
    block_n = 256 if hd <= 64 else 128 if hd <= 128 else 64   # the split kernel's key tile
    n_blocks, work, slots = -(-m // block_n), H * -(-n // 64), 2 * sms
    if work >= 0.8 * slots:
        return 1

    def eligible(s):   # a count giving each split as many key tiles as one fewer does is skipped
        return s == 1 or -(-n_blocks // s) != -(-n_blocks // (s - 1))

    def efficiency(s):
        waves = work * s / slots
        return waves / math.ceil(waves)
    eff = {s: efficiency(s) for s in range(1, min(128, slots, n_blocks) + 1) if eligible(s)}
    return next(s for s, e in eff.items() if e >= 0.85 * max(eff.values()))


# the allocator's rounding (512 B a block) and the kernels' small tensors (flash's rng state and
# its unused scalar, the efficient kernel's seed and offset)
SLACK = 1 << 20


def transient_bound(backend: str, merge: str, H: int, T: int, n: int, m: int, hd: int, Hv: int,
                    sms: int) -> int:
    """CUDA bytes the blocked path allocates at most beyond its scratch and output
    (transient_beyond) for a chunk of T queries in query blocks of at most n over key blocks of
    at most m, under the launch (backend, merge), counted from what each allocates; one key
    block's temporaries live at a time (a kernel's output lives only through its merge):
      every launch  q = cat(q_nope, q_pe) [H, T, hd] bf16, the whole call
      efficient     torch.ops.aten._efficient_attention_forward: o [1, n, H, Hv] bf16, its fp32
                    accumulator of that shape (kNeedsOutputAccumulatorBuffer: heads over 128
                    take the kernel of kMaxK 65536, which goes over the value columns in pieces,
                    its output not its fp32 accumulator's type), lse fp32 [1, H, n] rounded up
                    to 32 queries (kAlignLSE)
      flash         mha_fwd: o [1, n, H, hd] bf16 (the values padded to hd), lse fp32 [1, H, n],
                    and with s = flash_splits(...) > 1 the split accumulators fp32
                    [s, 1, H, n, hd_r] and [s, 1, H, n], hd_r = hd rounded up to 32 (64 above 128)
      triton        nothing: the launches fold each block into the scratch's state and the last
                    writes the output
      cudnn         torch.ops.aten._scaled_dot_product_cudnn_attention: o [1, H, n, Hv] bf16 and
                    lse fp32 [1, H, n, 1] (no dropout: no rng state; the blocks here are square,
                    so none goes to the efficient kernel)
      merge         "torch" (a backend's that merges): logaddexp's new, lse - new and lse_b - new,
                    three fp32 [H, n]; "fused": one Triton launch, nothing
    plus SLACK."""
    q = H * T * hd * 2
    merged = 3 * H * n * 4 if merge == "torch" else 0
    if backend == "triton":
        return q + SLACK
    if backend == "efficient":
        return q + n * H * Hv * (2 + 4) + H * -(-n // 32) * 32 * 4 + merged + SLACK
    if backend == "cudnn":
        return q + n * H * Hv * 2 + H * n * 4 + merged + SLACK
    if backend == "flash":
        s = flash_splits(H, n, m, hd, sms)
        hd_r = -(-hd // 32) * 32 if hd <= 128 else -(-hd // 64) * 64
        split = s * H * n * (hd_r + 1) * 4 if s > 1 else 0
        return q + n * H * hd * 2 + H * n * 4 + split + merged + SLACK
    raise AssertionError(f"no transient bound derived for the {backend!r} backend")


def poisoned(H, hd, Hv, T, S, block, dtype=torch.float32, device="cpu") -> MLAScratch:
    s = MLAScratch.of(H, hd, Hv, T, S, device, dtype=dtype, block=block)
    for t in (s.k, s.v, s.state):
        t.fill_(float("nan"))
    return s


# 20 drawn cases beside the named edges: each runs three backends through interpreted kernels
@settings(max_examples=20, deadline=None)
@given(H=st.integers(1, 3), T=st.integers(1, 11), P=st.integers(0, 30), N=st.integers(1, 6),
       R=st.sampled_from([2, 4]), Hv=st.integers(1, 6), L=st.integers(1, 9),
       block=st.integers(1, 40), seed=st.integers(0, 999))
@example(H=2, T=1, P=0, N=3, R=2, Hv=3, L=4, block=4, seed=0).via("one token, nothing cached")
@example(H=2, T=7, P=0, N=3, R=2, Hv=5, L=4, block=1, seed=1).via("blocks of one key and query")
@example(H=1, T=5, P=13, N=5, R=4, Hv=2, L=7, block=3, seed=2).via(
    "odd lengths: query blocks and key blocks ending off the block grid")
@example(H=2, T=1, P=29, N=2, R=2, Hv=2, L=3, block=8, seed=3).via(
    "one query after many key blocks: the last block starts inside the prefix")
@example(H=2, T=11, P=2, N=4, R=2, Hv=4, L=5, block=40, seed=4).via(
    "one block holds every key: a single masked launch")
def test_blocked_equals_the_references(H, T, P, N, R, Hv, L, block, seed):
    q_nope, q_pe, c, k_pe, wkvb = draw(H, T, P, N, R, Hv, L, seed)
    S = P + T
    kw = dict(v_head_dim=Hv, scale=(N + R) ** -0.5, block=block)
    absorbed = mla_chunk_attention_absorbed(q_nope, q_pe, c, k_pe, wkvb, **kw)
    expanded = mla_chunk_attention(q_nope, q_pe, c, k_pe, wkvb, sdpa=False, **kw)
    vmax = value_scale(c, wkvb, H, N, Hv)
    # every backend, and cudnn with its keys before the masked block in launches of 2 blocks
    launches = [MLALaunch(b, 1) for b in BACKENDS] + [MLALaunch("cudnn", 1, key_block=2 * block)]
    for launch in launches:
        with pin_mla_launch(launch):
            out = torch.full((T, H, Hv), float("nan"))
            got = mla_chunk_attention(q_nope, q_pe, c, k_pe, wkvb, sdpa=True, out=out,
                                      scratch=poisoned(H, N + R, Hv, T, S, block), **kw)
        assert got.data_ptr() == out.data_ptr() and torch.isfinite(got).all()
        for want in (absorbed, expanded):
            assert float((got - want).abs().max()) / vmax < REL, launch


@settings(max_examples=60, deadline=None)
@given(end=st.integers(1, 200), n=st.integers(1, 64), block=st.integers(1, 64))
@example(end=64, n=64, block=64).via("a query block that is its own key block")
@example(end=65, n=1, block=64).via("one key before the last block")
@example(end=5000, n=904, block=4096).via("a chunk's short last query block")
def test_key_blocks_tile_the_keys_once(end, n, block):
    """Both tilings cover keys 0..end-1 once, in order, in blocks of at most `block`, masked
    last; the plain one's masked block is min(block, end) keys, the square one's (cuDNN's) the
    query block's own n, with at most one block more."""
    n = min(n, block, end)
    plain, square = key_blocks(end, n, block), key_blocks(end, n, block, square=True)
    for bs in (plain, square):
        assert [a for a, _, _ in bs] == [0] + [b for _, b, _ in bs[:-1]]    # contiguous, in order
        assert bs[-1][1] == end and bs[-1][2] and not any(m for _, _, m in bs[:-1])
        assert all(0 < b - a <= block for a, b, _ in bs)
    assert plain[-1][1] - plain[-1][0] == min(block, end) >= n
    assert square[-1][1] - square[-1][0] == n
    assert len(plain) <= len(square) <= len(plain) + 1


def test_bottom_right_mask_and_merge():
    """attend_block_ref's mask is bottom-right (query i sees keys 0..i + m - n); two halves
    merged equal one launch over all keys."""
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, 3, 4, generator=g),
               torch.randn(2, 8, 4, generator=g),
               torch.randn(2, 8, 5, generator=g))
    o, lse = attend_block_ref(q, k, v, True, 0.5)
    s = (q @ k.transpose(1, 2)) * 0.5
    for i in range(3):
        p = torch.softmax(s[:, i, :i + 6], -1)
        assert torch.allclose(o[:, i], torch.einsum("hk,hkv->hv", p, v[:, :i + 6]), atol=1e-6)
        assert torch.allclose(lse[:, i], torch.logsumexp(s[:, i, :i + 6], -1))
    acc, l = torch.empty(2, 3, 5), torch.empty(2, 3)
    merge_block(acc, l, *attend_block_ref(q, k[:, :4], v[:, :4], False, 0.5), True)
    merge_block(acc, l, *attend_block_ref(q, k[:, 4:], v[:, 4:], True, 0.5), False)
    assert torch.allclose(acc, o, atol=1e-6) and torch.allclose(l, lse, atol=1e-6)


def test_a_short_scratch_is_refused():
    q_nope, q_pe, c, k_pe, wkvb = draw(2, 4, 6, 3, 2, 3, 4, 0)
    short = MLAScratch.of(2, 5, 3, 4, 9, "cpu", dtype=torch.float32, block=16)   # S = 9 of 10
    with pytest.raises(StrataError, match="MLA scratch too small"):
        mla_chunk_attention(q_nope, q_pe, c, k_pe, wkvb, v_head_dim=3, scale=0.4, block=16,
                            sdpa=True, scratch=short)


@dataclass(frozen=True)
class Tracked(MLAScratch):
    """An MLAScratch that records the rows each view the launcher takes asks for."""
    seen: dict = field(default_factory=lambda: {"kv": 0, "state": 0, "latent": 0})

    def kv(self, m, H, hd, Hv, rows=None):
        self.seen["kv"] = max(self.seen["kv"], m)
        return super().kv(m, H, hd, Hv, rows)

    def latent(self, m, width):
        self.seen["latent"] = max(self.seen["latent"], m)
        return super().latent(m, width)

    def carried(self, n, H, Hv):
        self.seen["state"] = max(self.seen["state"], n)
        return super().carried(n, H, Hv)


def tiny_mla(H, N, R, Hv, L) -> ModelShape:
    return ModelShape("deepseek2", n_layer=2, d_model=16, n_expert=4, top_k=2, d_expert=8,
                      n_head=H, n_kv_head=H, head_dim=N + R, vocab=32, dense=DenseFfn(1, 16),
                      mla=Mla(0, L, R, Hv))


@settings(max_examples=12, deadline=None)
@given(C=st.integers(1, 2600), S=st.integers(1, 4400), H=st.integers(1, 2),
       N=st.integers(1, 3), R=st.sampled_from([2]), Hv=st.integers(1, 6), L=st.integers(1, 3),
       kvd=st.sampled_from(["bf16", "int8"]), backend=st.sampled_from(BACKENDS))
@example(C=2048, S=4097, H=1, N=1, R=2, Hv=1, L=1, kvd="bf16", backend="efficient").via(
    "a full block of queries, then a last chunk of one token over more than a block of keys")
@example(C=2048, S=4097, H=1, N=1, R=2, Hv=1, L=1, kvd="int8", backend="efficient").via(
    "the same, int8 KV")
@example(C=3, S=5, H=2, N=2, R=2, Hv=3, L=2, kvd="bf16", backend="efficient").via(
    "a prompt shorter than one block")
@example(C=2048, S=4097, H=2, N=1, R=2, Hv=2, L=1, kvd="bf16", backend="flash").via(
    "flash: values padded from 2 to the q/k width 3")
@example(C=5, S=9, H=2, N=1, R=2, Hv=5, L=2, kvd="int8", backend="flash").via(
    "flash with values wider than q/k: nothing padded")
@example(C=7, S=40, H=2, N=2, R=2, Hv=3, L=2, kvd="int8", backend="triton").via(
    "triton: values at their own width, the state carried by the launches")
@example(C=2048, S=4097, H=1, N=1, R=2, Hv=1, L=1, kvd="int8", backend="cudnn").via(
    "cudnn: the square tiling takes the plan's whole block past it")
@example(C=3, S=5, H=2, N=2, R=2, Hv=3, L=2, kvd="bf16", backend="cudnn").via(
    "cudnn under a block: fewer rows than the plan's")
def test_plan_equals_what_the_launcher_takes(C, S, H, N, R, Hv, L, kvd, backend):
    """strata plan's mla_* placements for (chunk C, prompt S, KV dtype) are the bytes the
    launcher takes at most while it reads a prompt of S tokens in chunks of C (the real block,
    MLA_BLOCK); int8 adds the dequantized latent block mla_c; the flash backend's mla_v holds
    max(hd, Hv) values a head; the cudnn backend's square tiling takes square_rows of them."""
    C = max(min(C, S), -(-S // 12))     # at most 12 chunks: the CPU reads every one
    with pin_mla_launch(backend=backend):
        plan_and_launch(C, S, H, N, R, Hv, L, kvd, max(N + R, Hv) if backend == "flash" else Hv,
                        square=backend == "cudnn")


def square_rows(C: int, S: int, block: int, keys: int | None = None) -> int:
    """The largest key block the square tiling (key_blocks(square=True), the cudnn backend's)
    takes reading S tokens in chunks of C: a query block of n starting at key s attends its own
    n keys masked and the s before it in blocks of at most `block`. The plan's min(block, S) (the
    plain tiling's) bounds it, equal from S > block; below, a read in several chunks takes fewer
    rows than planned (one fewer at most for a read resumed at any key). `keys`: the launch's
    key_block (the unmasked blocks' size; None: block)."""
    most, keys = 0, keys or block
    for a in range(0, S, C):
        T = min(C, S - a)
        for t0 in range(0, T, block):
            most = max(most, min(block, T - t0), min(keys, a + t0))
    return most


def plan_and_launch(C, S, H, N, R, Hv, L, kvd, vw, square=False, keys=None):
    shape = tiny_mla(H, N, R, Hv, L)
    kv = KVPolicy(kvd, max_prompt=S)
    lay = PromptLayout(model_sizes(shape, kv=kv), 64, layout_spec(ffn_named("kernel"), kv, shape))
    planned = {p.name: p.nbytes for p in lay.placements(C, 0) if p.name.startswith("mla_")}
    int8 = kvd == "int8"
    sc = Tracked(*vars(MLAScratch.of(H, N + R, Hv, C, S, "cpu",
                                     latent=(L + R) * int8)).values())
    assert sc.v.numel() == min(keys or MLA_BLOCK, S) * H * vw
    q_nope, q_pe, c, k_pe, wkvb = draw(H, S, 0, N, R, Hv, L, 5, dtype=torch.bfloat16)
    kw = {}
    if int8:
        (c, cs), (k_pe, ks) = (quantize_kv(x[:, None]) for x in (c, k_pe))
        c, k_pe, kw = c[:, 0], k_pe[:, 0], dict(c_scale=cs, k_pe_scale=ks)
    for a in range(0, S, C):
        b = min(S, a + C)
        o = mla_chunk_attention(q_nope[:, a:b], q_pe[:, a:b], c[:b], k_pe[:b], wkvb,
                                v_head_dim=Hv, scale=0.5, sdpa=True, scratch=sc,
                                **{k: v[:b] for k, v in kw.items()})
        assert torch.isfinite(o).all()
    rows, qrows = mla_scratch_rows(C, S)
    assert (rows, qrows) == (min(keys or MLA_BLOCK, S), min(MLA_BLOCK, C))
    assert sc.seen["state"] == qrows
    took = square_rows(C, S, MLA_BLOCK, keys) if square else rows
    assert sc.seen["kv"] == took <= rows and sc.seen["latent"] == took * int8
    want = {"mla_k": rows * H * (N + R) * 2, "mla_v": rows * H * vw * 2,
            "mla_state": qrows * mla_state_floats(H, Hv) * 4}
    assert planned == want | ({"mla_c": rows * (L + R) * 2} if int8 else {})
    assert not any(n.startswith("kv_expand") or n == "attn_state" for n in lay.spec.names())


@pytest.mark.parametrize("C,S", [(4096, 8193), (3, 5), (2048, 12289)])
def test_the_cudnn_key_block_is_planned_and_taken(C, S):
    """The cudnn backend's key_block (twice the block here): the plan's key rows are
    min(key_block, S), what its square tiling takes past one key block, fewer below it."""
    with pin_mla_launch(MLALaunch("cudnn", key_block=2 * MLA_BLOCK)):
        plan_and_launch(C, S, 1, 1, 2, 1, 1, "int8", 1, square=True, keys=2 * MLA_BLOCK)


def test_a_gqa_shape_plans_no_mla_scratch():
    shape = tiny_mla(2, 2, 2, 2, 2).with_(arch="qwen3moe", mla=None, dense=DenseFfn())
    spec = layout_spec(ffn_named("kernel"), KVPolicy(), shape)
    assert not any(n.startswith("mla_") for n in spec.names())


# -- CUDA ------------------------------------------------------------------------------------
BF16_REL = 2e-2   # bf16 q, K, V (u = 2^-9 each) and a bf16 output per block, through a softmax


@pytest.mark.gpu
@pytest.mark.parametrize("n,m,masked", [(64, 64, True), (37, 300, True), (50, 129, False),
                                        (1, 1, True)])
def test_attend_block_equals_its_reference_on_the_gpu(n, m, masked):
    """torch's memory-efficient kernel with its log-sum-exp against attend_block_ref at
    DeepSeek-V3's head widths (q/k 192, v 128), bf16 in. lse: 1e-3 absolute (fp32 sums of
    the same bf16 products in another order, exp2 in the kernel)."""
    g = torch.Generator().manual_seed(n + m)
    q, k, v = (torch.randn(4, r, d, generator=g).cuda().bfloat16()
               for r, d in ((n, 192), (m, 192), (m, 128)))
    o, lse = attend_block(q, k, v, masked, 192 ** -0.5)
    ro, rl = attend_block_ref(q, k, v, masked, 192 ** -0.5)
    assert o.shape == ro.shape and lse.shape == rl.shape == (4, n)
    assert float((o.float() - ro.float()).abs().max() / ro.float().abs().max()) < BF16_REL
    assert float((lse - rl).abs().max()) < 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("hd,Hv", [(192, 128), (24, 16)])
@pytest.mark.parametrize("n,m,masked", [(64, 64, True), (37, 300, True), (50, 129, False),
                                        (1, 1, True), (256, 256, True), (16, 16, True),
                                        (16, 32, False)])
def test_attend_block_cudnn_equals_its_reference_on_the_gpu(n, m, masked, hd, Hv):
    """cuDNN's attention with its log-sum-exp (a masked block that is not square through the
    efficient kernel) against attend_block_ref at DeepSeek-V3's head widths (q/k 192, v 128)
    and the tiny model's (tests/models/hf_family.DS_TINY: 24, 16; its engine read under cudnn
    sat at 2.14e-2 of the fp32 read at e2afbc1, the other backends at 0.95e-2), bf16 in, into
    the scratch's layout ([H, m, hd] views of a larger buffer) and q as the engine's whole_q
    lays it ([T, H, hd] transposed). Bounds as the efficient kernel's above."""
    g = torch.Generator().manual_seed(7 * n + m)
    q, k, v = (torch.randn(4, r, d, generator=g).cuda().bfloat16()
               for r, d in ((n, hd), (m, hd), (m, Hv)))
    q = torch.cat([q, torch.full_like(q, float("nan"))], dim=1)[:, :n]   # a strided view
    qt = q.transpose(0, 1).contiguous().transpose(0, 1)                  # whole_q's layout
    ro, rl = attend_block_ref(q, k, v, masked, hd ** -0.5)
    for qq in (q, qt):
        o, lse = attend_block_cudnn(qq, k, v, masked, hd ** -0.5)
        assert o.shape == ro.shape and lse.shape == rl.shape == (4, n)
        assert float((o.float() - ro.float()).abs().max() / ro.float().abs().max()) < BF16_REL
        assert float((lse - rl).abs().max()) < 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("T,P,block", [(600, 1500, 256), (1, 0, 256), (333, 0, 128),
                                       (5, 700, 2048)])
@pytest.mark.parametrize("backend", BACKENDS)
def test_blocked_on_the_gpu_at_deepseek_widths(T, P, block, backend):
    """CUDA, bf16, H 8 heads of 128 + 64 / 128, Lkv 512, under each backend: the blocked path in
    a NaN-poisoned scratch of exactly its size, into a NaN-poisoned output, against the fp64
    absorbed form (T 333 at blocks of 128 ends in a masked block that is not square)."""
    H, N, R, Hv, L = 8, 128, 64, 128, 512
    ins = draw(H, T, P, N, R, Hv, L, T + P, dtype=torch.bfloat16, device="cuda")
    kw = dict(v_head_dim=Hv, scale=(N + R) ** -0.5, block=block)
    out = torch.full((T, H, Hv), float("nan"), dtype=torch.bfloat16, device="cuda")
    with pin_mla_launch(backend=backend):
        got = mla_chunk_attention(*ins, out=out, scratch=poisoned(
            H, N + R, Hv, T, P + T, block, torch.bfloat16, "cuda"), **kw)
    want = mla_chunk_attention_absorbed(*ins, **kw)
    assert torch.isfinite(got).all()
    assert float((got.float() - want.float()).abs().max() / want.float().abs().max()) < BF16_REL


@pytest.mark.gpu
def test_the_cudnn_backend_reads_every_block_through_cudnn_on_the_gpu(monkeypatch):
    """Under the cudnn backend no block goes to the efficient kernel: a chunk whose last query
    block is short (333 tokens in blocks of 128 after 700 cached) is tiled so that its masked
    block is square (key_blocks(square=True)); the result as the absorbed form's."""
    import strata.models.mla_attend as ma

    def refused(*a, **k):
        raise AssertionError("a block went to the efficient kernel")
    monkeypatch.setattr(ma, "attend_block", refused)
    H, N, R, Hv, L, T, P, block = 8, 128, 64, 128, 512, 333, 700, 128
    ins = draw(H, T, P, N, R, Hv, L, T + P, dtype=torch.bfloat16, device="cuda")
    kw = dict(v_head_dim=Hv, scale=(N + R) ** -0.5, block=block)
    with pin_mla_launch(backend="cudnn"):
        got = mla_chunk_attention(*ins, scratch=poisoned(H, N + R, Hv, T, P + T, block,
                                                         torch.bfloat16, "cuda"), **kw)
    want = mla_chunk_attention_absorbed(*ins, **kw)
    assert float((got.float() - want.float()).abs().max() / want.float().abs().max()) < BF16_REL


# every backend, under each merge where it merges (triton's launches carry the state: the merge
# in force is not read)
LAUNCHES = [(b, m) for b in BACKENDS for m in (MERGES if b != "triton" else (DEFAULT.merge,))]


@pytest.mark.gpu
@pytest.mark.parametrize("backend,merge", LAUNCHES)
def test_blocked_transient_is_one_block_on_the_gpu(backend, merge):
    """Under each launch, beyond its scratch (of that launch's size) and its output the blocked
    path allocates the chunk's query and one key block's launch temporaries (transient_bound):
    the decompressed K/V of the S keys (168 MB here, what the all-at-once SDPA took) never
    appears. 16 heads: flash's 16·ceil(512 / 64) = 128 programs fill less than 0.8 of twice an
    H100's 132 SMs, so it splits the keys of each block (2 ways there, 3 on a 114-SM card) into
    fp32 accumulators that dwarf its output (12.6 MB against 3.1 MB); the tests at DeepSeek-V3's
    128 heads (tests/models/test_mla_flash.py, tests/kernels/test_mla_block.py) take the
    unsplit path."""
    # P 15872: the bound does not grow with the keys, the all-at-once transient does
    H, N, R, Hv, L, T, P, block = 16, 128, 64, 128, 512, 512, 15872, 512
    S = P + T
    ins = draw(H, T, P, N, R, Hv, L, 1, dtype=torch.bfloat16, device="cuda")
    out = torch.empty(T, H, Hv, dtype=torch.bfloat16, device="cuda")
    with pin_mla_launch(backend=backend, merge=merge):
        sc = MLAScratch.of(H, N + R, Hv, T, S, "cuda", block=block)
        kw = dict(v_head_dim=Hv, scale=(N + R) ** -0.5, block=block, scratch=sc, out=out)
        extra = transient_beyond(ins, kw)
    sms = torch.cuda.get_device_properties(out.device).multi_processor_count
    bound = transient_bound(backend, merge, H, T, min(block, T), min(block, S), N + R, Hv, sms)
    assert extra <= bound, f"{backend}/{merge}: {extra} B beyond the scratch, bound {bound} B"
    # the case separates the two under every launch: all at once 168 MB against at most 26.4 MB
    # (flash, 3 splits on 114 SMs; 20.1 MB with 2 on 132; efficient 10.6 MB, triton 4.2 MB)
    assert S * H * (N + R + Hv) * 2 > 6 * bound
