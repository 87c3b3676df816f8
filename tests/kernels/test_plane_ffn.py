"""plane_ffn (Triton, plane-layout Q8_0 / Q4_0 / Q4_K experts) against plane_ffn_torch on fresh
random data.

Error measure and bound: test_moe_ffn's DECODED_REL (each decoded weight q·d is rounded to bf16
for the tensor cores, h and y to bf16; the reference keeps every product in fp32). Workspaces are
poisoned with NaN before a launch, so a row the kernel should write and does not shows up.
"""
from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass

import pytest
import torch

from strata.bench.expert_gemm import DECODED_REL, rel_err   # the GEMM tests' bound and measure
from strata.errors import StrataError
from strata.formats import dequantize, get_format
from strata.kernels import topk_route
from strata.kernels.moe.ffn import moe_ffn_torch
from strata.kernels.moe.plane import (KERNEL_FORMATS, PLANE_TILES, PlaneTile, plane_dequantize,
                                      plane_dequantize_torch, plane_ffn, plane_ffn_torch,
                                      plane_tile)
from strata.kernels.moe.random_experts import random_blocks, random_expert_set
from strata.kernels.moe.tiles import padded_rows
from strata.planes import to_plane_set, to_planes
from tests.kernels.compiled import compile_lines

@dataclass(frozen=True)
class Case:
    id: str
    T: int
    E: int
    K: int
    D: int = 64
    F: int = 64
    tile: str = "16x16x32/w4s2"
    route: str = "random"     # "random" | "one" (all on expert 0) | "skip" (expert 1 idle)
    absent: tuple = ()        # experts not resident (never routed to)
    bias: bool = False
    fmts: tuple = ("Q8_0",)   # gate, up, down (one: all three)


CASES = [
    Case("T1", T=1, E=3, K=2),
    Case("T7-odd-idle-expert", T=7, E=5, K=2, route="skip"),
    Case("all-on-one-two-blocks", T=20, E=4, K=1, route="one"),
    Case("T3-lt-tile-noswap", T=3, E=4, K=2, tile="16x32x64/w4s2/noswap"),
    Case("tma", T=9, E=3, K=2, tile="16x32x64/w4s2/tma"),
    Case("BK-past-F-and-D-not-whole-BN", T=5, E=3, K=2, D=96, F=32, tile="16x64x64/w4s2"),
    Case("BM32-K-eq-E", T=6, E=3, K=3, tile="32x16x32/w4s1"),
    Case("absent-experts", T=5, E=6, K=2, absent=(1, 4), route="absent"),
    Case("bias-swiglu", T=5, E=3, K=2, bias=True),
    Case("q4_0", T=6, E=3, K=2, fmts=("Q4_0",)),
    Case("q4_0-tma-nomagic", T=5, E=3, K=2, fmts=("Q4_0",), tile="16x32x64/w4s2/tma/nomagic"),
    Case("mixed-q4-q8-q4-BK-past-F", T=7, E=4, K=2, F=32, fmts=("Q4_0", "Q8_0", "Q4_0"),
         tile="16x16x64/w4s2"),
    # Q4_K rows are whole 256-weight super-blocks: D (gate/up's K) 256; F 256 for a Q4_K down
    Case("q4_k-gate-up-q8-down", T=5, E=3, K=2, D=256, F=64, fmts=("Q4_K", "Q4_K", "Q8_0"),
         tile="16x32x64/w4s2"),
    Case("q4_0-q4_k-q4_k-tma-nomagic-BK128", T=4, E=3, K=2, D=256, F=256,
         fmts=("Q4_0", "Q4_K", "Q4_K"), tile="16x64x128/w4s2/tma/nomagic"),
    # a program spanning RB blocks of one expert: 3 blocks (the second program's span runs past
    # the expert's end), blocks of several experts side by side, spans past the last block
    Case("r2-three-blocks-one-expert", T=40, E=4, K=1, route="one", tile="16x16x32/w4s2/r2"),
    Case("r4-many-experts", T=40, E=3, K=2, tile="16x32x32/w4s2/r4"),
    Case("r2-q4_k-q4_0-noswap", T=30, E=3, K=2, D=256, F=64, fmts=("Q4_K", "Q4_K", "Q4_0"),
         tile="16x32x64/w4s2/noswap/r2"),
    Case("r2-bias-swiglu-tma", T=21, E=3, K=2, bias=True, tile="16x32x32/w4s2/tma/r2"),
]


