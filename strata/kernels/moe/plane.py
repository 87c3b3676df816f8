"""The MoE feed-forward over plane-layout Q8_0 / Q4_0 / Q4_K experts (strata.planes): plain code
tiles, scales applied in registers, bf16 tensor-core dots.

Legend: T tokens, D hidden, F expert width, E experts, K top-k.

    y[t] = sum_k w[t,k] * down_e(act(gate_e x[t] (+ bg_e), up_e x[t] (+ bu_e)) (+ bd_e))

the op of strata.kernels.moe.ffn.moe_ffn, on a PlaneSet instead of an ExpertSet (the same blob
layout, its Q8_0 / Q4_0 / Q4_K matrices re-laid as code and scale planes, any mix over gate, up and
down). x [T, D] bf16, topk_ids [T, K] int (-1 skips an assignment), topk_weights [T, K] fp32 -> y
bf16 [T, D]. Accumulation is fp32; each weight (q·d; Q4_K's (d·sc)·q - dmin·m) is formed in fp32 as
ggml's decoder forms it and rounded to bf16 once (the tensor cores' input), h = act(...) to bf16
(the down GEMM's input), and the K rows of a token are summed in fp32.

`plane_ffn` (Triton) and `plane_ffn_torch` (plain torch) share one signature, moe_ffn's: `schedule`
takes a PlaneTile (None: the active `pin_plane_tile`, else `plane_tile`'s table), `scratch_alloc`
is unused (the kernel is data-parallel: no stream-k fixup), `out` / `workspace` / `check` /
`combine` mean what they mean there. `plane_dequantize` (Triton) / `plane_dequantize_torch` decode
one matrix's planes through the GEMM's own loads and products, for the bit-exact tests.

Launch choices are a PlaneTile (data, pinnable per call). The default tables (one a gate/up code
format) key on the mean rows per routed expert, m = T·K / min(E, T·K) (for qwen3-30b-a3b, E 128
K 8: m = T / 16), as the planner's BLOCK_M does (a taller block pads more rows, a shorter one
re-reads the weights more often; row_blocks decodes the weights once for several blocks of one
expert), the weights are the MMA's M side (swap) so a short BLOCK_M still runs wgmma (without swap
a BLOCK_M below 64 compiles to mma.sync), BLOCK_K = 64 (no register spills). PLANE_TILES says
what the H200 measured; experiments/kernel_bench.py --arms strata-plane --tiles ... sweeps.
"""
from __future__ import annotations

import contextlib
from contextvars import ContextVar
from dataclasses import dataclass, replace

import torch

from strata._backend import INTERPRET
from strata.errors import StrataError
from strata.kernels.decode import TRAITS
from strata.kernels.moe import _plane_kernel as _pk
from strata.kernels.moe.ffn import (COMBINES, _check_inputs, _combine, _work, dequantize_matrix,
                                    routed_sum)
from strata.kernels.pins import pinned
from strata.kernels.moe.grouping import group_blocked, group_blocked_bounded
from strata.kernels.moe.tiles import block_m_for, padded_rows
from strata.planes import PlaneSet, check_plane_set, dequantize_planes, split_planes

# what the plane GEMM decodes (bundles with a plane layout), any mix over the matrices
KERNEL_FORMATS = tuple(n for n, t in TRAITS.items() if t.PLANE_PACK)
REGISTERS_PER_SM = 65536   # 32-bit registers of an SM's file (sm_80 / sm_90): PlaneTile.occupancy


