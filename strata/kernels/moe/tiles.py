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

Launch choices are data: a TileConfig also says how decoded weights meet the tensor cores (`dot`,
one of DOT_VARIANTS) and whether Q8_0/Q4_0 rows of whole words (`words`) and word-aligned MXFP4
matrices (`streams`, its program `stream_blocks`) decode through aligned word loads in the
decode-once path, whether
the super-block formats decode there a super-block at a time as int32 words (`superblocks`) and
that program's tile (`superblock_tile`);
experiments A/B them with `pin_tile(dot=...)` / `pin_tile(words=False)` /
`pin_tile(streams=True)` / `pin_tile(superblocks=False)`, never by assigning module globals.

`plan_launch(...) -> LaunchPlan` is the one plan of an expert-GEMM launch, made before anything is
allocated (in the manner of triton_kernels' matmul_ogs): the tile, the grid bound, the workspace
rows (h padded to BLOCK_M per routed expert) and the stream-k fixup scratch. The launcher
(strata.kernels.moe.ffn.moe_ffn) and the engine's scratch reserve (strata.engine.scratch) read it,
and its workspace rows are `padded_rows`, the TKP the prompt layout pads h to; nothing recounts.
"""
from __future__ import annotations

import contextlib
from contextvars import ContextVar
from dataclasses import dataclass, replace

import torch

from strata.errors import StrataError
from strata.kernels.pins import pinned

SCHEDULES = ("dp", "stream_k")

# How decoded weights reach the tensor cores (strata.kernels.moe._ffn_kernel.dot_plan turns a
# name into the kernel's constexprs):
#   "decode":      decode every weight to bf16 (scale * code, rounded), one dot per BK step.
#   "scaled":      scaled-code formats: codes (exact in bf16) into one dot per run, the run's
#                  scale applied to that partial sum (no per-weight multiply or rounding).
#   "scaled_swap": as "scaled", with the dot transposed (codes x activations^T), so the codes
#                  are the MMA's register operand and only the activations go through shared
#                  memory.
#   "swap_fast*":  Q8_0 / Q4_0 (else as scaled_swap): one loop iteration per 32-weight run,
#                  codes in two 16-wide halves straight from their bytes (load_code_bytes);
#                  "_pf": the next run's bytes and scale are loaded before this run's dots
#                  (register double buffering: byte loads cannot take the cp.async pipeline);
#                  "_w16": 16-bit loads of the code bytes; "_magic": codes to float by a
#                  float add on their bits instead of int->float conversions.
# No aligned-word dot: it measured slower than swap_fast_pf_w16_magic on every recorded shape
# (experiments/results/decoded_dot_pair_ab.csv; docs/kernel_notes.md); aligned words serve the
# decode-once path (TileConfig.words).
DOT_VARIANTS = ("decode", "scaled", "scaled_swap", "swap_fast", "swap_fast_pf",
                "swap_fast_pf_w16", "swap_fast_pf_w16_magic")
# The default is the fastest measured on the H200: experiments/results/decoded_dot_ab.csv (every
# variant, several tiles; commit 8b645ce) and decoded_dot_ab_auto.csv (the last three at the
# heuristic's tile; a17746c), where _magic beat plain _w16 on 13 of 18 shapes (e.g. Q4_0 T=512
# 22.3 vs 18.5 TFLOP/s, within ~2% where not).
DEFAULT_DOT = "swap_fast_pf_w16_magic"
# The decode-once path reads Q8_0/Q4_0 rows of whole 4-byte words as aligned int32 words: its
# decode step measured 3x faster so (decode+grouped_mm at T=2048, 40.8 -> 70.7 TFLOP/s; README).
DEFAULT_WORDS = True
# The decode-once path reads the super-block formats (Q4_K, Q5_K, Q6_K, Q2_K, Q3_K, IQ4_XS) a
# super-block at a time as int32 words (strata.kernels.decode.superblocks), a program's tile
# `superblock_tile` = (rows, super-blocks). 32 rows x 2 super-blocks (16K weights, the bytes out
# of the Q8_0 word path's 64 x 64 program x 4): compiled for sm_90 (4 warps), the word-aligned
# formats' runs then store straight from the registers they were decoded in, where 64 rows
# put a shared-memory layout change before every run's store (tests/kernels/compile_moe.py
# prints each variant's shared memory). Not yet timed on the H200: benchmarks/dequant_bench.py
# --mode experts times both paths at several tiles in one run (issue 15).
DEFAULT_SUPERBLOCKS = True
DEFAULT_SUPERBLOCK_TILE = (32, 2)
# The word path's program (`word_tile` = (rows, columns), columns a multiple of 64, one pair of
# Q8_0/Q4_0 blocks): 64 x 128. benchmarks/dequant_bench.py --mode experts --word-tiles on the H200
# (473227a, qwen3's gate, 128 experts): Q8_0 / Q4_0 at 55.7% / 57.2% of the device copy against
# 49.4% / 49.2% at 64 x 64; no tile of ten passed 56% / 61% (the word decode itself, not the
# program's size, is the limit there).
DEFAULT_WORD_TILE = (64, 128)
# The stream path's program (`stream_blocks`: consecutive blocks of the matrix, a power of two):
# MXFP4 (strata.kernels.decode.streams) reads the matrix as one stream of 17-byte blocks as
# aligned words (`streams`). 256 blocks (8192 weights) write the 16 KiB of the word path's
# 64 x 128 program. On by default since its H100 run (b6aff0d, gpu_session.sh mxdecodetests
# mxdecode; experiments/results/dequant-experts-mxfp4-NVIDIA_H100-b6aff0d.*): bit for bit on the
# GPU (7 tests), 2,079 GB/s of bf16 out at gpt-oss's 128 x 2880 x 2880 against the byte path's
# 677 (87% against 28% of the device copy); 64 to 512 blocks all within 0.4%. gpt-oss-120b's
# 4-layer 32K read: expert decode 37.4 -> 11.3 ms.
DEFAULT_STREAMS = True
DEFAULT_STREAM_BLOCKS = 256

# Schedule constants of the heuristic (see the module docstring for each one's reason).
BLOCK_M_MIN = 16        # tl.dot's smallest M
BLOCK_M_MAX = 128       # the tallest row block the heuristic picks (the layout pads h for it)
BLOCK_N_WIDE = 128      # BLOCK_N of BF16 weights when the row block is tall
BLOCK_N_NARROW = 64     # BLOCK_N of short row blocks and of every decoded format (H200 A/B above)
TALL_ROWS = 64          # a row block this tall takes BLOCK_N_WIDE (BF16 weights)
BLOCK_K = 64            # whole Q8_0/Q4_0 blocks per step, a quarter of a K-quant super-block
WARPS_BIG_TILE = 8      # warps of a tile of >= BIG_TILE elements (two fp32 accumulators of it)
WARPS = 4
BIG_TILE = 128 * 128
NUM_STAGES = 3          # software-pipeline depth of the K loop (triton's default for sm_90)
SK_TAIL_MAX = 3 / 4     # stream-k when the last wave is at most this full ...
SK_WAVES_MAX = 4        # ... and the data-parallel grid has fewer than this many full waves
INTERP_SMS = 4          # "SMs" in the interpreter: programs run one by one; 4 exercises splits


@dataclass(frozen=True)
class TileConfig:
    BLOCK_M: int
    BLOCK_N: int
    BLOCK_K: int
    num_warps: int
    num_stages: int
    schedule: str      # "dp" | "stream_k"
    programs: int      # stream-k grid size P (ignored by "dp")
    dot: str = DEFAULT_DOT  # how decoded weights meet the tensor cores (DOT_VARIANTS)
    words: bool = DEFAULT_WORDS  # decode-once path: Q8_0/Q4_0 pairs as words
    streams: bool = DEFAULT_STREAMS  # decode-once path: MXFP4 as one stream of words
    superblocks: bool = DEFAULT_SUPERBLOCKS  # decode-once path: K-quants/IQ4_XS as words
    superblock_tile: tuple = DEFAULT_SUPERBLOCK_TILE  # its program: (rows, super-blocks)
    word_tile: tuple = DEFAULT_WORD_TILE  # the words path's program: (rows, columns)
    stream_blocks: int = DEFAULT_STREAM_BLOCKS  # the MXFP4 stream path's program: blocks

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise StrataError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise StrataError(f"{name} must be a power of two >= 16 (tl.dot), got {v}")
        if self.programs < 1:
            raise StrataError(f"programs must be >= 1, got {self.programs}")
        if self.dot not in DOT_VARIANTS:
            raise StrataError(f"dot must be one of {DOT_VARIANTS}, got {self.dot!r}")
        st = self.superblock_tile
        if (not isinstance(st, tuple) or len(st) != 2 or not all(isinstance(v, int) for v in st)
                or st[0] < 1 or st[0] & (st[0] - 1) or st[1] < 1):
            raise StrataError(f"superblock_tile must be (rows, super-blocks): rows a power of "
                              f"two, super-blocks >= 1; got {st!r}")
        wt = self.word_tile
        if (not isinstance(wt, tuple) or len(wt) != 2 or not all(isinstance(v, int) for v in wt)
                or wt[0] < 1 or wt[0] & (wt[0] - 1) or wt[1] < 64 or wt[1] % 64):
            raise StrataError(f"word_tile must be (rows, columns): rows a power of two, columns "
                              f"a multiple of 64; got {wt!r}")
        sb = self.stream_blocks
        if not isinstance(sb, int) or isinstance(sb, bool) or sb < 16 or sb & (sb - 1):
            raise StrataError(f"stream_blocks must be a power of two >= 16, got {sb!r}")

    def with_(self, **kw) -> "TileConfig":
        return replace(self, **kw)


# a valid config the overrides of pin_tile are checked against (TileConfig's own checks)
_ANY_TILE = TileConfig(BLOCK_M_MIN, 16, 16, WARPS, NUM_STAGES, "dp", 1)


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
    return INTERP_SMS


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
    return _pow2_at_least(-(-rows // active), BLOCK_M_MIN, BLOCK_M_MAX)


def choose_tile(p: GemmProblem) -> TileConfig:
    bm = block_m_for(p.n_tokens, p.top_k, p.n_expert)
    bn = BLOCK_N_NARROW if bm < TALL_ROWS or p.decoded else BLOCK_N_WIDE
    warps = WARPS_BIG_TILE if bm * bn >= BIG_TILE else WARPS
    # the larger of the two GEMMs (gate/up over F outputs, down over D outputs) decides the schedule
    tiles = max(expected_tiles(p, bm, bn, p.d_expert), expected_tiles(p, bm, bn, p.d_model))
    waves, tail = divmod(tiles, p.n_sms)
    sk = 0 < tail <= int(SK_TAIL_MAX * p.n_sms) and waves < SK_WAVES_MAX
    return TileConfig(bm, bn, BLOCK_K, warps, NUM_STAGES, "stream_k" if sk else "dp", p.n_sms)


_PINNED: ContextVar[tuple | None] = ContextVar("strata_tile_pin", default=None)


@contextlib.contextmanager
def pin_tile(cfg: TileConfig | None = None, **overrides):
    """Force the tile choice inside the block: a whole TileConfig, or field overrides
    (e.g. `pin_tile(schedule="stream_k", programs=3)`) applied on top of the heuristic's choice.
    The previous pin is restored on exit, also on error."""
    if cfg is not None and not isinstance(cfg, TileConfig):
        raise StrataError(f"pin_tile takes a TileConfig, got {type(cfg).__name__}")
    if overrides:   # a bad value fails here, not at some later launch
        try:
            replace(cfg or _ANY_TILE, **overrides)
        except TypeError as exc:
            raise StrataError(f"pin_tile: {exc}") from None
    with pinned(_PINNED, ("cfg", cfg, overrides)):
        yield


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


def pinned_choice(name: str):
    """TileConfig field `name` as the active pin sets it (a field override, else the pinned
    TileConfig's), or None without one: for launches that take one choice of the config, not
    a whole tile (the decode-once path's `words`)."""
    pin = _PINNED.get()
    if pin is None:
        return None
    _, pcfg, over = pin
    if name in over:
        return over[name]
    return getattr(pcfg, name) if pcfg is not None else None


def padded_rows(n_tokens: int, top_k: int, n_expert: int, block_m: int) -> int:
    """TKP: rows of h when each of the (at most min(E, T·K)) routed experts' groups of rows is
    padded to a multiple of block_m; an upper bound of n_blocks * block_m for any routing."""
    tk = n_tokens * top_k
    return tk + min(n_expert, tk) * (block_m - 1)


def scratch_nbytes(tile: TileConfig) -> int:
    """Fixup scratch for one stream-k launch: 2 slots per program (its first and its last piece)
    x 2 fp32 accumulators (gate and up) x BLOCK_M x BLOCK_N; the DOWN launch reuses it."""
    if tile.schedule != "stream_k":
        return 0
    return 2 * tile.programs * 2 * tile.BLOCK_M * tile.BLOCK_N * 4


@dataclass(frozen=True)
class LaunchPlan:
    """One expert-GEMM launch (gate/up, then down) over T tokens, planned before allocation.

    h_rows is TKP (padded_rows): the most rows h [h_rows, F] can take for any routing, so a
    workspace of that many rows always fits; max_blocks = h_rows // BLOCK_M bounds the row
    blocks, hence the data-parallel grids (tiles_gate_up / tiles_down of n_blocks)."""
    tile: TileConfig
    n_tokens: int      # T
    top_k: int         # K
    n_expert: int      # E
    d_model: int       # D
    d_expert: int      # F
    decoded: bool      # weights in a block format (the fused decode), not BF16
    h_rows: int        # TKP: workspace rows of h
    yk_rows: int       # T·K: rows of the per-assignment output yk [T·K, D]
    max_blocks: int    # BLOCK_M row blocks at most
    scratch_bytes: int  # stream-k fixup scratch one launch asks for (0 for data-parallel)

    @property
    def stream_k(self) -> bool:
        return self.tile.schedule == "stream_k"

    def tiles_gate_up(self, n_blocks: int) -> int:
        return n_blocks * -(-self.d_expert // self.tile.BLOCK_N)

    def tiles_down(self, n_blocks: int) -> int:
        return n_blocks * -(-self.d_model // self.tile.BLOCK_N)

    def grid(self, n_tiles: int) -> tuple[int]:
        """The GEMM launch's grid: P programs (stream-k) or one program a tile."""
        return (self.tile.programs,) if self.stream_k else (n_tiles,)


def plan_launch(n_tokens: int, top_k: int, n_expert: int, d_model: int, d_expert: int, *,
                decoded: bool, device=None, n_sms: int | None = None,
                schedule=None) -> LaunchPlan:
    """The plan of one expert-GEMM launch: T tokens, K top-k, E experts, D hidden, F expert
    width, `decoded` weights (any of gate/up/down in a block format). The tile is
    resolve_tile's (a TileConfig `schedule`, else the active pin_tile, else the heuristic);
    n_sms defaults to the device's (device_sms)."""
    if n_sms is None:
        n_sms = device_sms(torch.device(device if device is not None else "cpu"))
    p = GemmProblem(n_tokens, top_k, n_expert, d_model, d_expert, n_sms, decoded)
    tile = resolve_tile(p, schedule)
    rows = padded_rows(n_tokens, top_k, n_expert, tile.BLOCK_M)
    return LaunchPlan(tile, n_tokens, top_k, n_expert, d_model, d_expert, decoded, rows,
                      n_tokens * top_k, rows // tile.BLOCK_M, scratch_nbytes(tile))
