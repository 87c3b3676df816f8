"""The attention kernel's tile choice: a deterministic heuristic returning a frozen dataclass,
pinnable like the expert GEMM's (`strata.kernels.moe.tiles.pin_tile`).

Legend: T chunk tokens, G = H / Hkv query heads per kv head, hd head width.

A program owns BLOCK_M rows of the (token, query head of one kv head) grid: row r is token r // G,
head r % G, so one K/V tile load serves all G heads of its kv head (GQA's main saving: Qwen3-30B's
G = 8 reads each K/V byte once per 128 rows instead of once per 16). It walks the keys BLOCK_N at a
time.

Reasoning behind the constants (to be revisited with experiments/attention_bench.py's sweep):
- BLOCK_M = 128 (64 at hd = 256): the fp32 accumulator [BM, hd] is 64 registers a thread at 8
  warps, q [BM, hd] bf16 another 32, the score tile [BM, BN] fp32 32: inside 255 without spills.
  Fewer rows than that (a short chunk) round up to a power of two >= 16 (tl.dot's minimum).
- BLOCK_N = 64: a K and a V tile of [64, 128] bf16 are 32 KiB a stage; 3 stages + q (32 KiB) are
  128 KiB of the H200's 227 KiB shared memory (int8 tiles are half that, plus the bf16 copies
  the tensor cores read). 128 would double the score tile's registers.
- num_warps = 8 when BM·hd >= 128·64 (two warpgroups share the accumulator), else 4.
- hd = 256 (seed-512e): BM 64, BN 32, 2 stages.
- int8 = "dequant" (default): int8 segments are dequantized to bf16 K/V in the scratch
  (strata.kernels.attention.expand) and read by the bf16 kernel itself; "expand": exact bf16
  codes, the scales on the scores/probabilities in the kernel (0.64-0.72 of the bf16 rate over a
  long prefix on the H200, e923e68); "kernel" converts each int8 tile inside the attention loop
  (0.52-0.57 of bf16). experiments/attention_bench.py times all three.
Footprint on sm_90 (tests/kernels/compile_attention.py: triton 3.6 passes + ptxas -v, no GPU;
commit 1cd5c73 and after): hd 128 128x64/w8s3: 128 KiB shared; 211 registers a thread for bf16
segments, 255 for int8 (the int8 -> bf16 conversion), no spills (BN 128 spills 2 KB with int8;
BN 32 is 192 registers). hd 64 128x64/w8s3: int8 230 registers (4 warps spilled 16 B). hd 256
64x32/w8s2: 96 KiB, bf16 184 registers; int8 still spills ~100 B (64x64 spilled 20-400 B).
Expanded int8 codes (bf16 tiles + the scale vectors; commit 7482e6f): hd 128 128x64/w8s3 255
registers with 12 B spilled (the state-storing first piece 240, no spill); 128x64/w8s4 255 and
128x32/w8s3 196, neither spills; 128x64/w8s2 spills 200 B, 128x128 2 KB. The scale vectors, not
the conversion, are what the scaled path adds over bf16's 211; `attention_bench.py --sweep`
times these tiles on the GPU for both int8 paths.
"""
from __future__ import annotations

import contextlib
from contextvars import ContextVar
from dataclasses import dataclass, replace

from strata.errors import StrataError
from strata.kernels.pins import pinned


INT8_PATHS = ("dequant", "expand", "kernel")


