"""The int8 expert GEMM over plane-layout Q8_0 / Q4_0 / Q4_K experts (strata.planes):
strata.kernels.moe.int8's op and numbers, its weights read as plain code tiles.

Legend: T tokens, D hidden, F expert width, E experts, K top-k.

    xq = q8_1(x), codes in gate/up's plane order       (strata.kernels.moe.q8, order=fmt)
    h[r] = act(gate_e . xq[tok(r)], up_e . xq[tok(r)])  fp32, rows r in expert order
    hq = q8_1(h), codes in down's plane order          (in the gate/up GEMM's epilogue)
    yk[t*K + k] = w[t, k] * down_e . hq[r(t, k)]        fp32
    y[t] = sum_k yk[t*K + k]

Every dot is int8.py's, block by block in increasing k: acc += P_b * (da_b * d_b), P_b the int32
dot of a 32-block. A plane-layout Q8_0 matrix holds ggml's codes permuted inside each 16-weight
group (Q8_ORDER) and the activations' codes are stored in that order too, so each P_b, and with
it every bit of h, hq (once its codes are put back in weight order) and y, is int8.py's on the
same experts in ggml's layout (the tests hold the two to torch.equal). A plane Q4_0 matrix's
codes are unpacked to int8 q - 8 in registers (int8.py reads Q4_0 so, with its d), each 32-block
in the order the unpack yields (strata.planes._q4_act_order), the activations' codes in that
order. A plane Q4_K matrix's codes unpack the same way to q (0..15, int8.py's Q4_K codes) in the
same places, so its activation order is Q4_0's, and each 32-block adds int8.py's two terms with
its sub-block scale d * sc and minimum dmin * m (both exact in fp32):

    acc += P_b * (da_b * (d sc)_b);  acc -= sa_b * (dmin m)_b      (sa_b the q8_1 block sum)

Formats: Q8_0, Q4_0 or Q4_K for each pass: gate and up one format (they share xq, so its code
order), down any of them (hq takes down's order). D and F multiples of 32, and of 256 where a
Q4_K matrix reads them.

`moe_ffn_plane_int8`, `plane_int8_gate_up`, `plane_int8_gate_up_q8` and `plane_int8_down` are
Triton launchers (moe_ffn_int8's and its passes' signatures, on a PlaneSet), each with a
plain-torch twin of one signature (`..._torch`): int8.py's twin on the same experts put back in
ggml's layout (strata.planes.to_expert_set), the codes of xq and hq put back in weight order.
Launch choices are an Int8Tile (kb: 32-blocks a reduction step, each block's codes and
activations a tile of their own, the step's scales one word a row where `scale_words`),
PLANE_INT8_TILE unless given.
"""
from __future__ import annotations

import torch

from strata._backend import INTERPRET
from strata.kernels.moe import _plane_int8_kernel as _k
from strata.kernels.moe.int8 import (INTERP_TILE, Int8Tile, _plan, _q8_rows, _room, int8_down,
                                     int8_down_torch, int8_gate_up_torch, launch_out,
                                     moe_ffn_int8_torch, run_ffn)
from strata.errors import StrataError
from strata.experts import ExpertSet
from strata.kernels.moe.q8 import ORDERS, QK, Q8Rows, quantize_q8_1_torch
from strata.planes import PlaneSet, act_order, check_plane_set, to_expert_set

FORMATS = ("Q8_0", "Q4_0", "Q4_K")   # what it reads, for each matrix (the engine's landing checks)
# what it reads in ggml's layout (a plane re-layout leaves a format without planes as it is),
# through int8.py's kernel: Q4_K_M's Q6_K downs (llama.cpp gives some layers' ffn_down more bits)
KEPT = {"down": ("Q6_K",)}

# Chosen by the sm_90 compile alone (tests/kernels/compile_moe_plane_int8.py, triton 3.6 + ptxas;
# not yet timed): every code tile comes as cp.async (8 or 16 bytes), no byte load. A thread holds
# 16 (4 warps a 64-column tile) or 8 (8 warps) columns of a wgmma accumulator, each column's
# scale its own 2-byte load a block: at kb 1 those loads are most of a step's (64x128/w8s3: 34
# ld.global.b16 a thread a block against 3 cp.async). kb 4 with scale words (scale_words) loads
# 4 blocks' scales a row at once: 19 ld.global.b64 a thread per 4 blocks at 64x64/w8s3k4, which
# fits without spills (gate/up 255 registers q8_1 epilogue, 251 with bias + swiglu_oai; down
# 166; 72 KB shared). At k1 no spill: 64x64/w4 s2-s4, 64x64/w8s3 (127 registers), 64x128/w8s3,
# 128x64/w8s3; gate/up spills at 64x128/w4s3, 64x256/w8s3 and 128x128/w8 (0.3-1.5 KB), and with
# words at 4 warps or BLOCK_N 128 (k2 0.1-0.2 KB, k4 0.3 KB). Q4_0 at this tile: 255 / 180
# registers, no spill, its codes 16-byte cp.async; Q4_K 255 / 176, gate/up spilling 16 B (k2:
# 201 / 172, no spill; docs/kernel_notes.md).
PLANE_INT8_TILE = Int8Tile(BLOCK_M=64, BLOCK_N=64, num_warps=8, num_stages=3, kb=4)


