"""Triton decode helpers (strata.kernels.decode) against the torch references, bit for bit.

A tiny test-only kernel decodes an [N, K] matrix tile by tile through `decode_tile`; tile shapes
smaller and larger than a block, and odd row counts, exercise the element addressing and masks.
"""
import pytest
import torch
import triton
import triton.language as tl

from strata.formats import dequantize, get_format
from strata.formats.tables import device_table
from strata.kernels.decode import decode_tile
from blocks import random_matrix, same_bits

DECODED = ["BF16", "F16", "Q8_0", "Q4_0", "Q5_0", "IQ4_NL", "Q2_0", "MXFP4", "Q4_K", "Q6_K",
           "IQ3_S"]


@triton.jit
def _decode_matrix_kernel(w_ptr, out_ptr, tab_ptr, N, K, row_bytes, FMT: tl.constexpr,
                          BN: tl.constexpr, BK: tl.constexpr):
    offs_n = tl.program_id(0) * BN + tl.arange(0, BN)                     # [BN]
    offs_k = tl.program_id(1) * BK + tl.arange(0, BK)                     # [BK]
    mask = (offs_n < N)[:, None] & (offs_k < K)[None, :]                  # [BN, BK]
    v = decode_tile(FMT, w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr)
    tl.store(out_ptr + offs_n.to(tl.int64)[:, None] * K + offs_k[None, :], v, mask=mask)


def decode_matrix(raw: torch.Tensor, qtype, k: int, bn: int = 4, bk: int = 16) -> torch.Tensor:
    fmt = get_format(qtype)
    n = raw.shape[0]
    out = torch.empty((n, k), dtype=torch.float32, device=raw.device)
    grid = (triton.cdiv(n, bn), triton.cdiv(k, bk))
    _decode_matrix_kernel[grid](raw, out, device_table("iq3s", raw.device), n, k, fmt.row_bytes(k), fmt.ggml_type, bn, bk)
    return out


@pytest.mark.parametrize("tile", [(4, 16), (2, 64), (8, 32)], ids=lambda t: f"BN{t[0]}-BK{t[1]}")
@pytest.mark.parametrize("name", DECODED)
def test_decode_tile_matches_reference(name, tile):
    fmt = get_format(name)
    # odd row count; K = 3 small blocks (48 plain weights) or one 256-block: not a multiple of BK
    n, k = 5, (3 * fmt.block if fmt.block <= 64 else fmt.block) if fmt.block > 1 else 48
    raw = random_matrix(fmt, n, k, seed=sum(tile))
    got = decode_matrix(raw, fmt, k, *tile)
    assert same_bits(got, dequantize(raw, fmt))


@pytest.mark.gpu
@pytest.mark.parametrize("name", DECODED)
def test_decode_tile_gpu_big(name):
    fmt = get_format(name)
    n, k = 777, 4096
    raw = random_matrix(fmt, n, k, seed=1).cuda()
    got = decode_matrix(raw, fmt, k, 64, 128)
    assert same_bits(got.cpu(), dequantize(raw.cpu(), fmt))
