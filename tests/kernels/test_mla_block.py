"""MLA's block-attention kernel (strata.kernels.attention.mla_block, the "triton" backend of
strata.models.mla_launch) and its plain-torch twin.

In Triton's interpreter at tiny shapes (fp32 and bf16 operands):
- kernel and twin against attend_block_ref (fp32 scores, the bottom-right mask): n < m and
  n == m, masked and not, ragged sizes off the tile grid, q/k widths split into a power of two
  and a rest (12 = 8 + 4, 6 = 4 + 2, 24 = 16 + 8, 16 = 16 + 0, 5 = 4 + 1, DeepSeek-V3's 192 =
  128 + 64) and values narrower or wider than q/k, into NaN-poisoned o and lse;
- a chain of launches over key blocks (the blocked attention's: the first fresh, the rest
  resumed from the carried fp32 state, acc and o the same tensor, the last into a separate
  output) against one launch over all keys;
- bf16 operands and output: within the roundings of p and o to bf16;
- the tile is pinnable (pin_mla_tile) and a pinned tile gives the same result; bad input is
  refused in one line.
The sm_90 compile (tests/kernels/compile_mla.py --quick: no spills, wgmma).
On CUDA (gpu mark): the kernel against the efficient and flash backends and the reference at
DeepSeek-V3's widths (H 128, q/k 192, v 128), n < m and n == m, masked and not, and a chain
against one launch.

Bounds: REL = 1e-5 relative to max |v| for o (tests/models/test_mla_blocks.py: o is a softmax
average of the values, fp32 rounds relative to them); lse within LSE_REL of 1 + max |score|
(the fp32 rounding of the largest score, scaled into the log2 domain and back, carries into the
log-sum-exp).
"""
from __future__ import annotations

import pytest
import torch

from strata.errors import StrataError
from strata.kernels.attention.mla_block import (attend_block_triton, mla_block_attention,
                                                mla_block_attention_torch, split_width)
from strata.kernels.attention.tiles import (AttnTile, choose_mla_tile, pin_mla_tile,
                                            resolve_mla_tile)
from strata.models.mla_attend import attend_block, attend_block_flash, attend_block_ref, key_blocks
from tests.kernels.compiled import compile_lines

REL = 1e-5
LSE_REL = 1e-6
BF16 = 2.0 ** -9      # bf16's unit roundoff: p before PV and o at the end round once each
SCALE = 0.35
IMPLS = [mla_block_attention, mla_block_attention_torch]


def operands(H, n, m, hd, Hv, seed, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(H, r, d, generator=g).to(device, dtype)
                 for r, d in ((n, hd), (m, hd), (m, Hv)))


def nan_like(H, n, Hv, dtype=torch.float32, device="cpu"):
    return (torch.full((H, n, Hv), float("nan"), dtype=dtype, device=device),
            torch.full((H, n), float("nan"), device=device))


def lse_bound(q, k) -> float:
    return LSE_REL * (1 + float((q.float() @ k.float().transpose(1, 2)).abs().max()) * SCALE)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("n,m,masked", [(5, 5, True), (5, 5, False), (3, 40, True),
                                        (3, 40, False), (1, 7, True), (17, 33, True),
                                        (1, 1, True), (33, 130, False), (20, 83, True)])
@pytest.mark.parametrize("hd,Hv", [(12, 8), (6, 3), (24, 16), (16, 16), (5, 20), (192, 128)])
def test_one_launch_equals_the_reference(impl, n, m, masked, hd, Hv):
    q, k, v = operands(2, n, m, hd, Hv, n * 1000 + m + hd)
    o, lse = nan_like(2, n, Hv)
    impl(q, k, v, masked, SCALE, o=o, lse=lse)
    ro, rl = attend_block_ref(q, k, v, masked, SCALE)
    assert torch.isfinite(o).all() and torch.isfinite(lse).all()
    assert float((o - ro).abs().max()) <= REL * float(v.abs().max())
    assert float((lse - rl).abs().max()) <= lse_bound(q, k)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("n,m,block", [(7, 50, 16), (4, 16, 4), (3, 70, 32), (9, 9, 9),
                                       (1, 21, 5)])
def test_a_chain_of_key_blocks_equals_one_launch(impl, n, m, block):
    """The blocked attention's launches (key_blocks: unmasked blocks, then the masked one that
    ends at the queries' own keys), the state carried in acc (also each resumed launch's o),
    the last into a separate NaN-poisoned output: one launch over all m keys."""
    H, hd, Hv = 2, 12, 8
    q, k, v = operands(H, n, m, hd, Hv, n + m + block)
    acc, lse = nan_like(H, n, Hv)
    out = torch.full((n, H, Hv), float("nan")).transpose(0, 1)     # o's strides in MLA's output
    blocks = key_blocks(m, n, block)
    for i, (a, b, masked) in enumerate(blocks):
        last = i == len(blocks) - 1
        impl(q, k[:, a:b], v[:, a:b], masked, SCALE, o=out if last else acc, lse=lse,
             acc=acc if i else None)
    ro, rl = attend_block_ref(q, k, v, True, SCALE)
    assert torch.isfinite(out).all()
    assert float((out - ro).abs().max()) <= REL * float(v.abs().max())
    assert float((lse - rl).abs().max()) <= lse_bound(q, k)