def default_tile() -> Int8Tile:
    """The tile moe_ffn_plane_int8 takes when none is given (the interpreter: int8.py's)."""
    return INTERP_TILE if INTERPRET else PLANE_INT8_TILE


def check_gate_up(layout, where: str = "this layout") -> None:
    """One line when a blob layout's gate and up differ in format (they share xq's code order)."""
    g, u = layout.matrices[0].fmt.name, layout.matrices[1].fmt.name
    if g != u:
        raise StrataError(f"the plane int8 GEMM reads gate and up of one format; {where} has "
                          f"gate {g}, up {u}: choose another expert FFN (int8) for it")


def _check_planes(experts) -> None:
    check_plane_set(experts, FORMATS, "the plane int8 GEMM",
                    "strata.kernels.moe.int8.moe_ffn_int8", keep=KEPT)
    check_gate_up(experts.layout)


def _down_order(experts: PlaneSet):
    """The order hq's codes take: down's plane format, False (weight order) where down is in
    ggml's layout (KEPT)."""
    down = experts.planes.down
    return down.fmt if down is not None else False


def _ggml(experts: PlaneSet) -> ExpertSet:
    """The same arena as an ExpertSet, for int8.py's kernel on a KEPT matrix (in ggml's layout:
    only its bytes are read)."""
    return ExpertSet(experts.arena, experts.slot_offset, experts.layout)


def scale_words(kb: int, n_in: int, da: torch.Tensor, sa: torch.Tensor | None = None) -> bool:
    """Whether a step of kb blocks loads its scales as one word a row (kb 2 or 4 fp16: int32 /
    int64): where every row's step starts word-aligned in the weights' scale plane (n_in a
    multiple of 32 kb; the plane starts 16-byte aligned) and in the activations' (da fp16
    [R, n_in / 32], and sa, their block sums, where the weights have a minimum: Q4_K)."""
    return (kb in (2, 4) and n_in % (QK * kb) == 0
            and all(v.stride(0) % kb == 0 and v.data_ptr() % (2 * kb) == 0
                    for v in ((da,) if sa is None else (da, sa))))