def _inputs(c: Case, device="cpu"):
    seed = zlib.crc32(c.id.encode())
    gen = torch.Generator().manual_seed(seed)
    act = None
    if c.bias:
        from strata.blob import ExpertAct
        act = ExpertAct("swiglu_oai")
    ex = random_expert_set(c.E, c.D, c.F, *c.fmts, seed=seed, absent=c.absent, bias=c.bias,
                           act=act)
    ps = to_plane_set(ex)
    x = torch.randn(c.T, c.D, generator=gen).bfloat16()
    logits = torch.randn(c.T, c.E, generator=gen)
    if c.route == "one":
        logits[:, 0] += 100.0
    if c.route == "skip":
        logits[:, 1] -= 100.0
    for e in c.absent:
        logits[:, e] -= 100.0
    ids, w = topk_route(logits, c.K)
    return ex, ps, x, ids, w


def _poisoned(ps, T, K, tile):
    F, D = ps.layout.d_expert, ps.layout.d_model
    rows = padded_rows(T, K, ps.n_expert, tile.BLOCK_M)
    return {"h": torch.full((rows, F), float("nan"), dtype=torch.bfloat16),
            "yk": torch.full((T * K, D), float("nan"), dtype=torch.float32)}


@pytest.mark.parametrize("c", CASES, ids=lambda c: c.id)
def test_plane_ffn_matches_reference(c: Case):
    ex, ps, x, ids, w = _inputs(c)
    tile = PlaneTile.parse(c.tile)
    ref = plane_ffn_torch(x, ids, w, ps)
    # the reference on planes is the ggml reference: the relayout and the plane decoder are exact
    assert torch.equal(ref, moe_ffn_torch(x, ids, w, ex))
    y = plane_ffn(x, ids, w, ps, schedule=tile, workspace=_poisoned(ps, c.T, c.K, tile))
    assert y.shape == (c.T, c.D) and y.dtype == torch.bfloat16
    assert not torch.isnan(y).any(), "a row was not written (NaN poison survived)"
    assert rel_err(y, ref) < DECODED_REL


@pytest.mark.parametrize("tile", ["16x16x32/w4s2", "16x16x32/w4s2/r2", "16x32x32/w4s2/r4"])
def test_unchecked_routing_gives_the_checked_result(tile):
    """check=False (the engine's: no sync, a grid for the most blocks any routing makes, the
    block count read on the device) computes exactly what check=True does, spans included."""
    c = Case("unchecked", T=37, E=4, K=2)
    ex, ps, x, ids, w = _inputs(c)
    pt = PlaneTile.parse(tile)
    y = plane_ffn(x, ids, w, ps, schedule=pt, workspace=_poisoned(ps, c.T, c.K, pt))
    y2 = plane_ffn(x, ids, w, ps, schedule=pt, check=False,
                   workspace=_poisoned(ps, c.T, c.K, pt))
    assert torch.equal(y, y2)
    assert rel_err(y, plane_ffn_torch(x, ids, w, ps)) < DECODED_REL


def test_skipped_ids_out_and_the_layer_combines():
    """Two passes over halves of the experts (ids of the other half -1), summed into `out`,
    and check=False (no host sync) with combine defer/layer, equal the one-call result."""
    c = Case("passes", T=11, E=6, K=2)
    _, ps, x, ids, w = _inputs(c)
    tile = PlaneTile.parse("16x32x64/w4s2")
    ref = plane_ffn_torch(x, ids, w, ps).float()
    halves = [torch.where(ids < 3, ids, -1), torch.where(ids >= 3, ids, -1)]
    out = torch.zeros(c.T, c.D)
    for part in halves:
        plane_ffn(x, part, w, ps, schedule=tile, out=out)
    assert rel_err(out, ref) < DECODED_REL
    ws = _poisoned(ps, c.T, c.K, tile)
    out2 = torch.zeros(c.T, c.D)
    plane_ffn(x, halves[0], w, ps, schedule=tile, workspace=ws, check=False, combine="defer")
    plane_ffn(x, halves[1], w, ps, schedule=tile, workspace=ws, check=False, combine="layer",
              out=out2)
    assert not torch.isnan(out2).any() and rel_err(out2, ref) < DECODED_REL
    # the reference adds each call's own rows whatever combine says
    ref32 = plane_ffn_torch(x, ids, w, ps, out=torch.zeros(c.T, c.D))
    out3 = torch.zeros(c.T, c.D)
    for part in halves:
        plane_ffn_torch(x, part, w, ps, out=out3, combine="defer")
    assert torch.allclose(out3, ref32, atol=1e-6, rtol=0)   # fp32 sums in another order


