"""The GEMM's Q8_0/Q4_0 fast path (_decode_32) equals decode_tile bit for bit, masks included."""
import pytest
import torch
import triton
import triton.language as tl

from strata.kernels._moe_kernel import _decode_32
from strata.kernels.decode import decode_tile
from strata.kernels.synth import encode_matrix
from strata.formats import get_format


@triton.jit
def _both_kernel(w_ptr, row_bytes, n_rows, n_cols, k0, out_a, out_b, FMT: tl.constexpr,
                 BN: tl.constexpr, BK: tl.constexpr):
    offs_n = tl.arange(0, BN)
    offs_k = k0 + tl.arange(0, BK)
    mask = (offs_n < n_rows)[:, None] & (offs_k < n_cols)[None, :]
    o = offs_n[:, None] * BK + tl.arange(0, BK)[None, :]
    tl.store(out_a + o, _decode_32(FMT, w_ptr, row_bytes, offs_n, offs_k, mask))
    tl.store(out_b + o, decode_tile(FMT, w_ptr, row_bytes, offs_n, offs_k, mask))


@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_0"])
@pytest.mark.parametrize("k0,cols", [(0, 64), (32, 96), (64, 96)], ids=["k0-full", "k32", "k64-past-end"])
def test_fast_decode_matches_decode_tile(fmt, k0, cols):
    f = get_format(fmt)
    g = torch.Generator().manual_seed(11)
    w = torch.randn(5, cols, generator=g) * torch.logspace(-3, 2, cols)  # many scale magnitudes
    raw = encode_matrix(w, f)
    a = torch.empty(16, 64)
    b = torch.empty(16, 64)
    _both_kernel[(1,)](raw, f.row_bytes(cols), 5, cols, k0, a, b, FMT=f.ggml_type, BN=16, BK=64)
    assert torch.equal(a.view(torch.int32), b.view(torch.int32))