@pytest.mark.parametrize("masked", [True, False])
def test_bf16_within_its_roundings(masked):
    """bf16 q, k, v and o: against the fp32 reference on the same (bf16) operands within one
    rounding of p (each weight off by BF16 of itself: BF16·max|v| on o) and one of o."""
    q, k, v = operands(3, 19, 45, 24, 16, 11, torch.bfloat16)
    o, lse = nan_like(3, 19, 16, torch.bfloat16)
    mla_block_attention(q, k, v, masked, SCALE, o=o, lse=lse)
    ro, rl = attend_block_ref(q.float(), k.float(), v.float(), masked, SCALE)
    vmax = float(v.float().abs().max())
    assert float((o.float() - ro).abs().max()) <= (2 * BF16 + REL) * vmax
    assert float((lse - rl).abs().max()) <= lse_bound(q, k)
    o2, l2 = attend_block_triton(q, k, v, masked, SCALE)                  # the backend's form
    assert torch.equal(o2, o) and torch.equal(l2, lse)


def test_the_tile_is_pinnable():
    """DeepSeek-V3's chunk: 128 x 64, 8 warps, 3 stages; a short block's BM shrinks (and its BN
    below 64 queries); a pin (a whole tile or fields) wins inside its block and the result
    holds."""
    assert choose_mla_tile(4096, 192, 128) == AttnTile(128, 64, 8, 3)
    assert choose_mla_tile(40, 192, 128) == AttnTile(64, 64, 8, 3)
    assert choose_mla_tile(5, 192, 128) == AttnTile(16, 32, 4, 3)
    with pin_mla_tile(BLOCK_N=16):
        assert resolve_mla_tile(4096, 192, 128) == AttnTile(128, 16, 8, 3)
    assert resolve_mla_tile(4096, 192, 128, AttnTile(64, 32, 4, 2)) == AttnTile(64, 32, 4, 2)
    q, k, v = operands(2, 20, 70, 12, 8, 3)
    want = nan_like(2, 20, 8)
    mla_block_attention(q, k, v, True, SCALE, o=want[0], lse=want[1])
    for pin in (dict(BLOCK_N=16), dict(tile=AttnTile(32, 32, 4, 2))):
        got = nan_like(2, 20, 8)
        with pin_mla_tile(**pin):
            mla_block_attention(q, k, v, True, SCALE, o=got[0], lse=got[1])
        assert float((got[0] - want[0]).abs().max()) <= REL * float(v.abs().max())
    with pytest.raises(StrataError, match="takes an AttnTile"):
        with pin_mla_tile("128x64"):
            pass


def test_the_width_split():
    assert [split_width(d) for d in (192, 128, 5, 24, 1)] == [(128, 64), (128, 0), (4, 1),
                                                              (16, 8), (1, 0)]


@pytest.mark.parametrize("bad,match", [
    (dict(q=torch.zeros(4, 6)), "must be \\[H, n, hd\\]"),
    (dict(masked=True, q=torch.zeros(2, 9, 6)), "n <= m"),
    (dict(lse=torch.zeros(2, 3, dtype=torch.float64)), "lse fp32"),
    (dict(o=torch.zeros(2, 4, 3).transpose(1, 2)), "unit stride"),
    (dict(acc=torch.zeros(2, 3, 5)), "acc must be fp32"),
    (dict(v=torch.zeros(2, 8, 4, dtype=torch.float64)), "bf16, fp16 or fp32 alike")])
def test_bad_input_is_refused_in_one_line(bad, match):
    args = dict(q=torch.zeros(2, 3, 6), k=torch.zeros(2, 8, 6), v=torch.zeros(2, 8, 4),
                masked=False, o=torch.zeros(2, 3, 4), lse=torch.zeros(2, 3), acc=None)
    args.update(bad)
    for impl in IMPLS:
        with pytest.raises(StrataError, match=match) as e:
            impl(args["q"], args["k"], args["v"], args["masked"], SCALE, o=args["o"],
                 lse=args["lse"], acc=args["acc"])
        assert "\n" not in str(e.value)


