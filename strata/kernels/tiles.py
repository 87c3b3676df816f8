"""The expert GEMM's tile choice: a deterministic heuristic returning a frozen dataclass.

Legend: T tokens, K top-k, E experts, D hidden, F expert width, P programs (stream-k grid).

`choose_tile(problem)` is a pure function of the problem (no timing, no global state), so two runs
pick the same tile. Tests and researchers override it with `pin_tile(...)`, a context manager that
restores the previous choice on exit (a ContextVar, so threads do not see each other's pins).

Reasoning behind the constants (to be revisited with the GPU sweep in experiments/kernel_bench.py):
- BLOCK_M follows the mean rows per active expert (T·K / min(E, T·K)): a block much taller than an
  expert's row count multiplies padding work, one much shorter re-reads the expert's weights more
  often. 16 is tl.dot's minimum; 128 the largest that keeps two fp32 accumulators (gate and up) in
  registers with 8 warps.
- BLOCK_N = 128 when the block is tall (>= 64 rows), else 64: a [BN, BK] weight tile is reused
  over BM rows, so narrow M wants narrow N to keep more programs. Decoded formats take BN = 64
  (4 warps) at every BM: H200, swap_fast_pf_w16 dot (experiments/results/decoded_dot_ab.csv,
  commit 8b645ce): Qwen3-30B-A3B Q8_0 T=2048 128x64 52.9 TFLOP/s vs 128x128/w8 49.6; seed-512e
  Q8_0 T=2048 64x64 48.9 vs 64x128 30.6 (decode work per tile, not the MMA, bounds them).
- BLOCK_K = 64: whole Q8_0/Q4_0 blocks (32) per step and a quarter of a K-quant super-block.
- Stream-k when the data-parallel grid leaves a partial last wave that wastes >= 1/4 of a wave and
  there are fewer than 4 waves (past that the tail is a small share of the run); P = SM count.
"""
from __future__ import annotations

import contextlib
from contextvars import ContextVar
from dataclasses import dataclass, replace

import torch

from strata.errors import StrataError

SCHEDULES = ("dp", "stream_k")


@dataclass(frozen=True)
class TileConfig:
    BLOCK_M: int
    BLOCK_N: int
    BLOCK_K: int
    num_warps: int
    num_stages: int
    schedule: str      # "dp" | "stream_k"
    programs: int      # stream-k grid size P (ignored by "dp")

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise StrataError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise StrataError(f"{name} must be a power of two >= 16 (tl.dot), got {v}")
        if self.programs < 1:
            raise StrataError(f"programs must be >= 1, got {self.programs}")

    def with_(self, **kw) -> "TileConfig":
        return replace(self, **kw)


@dataclass(frozen=True)
class GemmProblem:
    """What the heuristic sees: sizes only (no data), so the choice needs no device sync."""
    n_tokens: int   # T
    top_k: int      # K
    n_expert: int   # E
    d_model: int    # D
    d_expert: int   # F
    n_sms: int      # streaming multiprocessors (or a small number in the interpreter)
    decoded: bool = False  # any of gate/up/down in a block format (not BF16)


def device_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # the interpreter runs programs one after another; 4 exercises stream-k splits


BLOCK_M_MAX = 128   # the tallest row block the heuristic picks (the layout pads h for it)


def _pow2_at_least(n: int, lo: int, hi: int) -> int:
    v = lo
    while v < n and v < hi:
        v *= 2
    return v


def expected_tiles(p: GemmProblem, bm: int, bn: int, n_out: int) -> int:
    """Tiles of one GEMM assuming assignments spread evenly over min(E, T·K) experts."""
    rows = p.n_tokens * p.top_k
    active = max(1, min(p.n_expert, rows))
    per = -(-rows // active)
    return active * -(-per // bm) * -(-n_out // bn)


def block_m_for(n_tokens: int, top_k: int, n_expert: int) -> int:
    """The heuristic's BLOCK_M: mean rows per active expert, as a power of two in [16, 128]."""
    rows = n_tokens * top_k
    active = max(1, min(n_expert, rows))
    return _pow2_at_least(-(-rows // active), 16, BLOCK_M_MAX)


def choose_tile(p: GemmProblem) -> TileConfig:
    bm = block_m_for(p.n_tokens, p.top_k, p.n_expert)
    bn = 64 if bm < 64 or p.decoded else 128
    warps = 8 if bm * bn >= 128 * 128 else 4
    # the larger of the two GEMMs (gate/up over F outputs, down over D outputs) decides the schedule
    tiles = max(expected_tiles(p, bm, bn, p.d_expert), expected_tiles(p, bm, bn, p.d_model))
    waves, tail = divmod(tiles, p.n_sms)
    sk = 0 < tail <= 3 * p.n_sms // 4 and waves < 4
    return TileConfig(bm, bn, 64, warps, 3, "stream_k" if sk else "dp", p.n_sms)


_PINNED: ContextVar[tuple | None] = ContextVar("strata_tile_pin", default=None)


@contextlib.contextmanager
def pin_tile(cfg: TileConfig | None = None, **overrides):
    """Force the tile choice inside the block: a whole TileConfig, or field overrides
    (e.g. `pin_tile(schedule="stream_k", programs=3)`) applied on top of the heuristic's choice.
    The previous pin is restored on exit, also on error."""
    if cfg is not None and not isinstance(cfg, TileConfig):
        raise StrataError(f"pin_tile takes a TileConfig, got {type(cfg).__name__}")
    token = _PINNED.set(("cfg", cfg, overrides))
    try:
        yield
    finally:
        _PINNED.reset(token)


def resolve_tile(p: GemmProblem, schedule=None) -> TileConfig:
    """The tile for one launch: a TileConfig `schedule` wins, then a pin, then the heuristic;
    a string `schedule` ("dp" / "stream_k") forces only the schedule."""
    if isinstance(schedule, TileConfig):
        return schedule
    pin = _PINNED.get()
    cfg = choose_tile(p)
    if pin is not None:
        _, pcfg, over = pin
        cfg = (pcfg or cfg).with_(**over) if over else (pcfg or cfg)
    if schedule is not None:
        if schedule not in SCHEDULES:
            raise StrataError(f"schedule must be None, a TileConfig or one of {SCHEDULES}; "
                              f"got {schedule!r}")
        cfg = cfg.with_(schedule=schedule)
    return cfg
