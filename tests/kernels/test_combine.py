"""The expert FFN's combine (strata.kernels.moe.combine): y[t] = the sum over k of yk[t*K + k].

The kernel against its torch reference bit for bit on fresh random data (rows mode x out given or
not), with the rows of id -1 filled with NaN (in "mask" mode they must never be read) and y
NaN-poisoned before the launch (tests/conftest.py). Why the shapes: D not a multiple of the
tile's BLOCK_D and T not one of BLOCK_T (the masked edges), K = 1 (a lone row), T*K = 0 (no
launch at all), every id -1 (y is +0.0 and nothing is read). The Hypothesis property states what
the combine means: skipping a row is adding +0.0, `out` gets exactly the fp32 sum added, the
bf16 y is that sum rounded to nearest even.
"""
from dataclasses import dataclass

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from strata.errors import StrataError
from strata.kernels.moe.combine import CombineTile, combine_rows, combine_rows_torch
from tests.kernels.compiled import compile_lines

MODES = ("all", "mask", "layer")


@dataclass(frozen=True)
class Case:
    name: str
    T: int
    K: int
    D: int
    tile: CombineTile | None = None   # None: the default tile
    skip: float = 0.3                 # chance that an id is -1


CASES = [
    Case("T7-K3-D70-tile4x32", 7, 3, 70, CombineTile(4, 32)),   # edge blocks on both axes
    Case("T33-K8-D200", 33, 8, 200),                            # qwen3's K, one partial D block
    Case("T5-K1-D64-tile2x16", 5, 1, 64, CombineTile(2, 16)),   # a lone row per token
    Case("T9-K4-D37-allskip", 9, 4, 37, skip=1.0),              # every id -1
]


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32)


def draw(T, K, D, skip, seed):
    """yk fp32 [T*K, D] (rows of id -1 NaN), topk_ids [T, K] (-1 with chance `skip`)."""
    g = torch.Generator().manual_seed(seed)
    yk = torch.randn(T * K, D, generator=g) * 4
    ids = torch.randint(0, 6, (T, K), generator=g)
    ids[torch.rand(T, K, generator=g) < skip] = -1
    return yk, ids


def nan_skipped(yk, ids):
    """yk with every row of id -1 set to NaN (a row the pass never wrote)."""
    yk = yk.clone()
    yk[(ids < 0).reshape(-1)] = float("nan")
    return yk


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("rows", MODES)
@pytest.mark.parametrize("add", [False, True], ids=["bf16", "out"])
def test_kernel_equals_reference(case, rows, add):
    T, K, D = case.T, case.K, case.D
    yk, ids = draw(T, K, D, case.skip if rows == "mask" else 0.0, seed=T * 100 + K * 10 + add)
    if rows == "mask":
        yk = nan_skipped(yk, ids)
    before = yk.clone()
    out = torch.randn(T, D) if add else None
    ref = combine_rows_torch(yk, T, K, D, ids, out.clone() if add else None, rows)
    got = combine_rows(yk, T, K, D, ids, out, rows, tile=case.tile)
    if add:
        assert got is out, "with `out` the result is `out` itself"
    assert got.shape == (T, D) and got.dtype == (torch.float32 if add else torch.bfloat16)
    assert torch.isfinite(got).all(), "a skipped row was read, or y was left unwritten"
    assert torch.equal(bits(got), bits(ref))
    assert torch.equal(bits(yk), bits(before)), "the combine must not write yk"
    if case.skip == 1.0 and rows == "mask":
        assert torch.equal(bits(got), bits(out if add else torch.zeros(T, D).bfloat16()))


@pytest.mark.parametrize("fn", [combine_rows, combine_rows_torch], ids=["triton", "torch"])
def test_replaces_masked_fill_then_sum(fn):
    """The torch path it replaces (zero the rows of id -1 in place, sum over K, then round or add):
    the same values up to fp32 rounding of K - 1 adds in another order."""
    T, K, D = 13, 8, 96
    yk, ids = draw(T, K, D, 0.4, seed=7)
    old = yk.clone().view(T, K, D).masked_fill_((ids < 0)[..., None], 0.0).sum(dim=1)
    out = torch.randn(T, D)
    got = fn(nan_skipped(yk, ids), T, K, D, ids, out.clone(), "mask") - out
    bound = 2 * (K - 1) * 2.0 ** -24 * (yk.view(T, K, D).abs().sum(1) + out.abs())
    assert ((got - old).abs() <= bound).all()
    y = fn(nan_skipped(yk, ids), T, K, D, ids, None, "mask")
    assert ((y.float() - old).abs() <= 2.0 ** -8 * old.abs() + bound).all()


@pytest.mark.parametrize("fn", [combine_rows, combine_rows_torch], ids=["triton", "torch"])
@pytest.mark.parametrize("T, K", [(0, 8), (4, 0)], ids=["T0", "K0"])
@pytest.mark.parametrize("rows", MODES + (None,))
def test_no_rows(fn, T, K, rows):
    """T*K = 0 (or rows None): y = 0, `out` comes back untouched, nothing is launched."""
    D = 24
    yk, ids = torch.empty(T * K, D), torch.zeros(T, K, dtype=torch.long)
    y = fn(yk, T, K, D, ids, None, rows)
    assert y.dtype == torch.bfloat16 and torch.equal(y, torch.zeros(T, D).bfloat16())
    out = torch.randn(T, D)
    keep = out.clone()
    assert fn(yk, T, K, D, ids, out, rows) is out and torch.equal(out, keep)


