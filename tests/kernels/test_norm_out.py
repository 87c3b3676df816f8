"""The norms into a given buffer (strata.kernels.norm.rms_norm / rms_norm_torch `out`, the
carve's xn through strata.models.layers.norm_out; qk_norm_rope / its twin into a carve's q or
k): the bits each returns without one, written into a NaN-poisoned view of a larger flat
buffer, by the kernel (Triton's interpreter here) and its twin; a buffer of the wrong shape,
dtype or layout is refused in one line. And the layer's rounded residual add
(strata.models.layers.add_rounded_), which keeps the experts' fp32 output from a [T, D]
rounded copy."""
from __future__ import annotations

import pytest
import torch

from strata.errors import StrataError
from strata.kernels.norm import qk_norm_rope, qk_norm_rope_torch, rms_norm, rms_norm_torch
from strata.models.layers import norm_out, rope_cos_sin


@pytest.mark.parametrize("fn", [rms_norm, rms_norm_torch], ids=["kernel", "twin"])
@pytest.mark.parametrize("dt,wdt", [(torch.bfloat16, torch.bfloat16),
                                    (torch.float32, torch.float32),
                                    (torch.bfloat16, torch.float32)])
def test_into_a_buffer_is_the_same_bits(fn, dt, wdt):
    g = torch.Generator().manual_seed(3)
    T, D = 37, 96
    x, w = torch.randn(T, D, generator=g).to(dt), torch.randn(D, generator=g).to(wdt)
    want = fn(x, w, 1e-6)
    flat = torch.full((T * D + 11,), float("nan"), dtype=want.dtype)
    out = norm_out(flat, x, w)
    assert out is not None and out.data_ptr() == flat.data_ptr()
    got = fn(x, w, 1e-6, out=out)
    assert got.data_ptr() == flat.data_ptr() and torch.equal(got, want)
    assert flat[T * D:].isnan().all()                  # nothing written past its rows


@pytest.mark.parametrize("fn", [rms_norm, rms_norm_torch], ids=["kernel", "twin"])
@pytest.mark.parametrize("N", [96, 6144], ids=["D96", "N6144"])
def test_in_place_over_its_own_input_is_the_same_bits(fn, N):
    """out=x (MiniMax-M2's whole-projection q / k norms over their raw projections,
    strata.models.attention): the kernel holds a row whole (BN >= N) and reads it before
    writing it, so the bits are the copying call's, at a projection's width too."""
    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(9, N, generator=g).bfloat16(), torch.randn(N, generator=g).bfloat16()
    want = fn(x, w, 1e-6)
    got = fn(x, w, 1e-6, out=norm_out(x, x, w))
    assert got.data_ptr() == x.data_ptr() and torch.equal(got, want)


def test_norm_out_passes_over_a_buffer_it_cannot_use():
    x, w = torch.zeros(4, 8, dtype=torch.bfloat16), torch.ones(8, dtype=torch.bfloat16)
    assert norm_out(None, x, w) is None
    assert norm_out(torch.empty(31, dtype=torch.bfloat16), x, w) is None       # too small
    assert norm_out(torch.empty(32), x, w) is None                           # fp32: not x's
    assert norm_out(torch.empty(32), x, w.float()) is not None               # promote(w, x)


@pytest.mark.parametrize("fn", [rms_norm, rms_norm_torch], ids=["kernel", "twin"])
def test_a_wrong_buffer_is_refused_in_one_line(fn):
    x, w = torch.zeros(4, 8, dtype=torch.bfloat16), torch.ones(8, dtype=torch.bfloat16)
    for bad in (torch.empty(4, 7, dtype=torch.bfloat16), torch.empty(4, 8),
                torch.empty(8, 4, dtype=torch.bfloat16).t()):
        with pytest.raises(StrataError, match="out must be a contiguous") as e:
            fn(x, w, 1e-6, out=bad)
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("T,rows", [(37, 8), (37, 37), (37, 64), (1, 2048), (0, 4)])
def test_add_rounded_is_the_add_of_the_rounded(T, rows):
    """strata.models.layers.add_rounded_: x + y.to(x.dtype), the same bits, into x itself, a
    block of rows at a time (the last block short, one block, T below the block)."""
    from strata.models.layers import add_rounded_
    g = torch.Generator().manual_seed(T)
    x, y = torch.randn(T, 24, generator=g).bfloat16(), torch.randn(T, 24, generator=g) * 3
    want = x + y.to(x.dtype)
    p = x.data_ptr()
    got = add_rounded_(x, y, rows)
    assert got.data_ptr() == p and torch.equal(got, want)
    z = torch.randn(T, 24, generator=g).bfloat16()
    assert torch.equal(add_rounded_(z.clone(), x), z + x)          # same dtype: one add


@pytest.mark.parametrize("fn", [qk_norm_rope, qk_norm_rope_torch], ids=["kernel", "twin"])
@pytest.mark.parametrize("rot,norm", [(16, True), (8, True), (16, False)])
def test_qk_norm_rope_into_a_buffer_is_the_same_bits(fn, rot, norm):
    """qk_norm_rope's out (a carve's q or k, [T, h, hd] contiguous): the [h, T, hd] view of it,
    the bits returned without one, nothing written past its values."""
    g = torch.Generator().manual_seed(rot)
    T, h, hd = 13, 3, 16
    x = torch.randn(T, h, hd, generator=g).bfloat16()
    w = torch.randn(hd, generator=g).bfloat16() if norm else None
    cos, sin = rope_cos_sin(torch.arange(5, 5 + T), rot, 10000.0)
    want = fn(x, w, cos, sin, 1e-6)
    flat = torch.full((T * h * hd + 7,), float("nan"), dtype=torch.bfloat16)
    out = norm_out(flat, x, w)
    got = fn(x, w, cos, sin, 1e-6, out=out)
    assert got.shape == (h, T, hd) and got.data_ptr() == flat.data_ptr()
    assert torch.equal(got, want) and flat[T * h * hd:].isnan().all()