@dataclass(frozen=True)
class AttnTile:
    BLOCK_M: int      # rows (token, head) per program
    BLOCK_N: int      # keys per step
    num_warps: int
    num_stages: int
    int8: str = "dequant"  # int8 segments: dequantized to bf16 first (the bf16 kernel), expanded
    #                        to exact bf16 codes (scales in the kernel), or converted per tile

    def __post_init__(self):
        for name in ("BLOCK_M", "BLOCK_N"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise StrataError(f"{name} must be a power of two >= 16 (tl.dot), got {v}")
        if self.num_warps not in (1, 2, 4, 8, 16) or self.num_stages < 1:
            raise StrataError(f"num_warps must be a power of two <= 16 and num_stages >= 1, "
                              f"got {self.num_warps}, {self.num_stages}")
        if self.int8 not in INT8_PATHS:
            raise StrataError(f"int8 must be one of {INT8_PATHS}, got {self.int8!r}")

    def with_(self, **kw) -> "AttnTile":
        return replace(self, **kw)


@dataclass(frozen=True)
class AttnProblem:
    """What the heuristic sees: sizes only (no data, no device sync)."""
    n_rows: int      # T·G
    head_dim: int    # hd


def _pow2_at_least(n: int, lo: int, hi: int) -> int:
    v = lo
    while v < n and v < hi:
        v *= 2
    return v


def choose_attn_tile(p: AttnProblem) -> AttnTile:
    bm_max = 64 if p.head_dim >= 256 else 128
    bm = _pow2_at_least(p.n_rows, 16, bm_max)
    warps = 8 if bm * p.head_dim >= 128 * 64 else 4
    bn = 32 if p.head_dim >= 256 else 64
    return AttnTile(bm, bn, warps, 3 if p.head_dim <= 128 else 2)


_PINNED: ContextVar[tuple | None] = ContextVar("strata_attn_tile_pin", default=None)


@contextlib.contextmanager
def pin_attn_tile(tile: AttnTile | None = None, **overrides):
    """Force the attention tile inside the block: a whole AttnTile, or field overrides (e.g.
    `pin_attn_tile(BLOCK_N=16)`) on top of the heuristic's choice. Restored on exit, also on
    error (a ContextVar: threads do not see each other's pins)."""
    if tile is not None and not isinstance(tile, AttnTile):
        raise StrataError(f"pin_attn_tile takes an AttnTile, got {type(tile).__name__}")
    with pinned(_PINNED, (tile, overrides)):
        yield


def resolve_attn_tile(p: AttnProblem, tile: AttnTile | None = None) -> AttnTile:
    """The tile of one launch: an explicit `tile` wins, then a pin, then the heuristic."""
    return tile if tile is not None else _pinned_over(_PINNED, choose_attn_tile(p))


def _pinned_over(var: ContextVar, cfg: AttnTile) -> AttnTile:
    """cfg under the pin `var` holds: its whole tile, or its fields over cfg."""
    pin = var.get()
    if pin is None:
        return cfg
    ptile, over = pin
    return (ptile or cfg).with_(**over) if over else (ptile or cfg)


# -- MLA's block kernel (strata.kernels.attention.mla_block) ------------------------------------
def choose_mla_tile(n: int, hd: int, dv: int) -> AttnTile:
    """A program's BM queries of one head against BN keys a step (int8 unused: bf16 only).
    BM 128 (fewer queries: the next power of two >= 16), BN 64, 8 warps at BM 128 (the fp32
    accumulator [128, 128] is 64 registers a thread, the score tile 32), 3 stages: q [128, 192]
    bf16 48 KiB plus a K [64, 192] and a V [64, 128] tile, 40 KiB a stage, at DeepSeek-V3's
    widths. On sm_90 (tests/kernels/compile_mla.py: triton 3.6 + ptxas -v, no GPU) 128x64/w8s3
    declares 168 KiB and uses 162-189 registers, no spills, wgmma; s2 128 KiB, 178-202: either
    holds one program an SM, so the third stage costs no occupancy. 128x32/w8s2 146-156
    registers; 128x128/w8s2 spills 48-72 B in the masked launches. Unmeasured on the GPU:
    pin_mla_tile is the A/B's handle. A short block (BM < 128) at 192 / 128: 64x64/w8s3 128-150
    registers (4 warps spill 20 B), 32x32/w4s3 128, 16x32/w4s3 80 (16x64/w4 251-255)."""
    bm = _pow2_at_least(n, 16, 128)
    return AttnTile(bm, 64 if bm >= 64 else 32, 8 if bm * max(hd, dv) >= 64 * 128 else 4, 3)


_MLA_PINNED: ContextVar[tuple | None] = ContextVar("strata_mla_tile_pin", default=None)


@contextlib.contextmanager
def pin_mla_tile(tile: AttnTile | None = None, **overrides):
    """pin_attn_tile's meaning for MLA's block kernel."""
    if tile is not None and not isinstance(tile, AttnTile):
        raise StrataError(f"pin_mla_tile takes an AttnTile, got {type(tile).__name__}")
    with pinned(_MLA_PINNED, (tile, overrides)):
        yield


def resolve_mla_tile(n: int, hd: int, dv: int, tile: AttnTile | None = None) -> AttnTile:
    """The tile of one MLA block launch: an explicit `tile`, then a pin, then the heuristic."""
    return tile if tile is not None else _pinned_over(_MLA_PINNED, choose_mla_tile(n, hd, dv))