def test_nothing_routed_to_the_pass():
    c = Case("empty-pass", T=4, E=3, K=1)
    _, ps, x, ids, w = _inputs(c)
    y = plane_ffn(x, torch.full_like(ids, -1), w, ps, schedule=PlaneTile.parse("16x16x32/w4s1"))
    assert torch.equal(y, torch.zeros_like(y))


def _negative_zeros(raw, fmt):
    """raw with its first block's scale made negative and its first codes zero: the weights ggml
    decodes to -0 (Q8_0: q * d; Q4_0: d * (q - 8) at q = 8)."""
    f = get_format(fmt)
    raw = raw.clone()
    blk = raw.view(-1, f.block_bytes)
    blk[0, :2] = torch.tensor([-1.5], dtype=torch.float16).view(torch.uint8)
    blk[0, 2:10] = 0 if fmt == "Q8_0" else 0x88
    return raw


@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_0"])
@pytest.mark.parametrize("magic, fma", [(True, True), (True, False), (False, True)],
                         ids=["magic-fma", "magic", "convert"])
@pytest.mark.parametrize("rows, cols, block", [(5, 96, (4, 64)), (33, 64, (32, 32)),
                                               (1, 32, (16, 128))],
                         ids=["masked-both", "rows-past-BN", "BK-past-K"])
def test_plane_dequantize_bit_exact(fmt, magic, fma, rows, cols, block):
    """The GEMM's own loads and products (Triton) decode the planes to the very fp32 values
    ggml's decoder gives (strata.formats.dequantize, bit-exact with gguf-py), both ways of
    turning codes into floats. Q8_0's fused form (the GEMM's) differs in one thing only, and
    its torch twin says so: +0 where ggml gives -0."""
    f = get_format(fmt)
    raw = _negative_zeros(random_blocks(f, rows, cols, seed=rows * cols), fmt)
    planes = to_planes(raw, fmt, rows, cols)
    ref = dequantize(raw, f).float().reshape(rows, cols)
    got = plane_dequantize(planes, fmt, rows, cols, block=block, magic=magic, fma=fma)
    twin = plane_dequantize_torch(planes, fmt, rows, cols, magic=magic, fma=fma)
    assert torch.equal(got.view(torch.int32), twin.view(torch.int32))
    assert torch.equal(twin, ref)                                   # as values: -0 == +0
    neg_zero = ref.view(torch.int32) == torch.tensor([-0.0]).view(torch.int32)
    assert neg_zero.any()
    if fmt == "Q8_0" and magic and fma:
        assert torch.equal(twin.view(torch.int32) != ref.view(torch.int32), neg_zero)
    else:
        assert torch.equal(twin.view(torch.int32), ref.view(torch.int32))


def _q4_k_blocks(rows, cols, seed):
    """Random Q4_K rows, the first super-blocks replaced by tests/test_planes.py's extremes
    (d, dmin at the fp16 limits, subnormal, negative, zero; sc / m 0 or 63; codes 0 or 15)."""
    from tests.test_planes import _q4_k_extremes
    raw = random_blocks(get_format("Q4_K"), rows, cols, seed=seed).clone()
    ext = _q4_k_extremes()
    n = min(ext.numel(), raw.numel())
    raw[:n] = ext[:n]
    return raw


@pytest.mark.parametrize("magic", [True, False], ids=["magic", "convert"])
@pytest.mark.parametrize("rows, cols, block", [(5, 512, (4, 64)), (17, 256, (16, 32)),
                                               (3, 512, (4, 512))],
                         ids=["masked-rows", "BK32-rows-past-BN", "BK-two-super-blocks"])
