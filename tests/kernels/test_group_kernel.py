"""The grouping kernels (strata.kernels.moe._group_kernel, behind group_blocked_bounded) against
their torch twin: every field equal, on fresh random routings with skipped (-1) and out-of-range
ids, chunk counts past one program, expert counts that are not powers of two, and room to spare."""
import pytest
import torch
from hypothesis import example, given, settings, strategies as st

from strata.kernels.moe.grouping import (group_blocked, group_blocked_bounded,
                                         group_blocked_bounded_torch)
from strata.kernels.moe.tiles import padded_rows
from tests.kernels.compiled import ROOT, compile_lines


def _routing(T, K, E, seed, skip, wild):
    g = torch.Generator().manual_seed(seed)
    ids = torch.argsort(torch.rand(T, max(E, K), generator=g), dim=1)[:, :K] % E   # [T, K]
    ids[torch.rand(T, K, generator=g) < skip] = -1                    # another pass's
    if wild:   # what the torch twin clamps: an id past E - 1, an id below -1
        ids[torch.rand(T, K, generator=g) < 0.05] = E + 3
        ids[torch.rand(T, K, generator=g) < 0.05] = -7
    return ids


def _same(ids, E, BM, room):
    got = group_blocked_bounded(ids, E, BM, room)
    ref = group_blocked_bounded_torch(ids, E, BM, room)
    assert got.sorted_ids.dtype == torch.int32 and got.block_expert.dtype == torch.int32
    for f in ("sorted_ids", "block_expert", "counts", "padded_offsets", "n_blocks_dev"):
        a, b = getattr(got, f), getattr(ref, f)
        assert a.dtype == b.dtype and torch.equal(a, b), f
    assert (got.n_blocks, got.n_skipped, got.block_m, got.n_assign) == \
        (ref.n_blocks, ref.n_skipped, ref.block_m, ref.n_assign)
    return got


# The drawn cases stay within one chunk of 1024 ids (T <= 128 at K <= 8): an interpreted
# launch over 480-600 ids takes 2-5 s here, over 2,400 ids 10 s. More chunks are the named
# T=300 case's (3) and test_power_of_two_edges' (2 each)
@settings(max_examples=20, deadline=None)
@given(T=st.integers(1, 128), K=st.integers(1, 8), E=st.integers(1, 70),
       bm=st.sampled_from([16, 32, 64, 128]), skip=st.sampled_from([0.0, 0.3, 1.0]),
       wild=st.booleans(), extra=st.integers(0, 3), seed=st.integers(0, 2**16))
@example(T=300, K=8, E=60, bm=16, skip=0.3, wild=False, extra=0, seed=1)   # 3 chunks of 1024
@example(T=5, K=1, E=1, bm=16, skip=0.0, wild=False, extra=0, seed=2)
@example(T=4, K=8, E=30, bm=64, skip=1.0, wild=False, extra=1, seed=3)     # every id skipped
def test_kernel_equals_torch_twin(T, K, E, bm, skip, wild, extra, seed):
    ids = _routing(T, K, E, seed, skip, wild)
    room = padded_rows(T, K, E, bm) // bm + extra
    _same(ids, E, bm, room)


@pytest.mark.parametrize("E", [126, 128, 512])
def test_power_of_two_edges(E):
    # E + 2 a power of two (126), E one (128), and seed-512e's width; 130 x 8 assignments are
    # two chunks of 1024 (each chunk one more interpreted sort)
    ids = _routing(130, 8, E, E, 0.2, False)
    _same(ids, E, 32, padded_rows(130, 8, E, 32) // 32)


def test_bounded_layout_matches_the_checked_one():
    """The checked grouping (one sync) and the bounded kernel agree on every real row."""
    ids = _routing(200, 8, 40, 9, 0.25, False)
    exact = group_blocked(ids, 40, 32, skip_negative=True)
    got = _same(ids, 40, 32, padded_rows(200, 8, 40, 32) // 32)
    rows = exact.n_blocks * 32
    assert torch.equal(got.sorted_ids[:rows], exact.sorted_ids)
    assert torch.equal(got.block_expert[:exact.n_blocks], exact.block_expert)
    assert int(got.n_blocks_dev) == exact.n_blocks
    assert torch.all(got.sorted_ids[rows:] == ids.numel())
    assert torch.all(got.block_expert[exact.n_blocks:] == 40)


def test_int32_ids_and_a_strided_view():
    ids = _routing(90, 4, 12, 5, 0.1, False)
    _same(ids.to(torch.int32), 12, 16, padded_rows(90, 4, 12, 16) // 16)
    wide = torch.cat([ids, ids], 1)[:, ::2]                            # not contiguous
    _same(wide, 12, 16, padded_rows(90, 4, 12, 16) // 16)


@pytest.mark.gpu
@pytest.mark.parametrize("T,E,bm", [(512, 128, 32), (2048, 128, 128), (32768, 128, 128),
                                    (8192, 512, 128)])
def test_gpu_real_shapes(T, E, bm):
    ids = _routing(T, 8, E, T, 0.3, False).cuda()
    _same(ids, E, bm, padded_rows(T, 8, E, bm) // bm)


def test_group_kernels_compile_for_h200():
    """The three kernels compile for sm_90 (triton's passes and ptxas, no GPU) at qwen3-30b-a3b's
    and seed-512e's expert counts, without register spills (compile_group.py)."""
    lines, out = compile_lines("compile_group.py", timeout=600,
                               cwd=ROOT / "tests" / "kernels")
    assert len(lines) == 6 and all("spill 0/0" in ln for ln in lines), out