@dataclass(frozen=True)
class PlaneTile:
    BLOCK_M: int        # sorted rows (one expert's tokens) per tile
    BLOCK_N: int        # output features per tile
    BLOCK_K: int        # reduction step, whole 32-weight runs
    num_warps: int
    num_stages: int     # software-pipeline depth of the K loop (cp.async / TMA stages)
    swap: bool = True   # weights as the MMA's first operand (acc [BN, BM])
    tma: bool = False   # code tiles staged by TMA (device-side tensor descriptors)
    magic: bool = True  # codes to float by a float add on their bits (no int->float convert)
    row_blocks: int = 1  # BLOCK_M-row blocks of one expert a program takes (weights decoded once)
    # programs an SM must hold by registers (ptxas's maxnreg), (gate/up, down); 0: ptxas's choice
    occupancy: tuple[int, int] = (0, 0)

    def __post_init__(self):
        for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise StrataError(f"{name} must be a power of two >= 16 (tl.dot), got {v}")
        if self.BLOCK_K % 32:
            raise StrataError(f"BLOCK_K must hold whole 32-weight runs, got {self.BLOCK_K}")
        if self.row_blocks < 1 or self.row_blocks & (self.row_blocks - 1):
            raise StrataError(f"row_blocks must be a power of two >= 1, got {self.row_blocks}")
        if self.num_warps not in (1, 2, 4, 8, 16) or self.num_stages < 1:
            raise StrataError(f"num_warps must be a power of two <= 16 and num_stages >= 1, "
                              f"got {self.num_warps}, {self.num_stages}")
        if isinstance(self.occupancy, int):          # one count for both GEMMs
            object.__setattr__(self, "occupancy", (self.occupancy, self.occupancy))
        if (not isinstance(self.occupancy, tuple) or len(self.occupancy) != 2
                or not all(isinstance(n, int) for n in self.occupancy) or min(self.occupancy) < 0
                or any(r is not None and r < 24 for r in map(self.max_registers, (0, 1)))):
            raise StrataError(f"occupancy is (gate/up, down), each 0 (ptxas's choice) or a count "
                              f"of programs that leaves each thread 24 registers or more, got "
                              f"{self.occupancy} at {self.num_warps} warps")

    def max_registers(self, mode: int) -> int | None:
        """The registers a thread of GEMM `mode` (0 gate/up, 1 down) may use so that its
        occupancy's programs fit an SM's register file (ptxas allocates in 8s; at most 255),
        None where that occupancy is 0."""
        n = self.occupancy[mode]
        if not n:
            return None
        return min(255, REGISTERS_PER_SM // (n * 32 * self.num_warps) // 8 * 8)

    def with_(self, **kw) -> "PlaneTile":
        return replace(self, **kw)

    @property
    def name(self) -> str:
        return (f"{self.BLOCK_M}x{self.BLOCK_N}x{self.BLOCK_K}/w{self.num_warps}s"
                f"{self.num_stages}{'' if self.swap else '/noswap'}{'/tma' if self.tma else ''}"
                f"{'' if self.magic else '/nomagic'}"
                f"{f'/r{self.row_blocks}' if self.row_blocks > 1 else ''}"
                f"{self._occupancy_name}")

    @property
    def _occupancy_name(self) -> str:
        g, d = self.occupancy
        return "" if g == d == 0 else f"/o{g}" if g == d else f"/o{g}.{d}"

    @classmethod
    def parse(cls, text: str) -> "PlaneTile":
        """'BMxBNxBK/wWsS[/noswap][/tma][/nomagic][/rRB][/oN | /oG.D]', e.g.
        '128x128x64/w8s3/tma' or '32x64x64/w4s4/r2/o3.4' (the `name` form; /oN: N for both GEMMs,
        /oG.D: G for gate/up, D for down)."""
        try:
            dims, ws, *flags = text.split("/")
            bm, bn, bk = (int(v) for v in dims.split("x"))
            w, s = ws[1:].split("s")
            rb = [f for f in flags if f[:1] == "r" and f[1:].isdigit()]
            oc = [f for f in flags if f[:1] == "o" and f[1:].replace(".", "", 1).isdigit()]
            if (not ws.startswith("w") or len(rb) > 1 or len(oc) > 1
                    or set(flags) - {"noswap", "tma", "nomagic", *rb, *oc}):
                raise ValueError
            occ = [int(v) for v in oc[0][1:].split(".")] if oc else [0]
            return cls(bm, bn, bk, int(w), int(s), "noswap" not in flags, "tma" in flags,
                       "nomagic" not in flags, int(rb[0][1:]) if rb else 1,
                       (occ[0], occ[-1]))
        except ValueError:
            raise StrataError(f"a plane tile is BMxBNxBK/wWsS[/noswap][/tma][/nomagic][/rRB]"
                              f"[/oN | /oG.D] (e.g. 128x128x64/w8s3), got {text!r}") from None


# The planner's BLOCK_M -> the tile at that row block, one table a gate/up code format. A tile's
# BLOCK_M may be below its key: the workspace the planner sized (padded_rows at the key) holds the
# padded rows of any smaller block (padded_rows grows with BLOCK_M). row_blocks spans a tile over
# several blocks of one expert, so each weight is decoded once for up to RB·BLOCK_M rows.
# Footprints on sm_90 (tests/kernels/compile_plane.py: triton 3.6 + ptxas, GATE_UP, Q8_0):
# 16x128x64/w4s4 58 KB shared, 179 registers; 32x64x64/w4s4/r2 58 KB, 152 (Q4_0 / Q4_K 46 KB,
# 164 / 155); 64x64x64/w4s4/r2 91 KB, 233; 64x128x64/w8s4 83 KB, 141;
# 128x128x64/w8s4/tma 116 KB, 218; none spills, every wgmma asynchronous. BLOCK_K 128 at 4 warps,
# 64x128x64/w4 and 128x128x128/w8 spill (the two decoded weight tiles sit in registers beside the
# two accumulators), and so does 32x64x64/w4s4/r2's gate/up at 4 programs an SM (128 registers):
# BLOCK_K stays 64, gate/up at 3 programs, down (one matrix, 128 registers unspilled) at 4.
# Chosen on the H200 (kernel_bench, qwen3-30b-a3b, settled, check=False; TFLOP/s of the whole
# feed-forward; experiments/results/kernel_bench_plane_tiles-*): at T 512 the two-block
# 32x64x64/w4s4/r2 beats the one-block 32x64x64/w4s4 for every format (Q8_0 / Q4_0 / Q4_K 63.3 /
# 74.2 / 64.3 against 51.8 / 70.2 / 57.9, 7bc0530); at T 2048 / 8192 64x64x64/w4s4/r2 beats
# 64x128x64/w8s4 and the TMA tile 128x128x64/w8s4 (Q4_0 / Q4_K 176.7 / 130.6 and 262.3 / 214.2
# against 135.8 / 110.3 and 214.6 / 199.4, 7bc0530; Q8_0 178.1 / 255.9 against 172.3 / 243.3,
# 2c5088e). The BLOCK_M 32 tile's occupancy pin /o3.4 (ncu, T 512 GEMMs, gate/up + down,
# ncu_plane-T512-*-6f4a11a: Q4_0 / Q4_K 329 / 376 µs against 346 / 392 unpinned, 378 / 417 at
# /o4, where gate/up spills) holds gate/up at three programs an SM whatever a kernel change makes
# of ptxas's own choice. docs/kernel_notes.md keeps how the table got here.
_TILES = {
    16: PlaneTile(16, 128, 64, 4, 4),
    32: PlaneTile(32, 64, 64, 4, 4, row_blocks=2, occupancy=(3, 4)),
    64: PlaneTile(64, 64, 64, 4, 4, row_blocks=2),
    128: PlaneTile(64, 64, 64, 4, 4, row_blocks=2),
}
PLANE_TILES = {"Q8_0": _TILES, "Q4_0": _TILES, "Q4_K": _TILES}


_PINNED: ContextVar[PlaneTile | None] = ContextVar("strata_plane_tile_pin", default=None)


@contextlib.contextmanager
def pin_plane_tile(tile: PlaneTile):
    """Every plane_ffn call inside the block without a `schedule` runs at `tile` (a ContextVar:
    threads do not see each other's pins); the previous pin is restored on exit."""
    if not isinstance(tile, PlaneTile):
        raise StrataError(f"pin_plane_tile takes a PlaneTile, got {type(tile).__name__}")
    with pinned(_PINNED, tile):
        yield


def plane_matrix(planes: PlaneSet, e: int, name: str) -> torch.Tensor:
    """Expert e's matrix `name` ("gate" | "up" | "down") as fp32 [rows, cols], decoded from its
    planes in torch (a matrix of another format decoded as strata.kernels.moe.ffn does)."""
    off = int(planes.slot_offset[e])
    if off < 0:
        raise StrataError(f"expert {e} is not resident (slot_offset = -1); load it first")
    mat = getattr(planes.layout, name)
    p = getattr(planes.planes, name)
    if p is None:
        return dequantize_matrix(planes, e, name)
    raw = planes.arena[off + mat.offset: off + mat.offset + mat.nbytes]
    return dequantize_planes(raw, p.fmt, p.rows, p.cols)


def plane_tile(n_tokens: int, top_k: int, n_expert: int, fmt: str = "Q8_0") -> PlaneTile:
    """The default table's tile for T tokens, K top-k, E experts and gate/up planes of `fmt`
    (autotune-free, no device). Its key is the fused GEMM's BLOCK_M (strata.kernels.moe.tiles.
    block_m_for: the mean rows per routed expert as a power of two in [16, 128]), the one the
    planner sizes the engine's workspaces by; the tile's own BLOCK_M is at most that, so h of
    padded_rows(T, K, E, key) rows fits."""
    if fmt not in PLANE_TILES:
        raise StrataError(f"plane_tile: no table for {fmt}; the plane GEMM reads "
                          f"{', '.join(KERNEL_FORMATS)}")
    return PLANE_TILES[fmt][block_m_for(n_tokens, top_k, n_expert)]


def _check_planes(experts) -> None:
    check_plane_set(experts, KERNEL_FORMATS, "the plane GEMM", "strata.kernels.moe_ffn")


_ALLOCATOR_SET: list[bool] = []


def _tma_scratch() -> None:
    """Device-side tensor descriptors live in global scratch that Triton asks the allocator for
    (128 bytes a descriptor); set one once per process."""
    if not _ALLOCATOR_SET:
        import triton
        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                     device="cuda"))
        _ALLOCATOR_SET.append(True)