def _launch(mode: int, a: Q8Rows, grp, experts: PlaneSet, p1, p2, dst, tw, tile: Int8Tile,
            n_out: int, n_in: int, b1: str, b2: str, topk: int, hq: Q8Rows | None = None):
    """One GEMM launch over planes p1 (and p2, p1's format); `hq`: GATE_UP writes these q8_1
    rows (codes in down's plane order) instead of fp32 h (dst)."""
    lay = experts.layout
    dst, hd, hs, stride_hd = launch_out(tile, dst, hq)
    boff = ((lay.bias.part(b1)[0], lay.bias.part(b2)[0]) if lay.bias is not None else (0, 0))
    kq = p1.fmt == "Q4_K"
    S = _k.PlaneInt8Spec(MODE=mode, TOPK=topk, BM=tile.BLOCK_M, BN=tile.BLOCK_N,
                         INTERP=INTERPRET, BIAS=lay.bias is not None, ACT=lay.act.code,
                         QH=hq is not None, KB=tile.kb,
                         WORDS=scale_words(tile.kb, n_in, a.d, a.s if kq else None),
                         Q4=p1.fmt in ("Q4_0", "Q4_K"), HORD=ORDERS[_down_order(experts)][0],
                         KQ=kq)
    n_tiles = _room(grp) * -(-n_out // tile.BLOCK_N)
    _k._plane_int8_gemm_kernel[(n_tiles,)](
        a.q, a.d, a.s, a.q.stride(0), a.d.stride(0), grp.sorted_ids, grp.block_expert, grp.n_assign,
        experts.arena, experts.slot_offset, p1.codes_offset, p1.scales_offset, p2.codes_offset,
        p2.scales_offset, p1.codes_row_bytes, dst, dst.stride(0), tw, n_out, n_in,
        grp.n_blocks_dev, *boff, float(lay.act.alpha), float(lay.act.limit), hd, hs, stride_hd, S=S,
        num_warps=tile.num_warps, num_stages=tile.num_stages, enable_fp_fusion=False)
    return dst


def plane_int8_gate_up(xq: Q8Rows, grp, experts: PlaneSet, topk: int,
                       tile: Int8Tile = Int8Tile()) -> torch.Tensor:
    """h fp32 [n_blocks * BM, F] (int8_gate_up's, in weight order) from xq's codes in gate's
    plane order."""
    pl = experts.planes
    h = torch.empty(_room(grp) * tile.BLOCK_M, experts.layout.d_expert, dtype=torch.float32,
                    device=xq.q.device)
    if _room(grp):
        _launch(0, xq, grp, experts, pl.gate, pl.up, h, h, tile, pl.gate.rows, pl.gate.cols,
                "gate", "up", topk)
    return h


def plane_int8_gate_up_q8(xq: Q8Rows, grp, experts: PlaneSet, topk: int,
                          tile: Int8Tile = Int8Tile(), out: Q8Rows | None = None) -> Q8Rows:
    """plane_int8_gate_up's h as q8_1 rows, codes in down's plane order (weight order for a
    KEPT down), quantized in the epilogue: the bits of quantize_q8_1(h, order=that). `out`: rows
    to write into (at least n_blocks * BM)."""
    pl = experts.planes
    rows = _room(grp) * tile.BLOCK_M
    hq = out or _q8_rows(rows, experts.layout.d_expert, xq.q.device)
    if rows:
        _launch(0, xq, grp, experts, pl.gate, pl.up, None, hq.d, tile, pl.gate.rows,
                pl.gate.cols, "gate", "up", topk, hq=hq)
    return hq


def plane_int8_down(hq: Q8Rows, grp, experts: PlaneSet, topk_weights: torch.Tensor,
                    tile: Int8Tile = Int8Tile(), yk: torch.Tensor | None = None) -> torch.Tensor:
    """yk fp32 [T*K, D] (int8_down's) from hq's codes in down's plane order; `yk`: the rows to
    write into. A KEPT down (ggml's layout, hq in weight order) runs int8_down itself."""
    pl = experts.planes
    if pl.down is None:
        return int8_down(hq, grp, _ggml(experts), topk_weights, tile, yk)
    T, K = topk_weights.shape
    if yk is None:
        yk = torch.empty(T * K, pl.down.rows, dtype=torch.float32, device=hq.q.device)
    tw = topk_weights.reshape(-1).float().contiguous()
    if _room(grp):
        _launch(1, hq, grp, experts, pl.down, pl.down, yk, tw, tile, pl.down.rows,
                pl.down.cols, "down", "down", K)
    return yk


def moe_ffn_plane_int8(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                       experts: PlaneSet, *, tile: Int8Tile | None = None, out=None,
                       workspace=None, check: bool = True, combine: str = "pass",
                       scratch_alloc=None) -> torch.Tensor:
    """moe_ffn_int8 (its arguments, its q8_1 rows in workspace["h"], its bits) on plane-layout
    Q8_0 / Q4_0 / Q4_K experts."""
    _check_planes(experts)
    _plan(x, topk_ids, topk_weights, experts, out, combine, workspace)
    return run_ffn(x, topk_ids, topk_weights, experts, tile or default_tile(), out, workspace,
                   check, combine, plane_int8_gate_up_q8, plane_int8_down,
                   order=experts.planes.gate.fmt)


# ---------------------------------------------------------------- torch twins

def _weight_order(a: Q8Rows, fmt) -> Q8Rows:
    """q8_1 rows with their codes put back from `fmt`'s plane order to weight order (False:
    already in it)."""
    return Q8Rows(act_order(a.q, fmt, back=True), a.d, a.s) if fmt else a


def plane_int8_gate_up_torch(xq: Q8Rows, grp, experts: PlaneSet, topk: int,
                             tile: Int8Tile = Int8Tile()) -> torch.Tensor:
    """Plain-torch twin of `plane_int8_gate_up` (same signature)."""
    _check_planes(experts)
    return int8_gate_up_torch(_weight_order(xq, experts.planes.gate.fmt), grp,
                              to_expert_set(experts), topk, tile)


def plane_int8_gate_up_q8_torch(xq: Q8Rows, grp, experts: PlaneSet, topk: int,
                                tile: Int8Tile = Int8Tile(),
                                out: Q8Rows | None = None) -> Q8Rows:
    """Plain-torch twin of `plane_int8_gate_up_q8` (same signature)."""
    h = plane_int8_gate_up_torch(xq, grp, experts, topk, tile)
    return quantize_q8_1_torch(h, out=out, order=_down_order(experts))


def plane_int8_down_torch(hq: Q8Rows, grp, experts: PlaneSet, topk_weights: torch.Tensor,
                          tile: Int8Tile = Int8Tile(),
                          yk: torch.Tensor | None = None) -> torch.Tensor:
    """Plain-torch twin of `plane_int8_down` (same signature; unwritten rows of a fresh yk are
    NaN)."""
    _check_planes(experts)
    return int8_down_torch(_weight_order(hq, _down_order(experts)), grp,
                           to_expert_set(experts), topk_weights, tile, yk)


def moe_ffn_plane_int8_torch(x: torch.Tensor, topk_ids: torch.Tensor,
                             topk_weights: torch.Tensor, experts: PlaneSet, *,
                             tile: Int8Tile | None = None, out=None, workspace=None,
                             check: bool = True, combine: str = "pass",
                             scratch_alloc=None) -> torch.Tensor:
    """Plain-torch twin of `moe_ffn_plane_int8` (same signature; moe_ffn_int8_torch's on the
    experts in ggml's layout)."""
    _check_planes(experts)
    return moe_ffn_int8_torch(x, topk_ids, topk_weights, to_expert_set(experts), tile=tile,
                              out=out, workspace=workspace, check=check, combine=combine)