def test_rows_none_reads_nothing():
    yk, ids = draw(3, 2, 16, 0.0, seed=1)
    y = combine_rows(torch.full_like(yk, float("nan")), 3, 2, 16, ids, None, None)
    assert torch.equal(y, torch.zeros(3, 16).bfloat16())


@pytest.mark.parametrize("fn", [combine_rows, combine_rows_torch], ids=["triton", "torch"])
def test_bad_arguments_are_named(fn):
    yk, ids = draw(4, 2, 8, 0.0, seed=2)
    with pytest.raises(StrataError, match="rows must be one of"):
        fn(yk, 4, 2, 8, ids, None, "some")
    with pytest.raises(StrataError, match="yk must be fp32"):
        fn(yk[:5], 4, 2, 8, ids, None, "all")
    with pytest.raises(StrataError, match="yk must be fp32"):
        fn(yk.double(), 4, 2, 8, ids, None, "all")
    with pytest.raises(StrataError, match="topk_ids must be"):
        fn(yk, 4, 2, 8, ids[:3], None, "all")
    with pytest.raises(StrataError, match="out must be fp32"):
        fn(yk, 4, 2, 8, ids, torch.zeros(4, 8, dtype=torch.bfloat16), "all")


# tiles of at most 4 programs here: the interpreter pays ~50 ms a program on a loaded 2-core CI
# machine (the edge blocks of many-program tiles are test_kernel_equals_reference's cases)
TILES = [CombineTile(64, 128), CombineTile(32, 64)]


@st.composite
def problems(draw_):
    T = draw_(st.integers(0, 40))
    K = draw_(st.integers(1, 9))
    D = draw_(st.integers(1, 80))
    skipped = draw_(st.lists(st.booleans(), min_size=T * K, max_size=T * K))
    return T, K, D, skipped, draw_(st.sampled_from(TILES)), draw_(st.integers(0, 2 ** 16))


@settings(max_examples=25)   # three interpreter launches an example
@given(problems())
@example((1, 1, 1, [True], CombineTile(1, 1), 0)).via("the smallest: the only row skipped")
@example((3, 8, 17, [False] * 24, CombineTile(2, 16), 1)).via("nothing skipped, D past a block")
@example((2, 9, 5, [True, False] * 9, CombineTile(64, 128), 2)).via("one block bigger than all")
def test_combine_property(p):
    """Skipping a row is adding +0.0 and never reading it; `out` gets exactly the fp32 sum
    added; the bf16 y is that sum rounded to nearest even (s: the sum, from the reference,
    which the kernel equals bit for bit in test_kernel_equals_reference)."""
    T, K, D, skipped, tile, seed = p
    g = torch.Generator().manual_seed(seed)
    yk = torch.randn(T * K, D, generator=g)
    ids = torch.randint(0, 5, (T, K), generator=g)
    ids[torch.tensor(skipped, dtype=torch.bool).view(T, K)] = -1
    zeroed = yk.clone()
    zeroed[(ids < 0).reshape(-1)] = 0.0
    s = combine_rows_torch(zeroed, T, K, D, ids, torch.zeros(T, D), "all")
    got = combine_rows(zeroed, T, K, D, ids, torch.zeros(T, D), "all", tile=tile)
    assert torch.equal(bits(got), bits(s))
    base = torch.randn(T, D, generator=g)
    got = combine_rows(nan_skipped(yk, ids), T, K, D, ids, base.clone(), "mask", tile=tile)
    assert torch.equal(bits(got), bits(base + s))
    got = combine_rows(nan_skipped(yk, ids), T, K, D, ids, None, "mask", tile=tile)
    assert torch.equal(bits(got), bits(s.to(torch.bfloat16)))


def test_combine_compiles_for_h200():
    """Both sides of MASK and of ADD compile for sm_90 at the default GPU tile (triton's passes and
    ptxas, no GPU) in a process without the interpreter, without register spills."""
    lines, out = compile_lines("compile_combine.py", "--quick", timeout=600)
    assert len(lines) == 2, out
    for line in lines:
        assert "spill 0/0" in line, line


# --- on the H200 ------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 77, 8192])
@pytest.mark.parametrize("rows", ["all", "mask"])
def test_gpu_kernel_equals_reference_at_the_qwen3_shape(T, rows):
    """K 8, D 2048 (qwen3-30b-a3b): the CUDA kernel is the reference bit for bit (fp32 adds in
    k order, cvt.rn to bf16), rows of id -1 NaN, and it never syncs the host."""
    K, D = 8, 2048
    yk, ids = draw(T, K, D, 0.5 if rows == "mask" else 0.0, seed=T)
    yk, ids = yk.cuda(), ids.cuda()
    if rows == "mask":
        yk = nan_skipped(yk, ids)
    for out in (None, torch.randn(T, D, device="cuda")):
        ref = combine_rows_torch(yk, T, K, D, ids, None if out is None else out.clone(), rows)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            got = combine_rows(yk, T, K, D, ids, out, rows)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert torch.isfinite(got).all()
        assert torch.equal(bits(got), bits(ref))
