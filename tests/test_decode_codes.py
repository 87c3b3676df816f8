"""The split decode helpers (codes and run scales) against the torch references, bit for bit.

`decode_codes` x `decode_run_scale` (every SCALED_CODE_FORMATS format) and `codes_from_bytes`
(`load_code_bytes`) x `decode_run_scale` (Q8_0 / Q4_0, byte and 16-bit loads) must give the
dequantized weights exactly, and every code must be exact in bf16 (the expert GEMM feeds them to
the tensor cores as bf16 and scales each run's partial sum). A tiny test-only kernel decodes one
run of BN rows per program; row counts that are not a multiple of BN exercise the masks.
"""
import pytest
import torch
import triton
import triton.language as tl

from strata.formats import dequantize, get_format
from strata.kernels.decode import (FAST_CODE_FORMATS, SCALED_CODE_FORMATS, code_run,
                                   codes_from_bytes, decode_codes, decode_run_scale,
                                   format_traits, load_code_bytes)
from blocks import assert_decoded_equal, code_sweep_blocks, random_matrix

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # e8m0 255


@triton.jit
def _codes_kernel(w_ptr, val_ptr, code_ptr, N, K, row_bytes, FMT: tl.constexpr,
                  BN: tl.constexpr, RUN: tl.constexpr, MODE: tl.constexpr):
    """Run program_id(1) of rows [program_id(0) * BN, +BN): val = scale * code, code = code.
    MODE 0: decode_codes; 1: load_code_bytes + codes_from_bytes; 2: the same, 16-bit loads;
    3, 4: 1, 2 with MAGIC (codes to float through their bits)."""
    offs_n = tl.program_id(0) * BN + tl.arange(0, BN)
    k_run = tl.program_id(1) * RUN
    n_mask = offs_n < N
    s = decode_run_scale(FMT, w_ptr, row_bytes, offs_n, k_run, n_mask)           # [BN]
    if MODE == 0:
        offs_k = k_run + tl.arange(0, RUN)
        c = decode_codes(FMT, w_ptr, row_bytes, offs_n, offs_k, n_mask[:, None])
        o = offs_n.to(tl.int64)[:, None] * K + offs_k[None, :]
        tl.store(val_ptr + o, s[:, None] * c, mask=n_mask[:, None])
        tl.store(code_ptr + o, c, mask=n_mask[:, None])
    else:
        WIDE: tl.constexpr = (MODE == 2) | (MODE == 4)
        lo, hi = load_code_bytes(FMT, w_ptr, row_bytes, offs_n, k_run, n_mask, WIDE)
        c_lo, c_hi = codes_from_bytes(FMT, lo, hi, WIDE, MODE >= 3)              # [BN, 16]
        o = offs_n.to(tl.int64)[:, None] * K + k_run + tl.arange(0, 16)[None, :]
        tl.store(val_ptr + o, s[:, None] * c_lo, mask=n_mask[:, None])
        tl.store(val_ptr + o + 16, s[:, None] * c_hi, mask=n_mask[:, None])
        tl.store(code_ptr + o, c_lo, mask=n_mask[:, None])
        tl.store(code_ptr + o + 16, c_hi, mask=n_mask[:, None])


def decode_split(raw: torch.Tensor, name: str, k: int, mode: int = 0, bn: int = 4):
    """(values, codes) fp32 [N, k] of the [N, k] matrix raw [N, row_bytes] via the split helpers."""
    fmt = get_format(name)
    n = raw.shape[0]
    run = code_run(name)
    val = torch.empty((n, k), dtype=torch.float32, device=raw.device)
    code = torch.empty((n, k), dtype=torch.float32, device=raw.device)
    _codes_kernel[(triton.cdiv(n, bn), k // run)](raw, val, code, n, k, fmt.row_bytes(k),
                                                   format_traits(fmt), bn, run, mode)
    return val, code


def _check(raw, name, k, mode, bn=4):
    val, code = decode_split(raw, name, k, mode, bn)
    assert_decoded_equal(val, dequantize(raw.cpu(), get_format(name)).to(raw.device), name)
    assert torch.equal(code.bfloat16().float(), code), f"{name}: a code is not exact in bf16"


CASES = [(n, 0) for n in SCALED_CODE_FORMATS] + [(n, m) for n in FAST_CODE_FORMATS
                                                  for m in (1, 2, 3, 4)]
IDS = [f"{n}-{['codes', 'bytes', 'bytes16', 'bytes-magic', 'bytes16-magic'][m]}"
       for n, m in CASES]


@pytest.mark.parametrize("name,mode", CASES, ids=IDS)
def test_split_decode_matches_reference(name, mode):
    # 5 rows (not a multiple of BN = 4: the second row block is masked), 3 runs
    k = 3 * code_run(name)
    raw = random_matrix(get_format(name), 5, k, seed=len(name) + mode)
    _check(raw, name, k, mode)


@pytest.mark.parametrize("name,mode", CASES, ids=IDS)
def test_split_decode_every_code_under_edge_scales(name, mode):
    # tests/blocks.code_sweep_blocks: every code value under every edge scale (-0, subnormals)
    fmt = get_format(name)
    raw = code_sweep_blocks(fmt).reshape(-1, fmt.block_bytes)
    _check(raw, name, fmt.block, mode, bn=64)


@pytest.mark.gpu
@pytest.mark.parametrize("name,mode", CASES, ids=IDS)
def test_split_decode_gpu(name, mode):
    fmt = get_format(name)
    raw = random_matrix(fmt, 300, 4096, seed=3).cuda()
    _check(raw, name, 4096, mode, bn=64)
    sweep = code_sweep_blocks(fmt).reshape(-1, fmt.block_bytes).cuda()
    _check(sweep, name, fmt.block, mode, bn=64)