def test_the_mla_kernel_compiles_for_h100():
    """sm_90 with triton's passes and ptxas (no GPU), DeepSeek-V3's widths at the heuristic's
    tiles: the four launches the blocked attention makes, no spills; a full block's tile
    (128 queries) and a 64-query one run their dots on wgmma."""
    lines, out = compile_lines("compile_mla.py", "--quick", timeout=600)
    assert len(lines) == 16, out
    for line in lines:
        assert "spill 0/0" in line, line
        assert "wgmma" in line or "tile=128x" not in line and "tile=64x" not in line, line


# -- CUDA ---------------------------------------------------------------------------------------
GPU_REL = 2e-2   # bf16 operands and outputs through a softmax (test_mla_blocks' BF16_REL)


@pytest.mark.gpu
@pytest.mark.parametrize("n,m,masked", [(64, 64, True), (64, 64, False), (37, 300, True),
                                        (50, 129, False), (1, 1, True), (1, 200, True),
                                        (256, 2048, True), (300, 300, True)])
def test_the_kernel_equals_the_backends_on_the_gpu(n, m, masked):
    """All 128 heads of DeepSeek-V3 at q/k 192, v 128, bf16: o within GPU_REL of the
    reference's max |o| and within twice that of the efficient and flash backends; lse within
    1e-3 absolute of each (fp32 sums of the same bf16 products in another order, exp2)."""
    q, k, v = operands(128, n, m, 192, 128, n + m, torch.bfloat16, "cuda")
    o, lse = nan_like(128, n, 128, torch.bfloat16, "cuda")
    mla_block_attention(q, k, v, masked, 192 ** -0.5, o=o, lse=lse)
    ro, rl = attend_block_ref(q, k, v, masked, 192 ** -0.5)
    eo, el = attend_block(q, k, v, masked, 192 ** -0.5)
    vp = torch.zeros(128, m, 192, dtype=torch.bfloat16, device="cuda")
    vp[..., :128] = v
    fo, fl = attend_block_flash(q, k, vp, masked, 192 ** -0.5, v_dim=128)
    top = float(ro.float().abs().max())
    assert float((o.float() - ro.float()).abs().max()) / top < GPU_REL
    for other, ol in ((eo, el), (fo, fl)):
        assert float((o.float() - other.float()).abs().max()) / top < 2 * GPU_REL
        assert float((lse - ol).abs().max()) < 2e-3
    assert float((lse - rl).abs().max()) < 1e-3


@pytest.mark.gpu
def test_a_chain_on_the_gpu_equals_one_launch():
    """The blocked attention's chain at DeepSeek-V3's widths (B = 512 over 1000 keys, 300
    queries, 16 heads), the state fp32, the last launch into a bf16 output: one launch's result
    within GPU_REL (the chain rounds o to bf16 once, as one launch does)."""
    n, m, H = 300, 1000, 16
    q, k, v = operands(H, n, m, 192, 128, 9, torch.bfloat16, "cuda")
    acc, lse = nan_like(H, n, 128, torch.float32, "cuda")
    out = torch.full((n, H, 128), float("nan"), dtype=torch.bfloat16, device="cuda")
    blocks = key_blocks(m, n, 512)
    for i, (a, b, masked) in enumerate(blocks):
        last = i == len(blocks) - 1
        mla_block_attention(q, k[:, a:b], v[:, a:b], masked, 192 ** -0.5,
                            o=out.transpose(0, 1) if last else acc, lse=lse,
                            acc=acc if i else None)
    ro, rl = attend_block_ref(q, k, v, True, 192 ** -0.5)
    top = float(ro.float().abs().max())
    assert float((out.transpose(0, 1).float() - ro.float()).abs().max()) / top < GPU_REL
    assert float((lse - rl).abs().max()) < 1e-3


@pytest.mark.gpu
def test_the_triton_launch_allocates_only_the_query_on_the_gpu():
    """The blocked attention under the triton launch (all 128 heads, 512 queries over 8192
    keys, B = 512): beyond its scratch and output it allocates the chunk's query [H, T, hd] and
    nothing a block (no kernel output, no merge temporaries: the launches carry the state)."""
    from strata.models.mla_launch import pin_mla_launch
    from strata.models.mla_scratch import MLAScratch
    from tests.models.test_mla_blocks import draw, transient_beyond
    H, N, R, Hv, L, T, P, block = 128, 128, 64, 128, 512, 512, 7680, 512
    ins = draw(H, T, P, N, R, Hv, L, 1, dtype=torch.bfloat16, device="cuda")
    out = torch.empty(T, H, Hv, dtype=torch.bfloat16, device="cuda")
    with pin_mla_launch(backend="triton"):
        sc = MLAScratch.of(H, N + R, Hv, T, P + T, "cuda", block=block)
        kw = dict(v_head_dim=Hv, scale=(N + R) ** -0.5, block=block, scratch=sc, out=out)
        extra = transient_beyond(ins, kw)
    bound = H * T * (N + R) * 2 + (1 << 20)
    assert extra <= bound, f"{extra} B beyond the scratch, bound {bound} B"
