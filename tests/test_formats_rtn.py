"""strata.formats.rtn: every round-to-nearest encoder decodes (through strata's own decoders,
the ones the kernels are held to) to within its bound of the float weights, on fresh random
data of several scales, with all-zero, one-sided and outlier blocks among them.

The bound (rtn_bound): half the sub-block's step d*sc (IQ4: half the table's widest gap times
the scale), the step read back from the encoded block itself, plus fp32 rounding of the decode
(a few ulps of the largest |w| of the block)."""
from __future__ import annotations

import pytest
import torch

from strata.formats import codec
from strata.formats.rtn import RTN_QUANTIZERS, rtn_bound
from strata.formats.table import get_format

SUB = {"Q2_K": 16, "Q3_K": 16, "Q4_K": 32, "Q5_K": 32, "Q6_K": 16, "IQ4_XS": 32, "IQ4_NL": 32}


def blocks(fmt: str, seed: int) -> torch.Tensor:
    B = get_format(fmt).block
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(64, B, generator=g) * torch.logspace(-4, 2, 64)[:, None]
    x[0] = 0                                        # an all-zero block
    x[1] = x[1].abs()                               # one-sided blocks
    x[2] = -x[2].abs()
    x[3, 5] = 1e3                                   # an outlier
    return x


# (levels, scale top) of the affine formats w = d*sc*q - dmin*m; (lowest code, highest code,
# scale top) of the symmetric ones w = d*sc*q (IQ4: the table's ends; IQ4_NL has no sub-scale)
AFFINE = {"Q2_K": (3, 15), "Q4_K": (15, 63), "Q5_K": (31, 63)}
SYMMETRIC = {"Q3_K": (-4, 3, 31), "Q6_K": (-32, 31, 127), "IQ4_XS": (-127, 113, 31),
             "IQ4_NL": (-127, 113, None)}
F16 = 1 + 2.0 ** -10          # a super scale rounded up to fp16: one ulp relative (normal)
F16_SUB = 2.0 ** -24           # or one subnormal ulp


def step_of(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """The most each weight's sub-block step may be, from the encoder's rule: a sub-block needs
    `need` (its range over its code span), the super scale d is the block's largest need over
    (top - 1/2) rounded up to fp16, the integer scale the ceiling of need / d: step <= need + d.
    With a minimum, its own rounding (dmin likewise) widens the range by at most dmin."""
    n, B = x.shape
    xs = x.reshape(n, -1, SUB[fmt])
    lo, hi = xs.amin(dim=2), xs.amax(dim=2)
    if fmt in AFFINE:
        levels, top = AFFINE[fmt]
        low = (-lo).clamp(min=0)
        dmin = low.amax(dim=1, keepdim=True) / (top - 0.5) * F16 + F16_SUB
        need = (hi.clamp(min=0) + low + dmin) / levels
    else:
        qlo, qhi, top = SYMMETRIC[fmt]
        need = torch.maximum(hi.clamp(min=0) / qhi, lo.clamp(max=0) / qlo)
        if top is None:
            return (need * F16 + F16_SUB)[:, :, None].expand_as(xs).reshape(n, B)
    d = need.amax(dim=1, keepdim=True) / (top - 0.5) * F16 + F16_SUB
    return (need + d)[:, :, None].expand_as(xs).reshape(n, B)


@pytest.mark.parametrize("fmt", sorted(RTN_QUANTIZERS))
@pytest.mark.parametrize("seed", [0, 1])
def test_rtn_decodes_within_its_bound(fmt, seed):
    x = blocks(fmt, seed)
    enc = RTN_QUANTIZERS[fmt](x)
    f = get_format(fmt)
    assert enc.dtype == torch.uint8 and enc.shape == (x.shape[0], f.block_bytes)
    y = torch.full_like(x, float("nan"))
    y.copy_(codec.DEQUANTIZERS[fmt](enc))
    assert torch.isfinite(y).all()
    err = (y - x).abs()
    bound = rtn_bound(fmt, step_of(x, fmt)) + 8 * torch.finfo(torch.float32).eps * \
        x.abs().amax(dim=1, keepdim=True)
    assert (err <= bound).all(), (fmt, float((err - bound).max()))
    assert torch.equal(y[0], torch.zeros_like(y[0]))
