"""Triton decode helpers (strata.kernels.decode) against the torch references, bit for bit.

A tiny test-only kernel decodes a window of an [N, K] matrix tile by tile through `decode_tile`;
tiles smaller and larger than a block, windows starting mid-block and odd row counts exercise the
element addressing and the masks. On the CPU it runs in the interpreter; `gpu` tests compile it.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from strata.formats import dequantize, get_format
from strata.formats.tables import device_table
from strata.kernels.decode import TRITON_FORMATS, decode_tile, decode_tile_runs, format_traits
from blocks import assert_decoded_equal, code_sweep_blocks, random_matrix

DECODED = list(TRITON_FORMATS)


@triton.jit
def _decode_window_kernel(w_ptr, out_ptr, tab_ptr, N, K, row_bytes, row0, k0,
                          FMT: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                          RUNS: tl.constexpr):
    """out[n - row0, k - k0] = W[n, k] for n in [row0, N), k in [k0, K); RUNS: decode_tile_runs."""
    offs_n = row0 + tl.program_id(0) * BN + tl.arange(0, BN)             # [BN]
    offs_k = k0 + tl.program_id(1) * BK + tl.arange(0, BK)               # [BK]
    mask = (offs_n < N)[:, None] & (offs_k < K)[None, :]                 # [BN, BK]
    if RUNS:
        v = decode_tile_runs(FMT, w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr)
    else:
        v = decode_tile(FMT, w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr)
    o = (offs_n - row0).to(tl.int64)[:, None] * (K - k0) + (offs_k - k0)[None, :]
    tl.store(out_ptr + o, v, mask=mask)


def decode_window(raw: torch.Tensor, qtype, k: int, bn: int = 4, bk: int = 16,
                  row0: int = 0, k0: int = 0, runs: bool = False) -> torch.Tensor:
    """fp32 [N - row0, k - k0]: the decoded window of the [N, k] matrix `raw` [N, row_bytes]."""
    fmt = get_format(qtype)
    n = raw.shape[0]
    out = torch.empty((n - row0, k - k0), dtype=torch.float32, device=raw.device)
    grid = (triton.cdiv(n - row0, bn), triton.cdiv(k - k0, bk))
    _decode_window_kernel[grid](raw, out, device_table("iq", raw.device), n, k,
                                fmt.row_bytes(k), row0, k0, format_traits(fmt), bn, bk, runs)
    return out


def _small_k(fmt) -> int:
    # three small blocks (48 plain weights) or one 256-block: never a multiple of BK = 64
    return 48 if fmt.block == 1 else (3 * fmt.block if fmt.block <= 64 else fmt.block)


pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # e8m0 255


@pytest.mark.parametrize("tile", [(4, 16), (2, 64), (8, 32)], ids=lambda t: f"BN{t[0]}-BK{t[1]}")
@pytest.mark.parametrize("name", DECODED)
def test_decode_tile_matches_reference(name, tile):
    fmt = get_format(name)
    n, k = 5, _small_k(fmt)
    raw = random_matrix(fmt, n, k, seed=sum(tile))
    assert_decoded_equal(decode_window(raw, fmt, k, *tile), dequantize(raw, fmt), name)


@pytest.mark.parametrize("tile", [(2, 64), (8, 32), (4, 256)], ids=lambda t: f"BN{t[0]}-BK{t[1]}")
@pytest.mark.parametrize("name", DECODED)
def test_decode_tile_runs_matches_reference(name, tile):
    # scales once per (row, run): same bits as the per-weight path; rows past N masked
    fmt = get_format(name)
    n, k = 5, _small_k(fmt) if fmt.block > 1 else 64
    raw = random_matrix(fmt, n, k, seed=sum(tile) + 1)
    got = decode_window(raw, fmt, k, *tile, runs=True)
    assert_decoded_equal(got, dequantize(raw, fmt), name)
    assert_decoded_equal(got, decode_window(raw, fmt, k, *tile), name)


@pytest.mark.parametrize("name", DECODED)
def test_decode_window_starting_mid_block(name):
    # row0 = 2, k0 = 7: tiles straddle block edges at arbitrary lanes
    fmt = get_format(name)
    n, k = 7, _small_k(fmt)
    raw = random_matrix(fmt, n, k, seed=11)
    got = decode_window(raw, fmt, k, 4, 32, row0=2, k0=7)
    assert_decoded_equal(got, dequantize(raw, fmt)[2:, 7:], name)


@pytest.mark.parametrize("name", DECODED)
def test_decode_every_code_under_edge_scales(name):
    # the exhaustive block sets of test_formats, one block per row (plain: 256 x 256 patterns)
    fmt = get_format(name)
    blocks = code_sweep_blocks(fmt)
    k = 256 if fmt.block == 1 else fmt.block
    raw = blocks.reshape(-1, fmt.row_bytes(k))
    want = dequantize(raw, fmt)
    for runs in (False, True):
        got = decode_window(raw, fmt, k, 64, 64 if fmt.block < 256 else 256, runs=runs)
        assert_decoded_equal(got, want, name)


def test_decoders_compile_for_h200():
    """Every decoder compiles for sm_90 with triton's own ptxas (no GPU needed), in a process
    without the interpreter. A type error the interpreter forgives shows up here."""
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=f"{root}{os.pathsep}{root / 'tests'}")
    r = subprocess.run([sys.executable, str(root / "tests" / "compile_decoders.py"), *DECODED],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr


# the big tile's addressing (777 rows, 4096 columns, 64 x 128) on one format of each decoder
# family; test_decode_every_code_gpu runs every format's every code on the device
BIG_TILE_FORMATS = [n for n in ("Q8_0", "Q4_K", "Q6_K", "IQ4_XS", "MXFP4", "IQ2_S", "IQ1_M")
                    if n in DECODED]


@pytest.mark.gpu
@pytest.mark.parametrize("name", BIG_TILE_FORMATS)
def test_decode_tile_gpu_big(name):
    fmt = get_format(name)
    n, k = 777, 4096
    raw = random_matrix(fmt, n, k, seed=1).cuda()
    for runs in (False, True):
        got = decode_window(raw, fmt, k, 64, 128, runs=runs)
        assert_decoded_equal(got.cpu(), dequantize(raw.cpu(), fmt), name)


@pytest.mark.gpu
@pytest.mark.parametrize("name", DECODED)
def test_decode_every_code_gpu(name):
    fmt = get_format(name)
    blocks = code_sweep_blocks(fmt)
    k = 256 if fmt.block == 1 else fmt.block
    raw = blocks.reshape(-1, fmt.row_bytes(k)).cuda()
    for runs in (False, True):
        got = decode_window(raw, fmt, k, 32, 64, runs=runs)
        assert_decoded_equal(got.cpu(), dequantize(raw.cpu(), fmt), name)


@pytest.mark.gpu
def test_decode_addresses_past_2gib():
    # rows * row_bytes > 2**31: only int64 address arithmetic reaches the last rows
    fmt = get_format("Q8_0")
    k = 4096
    rb = fmt.row_bytes(k)
    n = (1 << 31) // rb + 64
    raw = torch.zeros((n, rb), dtype=torch.uint8, device="cuda")
    tail = random_matrix(fmt, 48, k, seed=5).cuda()
    raw[-48:] = tail
    got = decode_window(raw, fmt, k, 16, 128, row0=n - 48)
    assert_decoded_equal(got.cpu(), dequantize(tail.cpu(), fmt), "Q8_0")