def plane_ffn(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
              experts: PlaneSet, *, schedule=None, scratch_alloc=None, out=None,
              workspace=None, check: bool = True, combine: str = "pass") -> torch.Tensor:
    """The layer's MoE feed-forward on plane-layout Q8_0 / Q4_0 / Q4_K experts -> y bf16 [T, D] (or
    `out` fp32 [T, D] with this call's rows added). See the module docstring and moe_ffn's for the
    arguments; workspace["h"] needs padded_rows(T, K, E, BLOCK_M) rows of the tile used."""
    if combine not in COMBINES:
        raise StrataError(f"combine must be one of {COMBINES}, got {combine!r}")
    _check_planes(experts)
    _check_inputs(x, topk_ids, topk_weights, experts)
    if schedule is not None and not isinstance(schedule, PlaneTile):
        raise StrataError(f"plane_ffn's schedule is a PlaneTile or None, got {schedule!r}")
    lay, pl = experts.layout, experts.planes
    T, D = x.shape
    K = topk_ids.shape[1]
    F, E = lay.d_expert, experts.n_expert
    dev = x.device
    tile = schedule or _PINNED.get() or plane_tile(T, K, E, experts.planes.gate.fmt)
    BM, BN, BK = tile.BLOCK_M, tile.BLOCK_N, tile.BLOCK_K
    if combine == "defer" and (not workspace or workspace.get("yk") is None):
        raise StrataError("combine='defer' keeps the rows between calls in workspace['yk']; "
                          "pass one (fp32, at least [T*K, D])")
    yk = _work(workspace, "yk", (T * K, D), torch.float32, dev)                # [T·K, D]
    last = "layer" if combine == "layer" else None
    if T * K == 0:
        return _combine(yk, T, K, D, topk_ids, out, last)
    if check:   # one sync: validates the ids and the slot table, sizes the grid exactly
        grp = group_blocked(topk_ids, E, BM, slot_offset=experts.slot_offset, skip_negative=True)
        if grp.n_blocks == 0:
            return _combine(yk, T, K, D, topk_ids, out, last)
        room = grp.n_blocks
    else:       # no sync: room for the most blocks any routing makes (the padded rows' bound)
        room = padded_rows(T, K, E, BM) // BM
        grp = group_blocked_bounded(topk_ids, E, BM, room)
    h = _work(workspace, "h", (room * BM, F), torch.bfloat16, dev)            # [Mpad, F]
    tw = topk_weights.reshape(-1).float().contiguous()                        # [T·K]
    x = x.contiguous()
    if tile.tma and dev.type == "cuda" and not INTERPRET:
        _tma_scratch()
    meta = dict(TOPK=K, BM=BM, RB=tile.row_blocks, BN=BN, BK=BK, SWAP=tile.swap, TMA=tile.tma,
                MAGIC=tile.magic, INTERP=INTERPRET)
    if not lay.plain:   # only then: the plain FFN's launches keep their constexpr set
        meta.update(BIAS=lay.bias is not None, ACT=lay.act.code)
    act = (float(lay.act.alpha), float(lay.act.limit))
    for mode, a, n_out, n_in, p1, p2, dst, b1, b2 in (
            (0, x, F, D, pl.gate, pl.up, h, "gate", "up"),
            (1, h, D, F, pl.down, pl.down, yk, "down", "down")):
        boff = ((lay.bias.part(b1)[0], lay.bias.part(b2)[0]) if lay.bias is not None
                else (0, 0))
        grid = (room * -(-n_out // BN),)
        _pk._plane_gemm_kernel[grid](
            (a, a.stride(0), grp.sorted_ids, grp.block_expert, grp.n_assign),
            (experts.arena, experts.slot_offset, p1.codes_offset, p1.scales_offset,
             p2.codes_offset, p2.scales_offset), (dst, dst.stride(0), tw), n_out, n_in,
            grp.n_blocks_dev, grp.padded_offsets, (*boff, *act),
            S=_pk.PlaneSpec(MODE=mode, FMT1=TRAITS[p1.fmt], FMT2=TRAITS[p2.fmt],
                            EVEN=n_out % BN == 0 and n_in % BK == 0, **meta),
            num_warps=tile.num_warps, num_stages=tile.num_stages,
            **({"maxnreg": tile.max_registers(mode)} if tile.occupancy[mode] else {}))
    if combine == "defer":
        return out if out is not None else torch.zeros(T, D, dtype=torch.bfloat16, device=dev)
    mask = combine == "pass" and (grp.n_skipped is None or grp.n_skipped > 0)
    return _combine(yk, T, K, D, topk_ids, out, "mask" if mask else "all")


def plane_ffn_torch(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                    experts: PlaneSet, *, schedule=None, scratch_alloc=None, out=None,
                    workspace=None, check: bool = True, combine: str = "pass") -> torch.Tensor:
    """Plain-torch reference of `plane_ffn` (same signature; schedule/scratch_alloc/workspace/
    check ignored): weights decoded from the planes in torch, every product in fp32, h in fp32,
    y rounded to bf16 once (or added into `out`). Ids of -1 are skipped; every call adds its own
    rows, so a layer's calls sum to the same y whatever `combine` says."""
    _check_planes(experts)
    _check_inputs(x, topk_ids, topk_weights, experts)
    return routed_sum(x, topk_ids, topk_weights, experts, out, matrix=plane_matrix)


def plane_dequantize(planes: torch.Tensor, fmt: str, rows: int, cols: int, *,
                     block=(32, 64), magic: bool = True, fma: bool = True) -> torch.Tensor:
    """fp32 [rows, cols] of one matrix's planes (uint8 [nbytes]) decoded by the GEMM's Triton
    loads and products; `block` = (BN, BK) of the decode tile (BK whole 32-weight runs),
    `magic` PlaneTile.magic. `fma` (the GEMM's form): Q8_0's weights by one fused multiply-add,
    ggml's values except +0 where ggml gives -0; False: ggml's bit for bit."""
    if fmt not in KERNEL_FORMATS:
        raise StrataError(f"plane_dequantize decodes {', '.join(KERNEL_FORMATS)}, got {fmt}")
    codes, scales = split_planes(planes, fmt, rows, cols)
    out = torch.full((rows, cols), float("nan"), dtype=torch.float32, device=planes.device)
    bn, bk = block
    _pk._plane_dequant_kernel[(-(-rows // bn), -(-cols // bk))](
        codes, scales, out, rows, cols, BN=bn, BK=bk, FMT=TRAITS[fmt], MAGIC=magic, FMA=fma,
        INTERP=INTERPRET)
    return out


def plane_dequantize_torch(planes: torch.Tensor, fmt: str, rows: int, cols: int, *,
                           block=(32, 64), magic: bool = True,
                           fma: bool = True) -> torch.Tensor:
    """Plain-torch reference of `plane_dequantize` (same signature; `block` ignored): ggml's
    values, with -0 made +0 where plane_dequantize's fused form gives +0 (Q8_0, magic and fma)."""
    out = dequantize_planes(planes, fmt, rows, cols)
    return out + 0.0 if fmt == "Q8_0" and magic and fma else out