def test_plane_dequantize_q4_k_bit_exact(magic, rows, cols, block):
    """Q4_K through the GEMM's loads and products: each sub-block's (d·sc, dmin·m) from the
    re-packed scale entry and (d·sc)·q - dmin·m equal ggml's decoder bit for bit, extreme
    scales and mins included, at reduction steps of one sub-block to two super-blocks."""
    f = get_format("Q4_K")
    raw = _q4_k_blocks(rows, cols, seed=rows + cols)
    planes = to_planes(raw, "Q4_K", rows, cols)
    ref = dequantize(raw, f).float().reshape(rows, cols)
    got = plane_dequantize(planes, "Q4_K", rows, cols, block=block, magic=magic)
    assert torch.equal(got.view(torch.int32), ref.view(torch.int32))
    assert torch.equal(plane_dequantize_torch(planes, "Q4_K", rows, cols).view(torch.int32),
                       ref.view(torch.int32))


def test_tile_table_and_parse():
    # keyed by the planner's BLOCK_M (qwen3's E 128, K 8: T / 16 in [16, 128])
    for fmt in KERNEL_FORMATS:
        assert [plane_tile(T, 8, 128, fmt) for T in (1, 256, 512, 1024, 2048, 8192)] == \
            [PLANE_TILES[fmt][m] for m in (16, 16, 32, 64, 128, 128)]
    assert plane_tile(0, 8, 128) == PLANE_TILES["Q8_0"][16]
    assert plane_tile(8192, 8, 128, "Q4_K") == PLANE_TILES["Q4_K"][128]
    with pytest.raises(StrataError, match="Q6_K"):
        plane_tile(512, 8, 128, "Q6_K")
    # a table for each format the GEMM reads, a tile for each BLOCK_M the planner picks, each no
    # taller than its key (the planner's workspace, padded_rows at the key, holds its rows)
    from strata.kernels.moe.tiles import BLOCK_M_MAX, BLOCK_M_MIN, block_m_for
    assert set(PLANE_TILES) == set(KERNEL_FORMATS)
    for table in PLANE_TILES.values():
        assert {block_m_for(T, 8, 128) for T in range(0, 4096, 7)} == set(table)
        assert min(table) == BLOCK_M_MIN and max(table) == BLOCK_M_MAX
        for m, t in table.items():
            assert t.BLOCK_M <= m
            assert all(padded_rows(T, 8, 128, t.BLOCK_M) <= padded_rows(T, 8, 128, m)
                       for T in (1, 77, 512, 4096))
            assert PlaneTile.parse(t.name) == t
    assert PlaneTile.parse("64x128x64/w4s3/noswap/tma/nomagic") == PlaneTile(
        64, 128, 64, 4, 3, swap=False, tma=True, magic=False)
    t = PlaneTile.parse("32x64x64/w4s4/r2")
    assert t.row_blocks == 2 and PlaneTile.parse(t.name) == t and t.name == "32x64x64/w4s4/r2"
    assert t.occupancy == (0, 0) and t.max_registers(0) is None is t.max_registers(1)
    t = PlaneTile.parse("32x64x64/w4s4/o3.4/r2")
    assert (t.row_blocks, t.occupancy, t.name) == (2, (3, 4), "32x64x64/w4s4/r2/o3.4")
    # 65536 registers an SM: 3 programs of 128 threads leave 170, allocated in 8s; 4 leave 128
    assert (t.max_registers(0), t.max_registers(1)) == (168, 128)
    t = PlaneTile.parse("64x128x64/w8s4/o1")
    assert t.occupancy == (1, 1) and t.name == "64x128x64/w8s4/o1"
    assert t.max_registers(0) == 255 == t.max_registers(1)
    assert PlaneTile(32, 64, 64, 4, 4, occupancy=3).occupancy == (3, 3)
    for bad in ((3,), (3, 4, 5), (3, -1), "3", (3.0, 4)):
        with pytest.raises(StrataError, match="occupancy"):
            PlaneTile(32, 64, 64, 4, 4, occupancy=bad)
    t = PlaneTile.parse("64x128x64/w8s4/o0.2")
    assert (t.max_registers(0), t.max_registers(1), t.name) == (None, 128, "64x128x64/w8s4/o0.2")
    for bad in ("64x128/w4s3", "64x128x64/w4", "64x128x64/w4s3/fast", "64x128x48/w4s3",
                "64x128x16/w4s3", "64x128x64/w3s3", "32x64x64/w4s4/r3", "32x64x64/w4s4/r2/r2",
                "32x64x64/w4s4/r0", "32x64x64/w4s4/r", "32x64x64/w4s4/o", "32x64x64/w4s4/o2/o3",
                "32x64x64/w4s4/o-1", "32x64x64/w4s4/o32", "32x64x64/w4s4/o3.32",
                "32x64x64/w4s4/o3.4.5", "32x64x64/w4s4/o.3"):
        with pytest.raises(StrataError):
            PlaneTile.parse(bad)


