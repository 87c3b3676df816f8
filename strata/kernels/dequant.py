"""Whole-matrix dequantize on the device: the baseline "decode, then cuBLAS" path.

    Y = decode(raw, fmt)      raw uint8 [..., R] -> Y out_dtype [..., R / block_bytes * block]

`dequantize` is a Triton launcher over `decode_tile`; `dequantize_torch` (same signature) is the
reference, `strata.formats.dequantize` cast to `out_dtype`. fp32 results are bit-exact; bf16/fp16
results are the fp32 values rounded to nearest even, exactly as torch's cast does.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from strata._backend import INTERPRET
from strata.errors import StrataError
from strata.formats import dequantize as formats_dequantize
from strata.formats import get_format
from strata.formats.table import Format
from strata.formats.tables import device_table
from strata.kernels._dequant_kernel import _dequant_kernel
from strata.kernels.decode import TRITON_FORMATS, format_traits, pair_words_fit

# out dtype -> the kernel's OUT code (0 fp32, 1 bf16, 2 fp16)
OUT_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


@dataclass(frozen=True)
class DequantTiles:
    """Tile of one program: BN rows x BK weights; runs: decode through decode_tile_runs (scales
    once per run of 32 weights) instead of decode_tile (scales per weight); words: Q8_0/Q4_0 read
    as aligned int32 words a pair of blocks at a time (decode.pair_tile) where the rows allow it
    (a multiple of 4 bytes, K of 64, BK of 64), else as runs."""
    bn: int
    bk: int
    num_warps: int = 4
    runs: bool = False
    words: bool = False


# One program's tile: TILE_WEIGHTS weights, at most BK_MAX along the row (two 256-weight blocks).
# Not a sweep: benchmarks/dequant_bench.py measures each decoder against the device copy rate.
TILE_WEIGHTS = 4096
BK_MAX = 512


def dequant_tiles(fmt: Format, n: int, k: int) -> DequantTiles:
    """TILE_WEIGHTS weights per program, up to BK_MAX along the row, per-weight decode (Q8_0:
    aligned words)."""
    bk = min(BK_MAX, triton.next_power_of_2(k))
    # Q8_0 as aligned words: 1881 GB/s against 1547 (runs) and 1055 (per weight) on the H200,
    # benchmarks/results/dequant-nvidia-h200-51bf383.csv; Q4_0's words were slower (969 vs 1118)
    return DequantTiles(bn=max(1, TILE_WEIGHTS // bk), bk=bk, words=fmt.name == "Q8_0")


def _check(raw, qtype, out_dtype) -> tuple[Format, torch.Tensor]:
    fmt = get_format(qtype)
    if not isinstance(raw, torch.Tensor) or raw.dtype != torch.uint8:
        got = raw.dtype if isinstance(raw, torch.Tensor) else type(raw).__name__
        raise StrataError(f"dequantize takes a uint8 torch tensor of ggml blocks, got {got}")
    if fmt.name not in TRITON_FORMATS:
        raise StrataError(f"no Triton decoder for {fmt.name}; strata.kernels.dequantize reads "
                          f"{', '.join(TRITON_FORMATS)}")
    if out_dtype not in OUT_DTYPES:
        raise StrataError(f"out_dtype must be one of {', '.join(map(str, OUT_DTYPES))}, "
                          f"got {out_dtype}")
    if raw.dim() == 0 or raw.shape[-1] % fmt.block_bytes:
        nbytes = raw.shape[-1] if raw.dim() else 0
        raise StrataError(f"{fmt.name} rows are whole {fmt.block_bytes}-byte blocks, but the last "
                          f"dimension holds {nbytes} bytes; pass the raw bytes of whole rows")
    return fmt, raw


def dequantize(raw: torch.Tensor, qtype, out_dtype: torch.dtype = torch.float32, *,
               tiles: DequantTiles | None = None) -> torch.Tensor:
    """Decode ggml blocks raw [..., R] (uint8, any device Triton runs on) to out_dtype [..., K].
    `tiles` pins the launch (default: dequant_tiles)."""
    fmt, raw = _check(raw, qtype, out_dtype)
    row_bytes = raw.shape[-1]
    k = row_bytes // fmt.block_bytes * fmt.block
    lead = raw.shape[:-1]
    raw = raw.contiguous().reshape(-1, row_bytes)
    n = raw.shape[0]
    out = torch.empty((n, k), dtype=out_dtype, device=raw.device)
    if n == 0 or k == 0:
        return out.reshape(*lead, k)
    if fmt.block_bytes % 2 == 0 and raw.data_ptr() % 2:
        # fp16 fields are read as aligned 16-bit words (see strata.kernels.decode)
        raise StrataError(f"{fmt.name} blocks must start at an even address; pass a tensor "
                          f"whose storage starts at the matrix (e.g. raw.clone())")
    t = tiles or dequant_tiles(fmt, n, k)
    if t.words and not (t.bk % 64 == 0
                        and pair_words_fit(fmt.name, k, row_bytes, raw.data_ptr())):
        t = DequantTiles(t.bn, t.bk, t.num_warps, runs=True)    # not word-aligned: runs
    if t.runs and (t.bk < 32 or fmt.block == 1):
        t = DequantTiles(t.bn, t.bk, t.num_warps, runs=False)  # plain formats / tiny K: per weight
    grid = (triton.cdiv(n, t.bn), triton.cdiv(k, t.bk))
    _dequant_kernel[grid](raw, out, device_table("iq", raw.device), n, k, row_bytes,
                          format_traits(fmt), OUT_DTYPES[out_dtype], INTERPRET, t.bn, t.bk, t.runs,
                          t.words, num_warps=t.num_warps)
    return out.reshape(*lead, k)


def dequantize_torch(raw: torch.Tensor, qtype, out_dtype: torch.dtype = torch.float32, *,
                     tiles: DequantTiles | None = None) -> torch.Tensor:
    """Reference for `dequantize`: the torch decoder, then a round-to-nearest-even cast (`tiles`
    is accepted for the same signature and has no effect)."""
    fmt, raw = _check(raw, qtype, out_dtype)
    return formats_dequantize(raw, fmt).to(out_dtype)