def test_pin_plane_tile_wins_over_the_table_and_is_restored(monkeypatch):
    from strata.kernels.moe import plane as plane_mod
    seen = []
    real = plane_mod._pk._plane_gemm_kernel

    class Spy:
        def __getitem__(self, grid):
            def launch(*a, **kw):
                seen.append((kw["S"].BM, kw["S"].BN, kw["S"].BK, kw["num_warps"],
                             kw.get("maxnreg")))
                return real[grid](*a, **kw)
            return launch
    monkeypatch.setattr(plane_mod._pk, "_plane_gemm_kernel", Spy())
    c = Case("pin", T=3, E=3, K=1)
    _, ps, x, ids, w = _inputs(c)
    with plane_mod.pin_plane_tile(PlaneTile.parse("16x32x32/w2s1")):
        plane_ffn(x, ids, w, ps)
        plane_ffn(x, ids, w, ps, schedule=PlaneTile.parse("16x16x64/w4s1/o3.4"))
    plane_ffn(x, ids, w, ps)
    assert seen == ([(16, 32, 32, 2, None)] * 2 + [(16, 16, 64, 4, 168), (16, 16, 64, 4, 128)]
                    + [(16, 128, 64, 4, None)] * 2)
    with pytest.raises(StrataError, match="PlaneTile"):
        with plane_mod.pin_plane_tile("16x32x32/w2s1"):
            pass


def test_bad_inputs_are_clear_errors():
    c = Case("bad", T=3, E=3, K=1)
    ex, ps, x, ids, w = _inputs(c)
    with pytest.raises(StrataError, match="to_plane_set"):
        plane_ffn(x, ids, w, ex)
    with pytest.raises(StrataError, match="PlaneTile"):
        plane_ffn(x, ids, w, ps, schedule="dp")
    bf = to_plane_set(random_expert_set(3, 64, 64, "Q8_0", "Q8_0", "BF16", seed=1))
    with pytest.raises(StrataError, match="down BF16"):
        plane_ffn(x, ids, w, bf)
    with pytest.raises(StrataError, match="Q4_K, got Q6_K"):
        plane_dequantize(torch.zeros(210, dtype=torch.uint8), "Q6_K", 1, 256)
    with pytest.raises(StrataError, match="bf16"):
        plane_ffn(x.float(), ids, w, ps)


# -- on the GPU, at the real shape (qwen3-30b-a3b: D 2048, F 768, E 128, K 8) -------------------

@functools.lru_cache(maxsize=2)
def _real_sets(device, fmt):
    """The qwen3-30b-a3b layer's experts (4 distinct blobs repeated) and their planes, made
    once per format for the module's GPU tests (quantizing on the host is the slow part)."""
    from strata.bench.expert_gemm import SHAPES, make_experts
    ex = make_experts(SHAPES["qwen3-30b-a3b"], fmt, device, distinct=4)
    return ex, to_plane_set(ex)


def _real(device, T, seed=0, fmt="Q8_0"):
    from strata.bench.expert_gemm import SHAPES
    shape = SHAPES["qwen3-30b-a3b"]
    ex, ps = _real_sets(device, fmt)
    gen = torch.Generator().manual_seed(seed + T)
    x = torch.randn(T, shape.d_model, generator=gen).bfloat16().to(device)
    ids, w = topk_route(torch.randn(T, shape.n_expert, generator=gen).to(device), shape.top_k)
    return ex, ps, x, ids, w


GPU_TILES = [None] + list(dict.fromkeys(
    [t.name for f in KERNEL_FORMATS for t in PLANE_TILES[f].values()]
    + ["128x128x64/w8s3/noswap", "64x128x64/w4s3/tma"]))


# every tile at T 77 (a partial block of rows per expert); the table's tile at T 1 and 2048 (the
# row counts only move the grid: a tile is one compile, the suite's time on the device)
@pytest.mark.gpu
@pytest.mark.parametrize("fmt, T, tile", [("Q8_0", 77, t) for t in GPU_TILES]
                         + [("Q8_0", T, None) for T in (1, 2048)]
                         + [(f, T, t) for f in ("Q4_0", "Q4_K")
                            for T, t in ((77, None), (77, GPU_TILES[-1]), (2048, None))],
                         ids=lambda v: v if isinstance(v, str) else str(v) if v else "table")
def test_real_shape_gpu(fmt, T, tile):
    ex, ps, x, ids, w = _real(torch.device("cuda"), T, fmt=fmt)
    pt = PlaneTile.parse(tile) if tile else plane_tile(T, 8, 128, fmt)
    ref = plane_ffn_torch(x, ids, w, ps)
    ws = {"h": torch.full((padded_rows(T, 8, 128, pt.BLOCK_M), 768), float("nan"),
                          dtype=torch.bfloat16, device="cuda"),
          "yk": torch.full((T * 8, 2048), float("nan"), device="cuda")}
    y = plane_ffn(x, ids, w, ps, schedule=pt, workspace=ws)
    assert not torch.isnan(y).any()
    assert rel_err(y, ref) < DECODED_REL


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_0", "Q4_K"])
def test_plane_dequantize_gpu_bit_exact(fmt):
    """Compiled for the GPU (where ptxas may contract a product and a difference into an FMA)
    the GEMM's decode still gives ggml's values bit for bit: every product it forms is exact
    (Q8_0's fused form: its torch twin's, +0 for ggml's -0). The relayout run on the GPU is the
    CPU's, both ways."""
    from strata.planes import to_ggml
    rows, cols = 96, 1024
    f = get_format(fmt)
    raw = (_q4_k_blocks(rows, cols, seed=3) if fmt == "Q4_K"
           else _negative_zeros(random_blocks(f, rows, cols), fmt))
    ref = dequantize(raw, f).float().reshape(rows, cols)
    planes = to_planes(raw.cuda(), fmt, rows, cols)
    assert torch.equal(planes.cpu(), to_planes(raw, fmt, rows, cols))
    assert torch.equal(to_ggml(planes, fmt, rows, cols).cpu(), raw)
    twin = plane_dequantize_torch(planes.cpu(), fmt, rows, cols)
    for block in ((32, 64), (64, 128)):
        got = plane_dequantize(planes, fmt, rows, cols, block=block, fma=False)
        assert torch.equal(got.cpu().view(torch.int32), ref.view(torch.int32)), block
        got = plane_dequantize(planes, fmt, rows, cols, block=block)   # the GEMM's form
        assert torch.equal(got.cpu().view(torch.int32), twin.view(torch.int32)), block


@pytest.mark.gpu
def test_relayout_on_gpu_is_the_cpu_relayout_and_check_false_never_syncs():
    dev = torch.device("cuda")
    ex, ps, x, ids, w = _real(dev, 512)
    cpu = to_plane_set(type(ex)(ex.arena.cpu(), ex.slot_offset.cpu(), ex.layout))
    assert torch.equal(ps.arena.cpu(), cpu.arena)
    ref = plane_ffn(x, ids, w, ps)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        y = plane_ffn(x, ids, w, ps, check=False)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(y, ref)


def test_plane_gemm_compiles_for_h200():
    """Both modes compile for sm_90 (triton's passes and ptxas, no GPU) at the default tables' tiles
    (each format at its own table's), in a process without the interpreter: every dot
    a wgmma, none serialized (ptxas C7515: the accumulators' zeros on the loop's zero-trip path made
    ptxas wait on each wgmma before the next, until the kernel told it n_in > 0), the code tiles
    staged by cp.async, no register spills."""
    lines, out = compile_lines("compile_plane.py", "--quick", timeout=900)
    runs = {(t, f) for f in KERNEL_FORMATS for t in PLANE_TILES[f].values()}
    assert len(lines) == 2 * len(runs), out
    for line in lines:
        assert "spill 0/0" in line and "wgmma" in line and "cp.async" in line, line
        assert "serialized" not in line, line
