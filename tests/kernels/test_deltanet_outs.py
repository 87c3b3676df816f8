"""The delta rule's parts writing where they are told (the engine hands them its carve:
strata.models.qwen3_next.delta_rows): the conv's two outputs, the rule's o and the gated norm's
output each into a given buffer, bit for bit what the call allocating its own returns, for the
Triton launches (interpreted) and their twins alike; a buffer of the wrong shape, dtype or
layout is refused in one line."""
from __future__ import annotations

import pytest
import torch

from strata.errors import StrataError
from strata.kernels.deltanet import (causal_conv1d, causal_conv1d_torch, gated_rms_norm,
                                     gated_rms_norm_torch)
from tests.kernels.test_deltanet_chunk import FLA_MISSING, IMPLS, Case, inputs
from tests.kernels.test_deltanet_parts import conv_inputs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("conv", [causal_conv1d, causal_conv1d_torch], ids=["kernel", "twin"])
def test_the_conv_writes_its_given_outputs(conv, dtype):
    x, w, b = conv_inputs(70, C=200, seed=4, dtype=dtype)
    state = torch.randn(3, 200, generator=torch.Generator().manual_seed(2)).to(dtype)
    (left, right), s = conv(x, w, b, state, split=96)
    bufs = (torch.full((70, 96), float("nan")).to(dtype),
            torch.full((70, 104), float("nan")).to(dtype))
    (l2, r2), s2 = conv(x, w, b, state, split=96, out=bufs)
    assert (l2.data_ptr(), r2.data_ptr()) == tuple(t.data_ptr() for t in bufs)
    assert torch.equal(l2, left) and torch.equal(r2, right) and torch.equal(s2, s)
    (l3, r3), _ = conv(x, w, b, state, split=96, out=(None, bufs[1]))   # one of them given
    assert torch.equal(l3, left) and r3.data_ptr() == bufs[1].data_ptr()
    one, _ = conv(x, w, b, state)
    whole = torch.empty(70, 200, dtype=dtype)
    assert conv(x, w, b, state, out=whole)[0].data_ptr() == whole.data_ptr()
    assert torch.equal(whole, one)
    for bad in ((torch.empty(70, 95, dtype=dtype), bufs[1]),
                (bufs[0], torch.empty(70, 104, dtype=torch.float16)),
                (bufs[0], torch.empty(104, 70, dtype=dtype).t()), bufs[0]):
        with pytest.raises(StrataError) as e:
            conv(x, w, b, state, split=96, out=bad)
        assert "\n" not in str(e.value) and "out" in str(e.value)


@pytest.mark.parametrize("impl", list(IMPLS))
def test_the_rule_writes_its_given_output(impl):
    if impl == "fla" and FLA_MISSING is not None:
        pytest.skip(str(FLA_MISSING))
    fn = IMPLS[impl]
    x = inputs(Case(70, Hk=2, Hv=4, dk=16, dv=24), 21)
    o, S = fn(*x, use_qk_l2norm=True)
    out = torch.full_like(o, float("nan"))
    o2, S2 = fn(*x, use_qk_l2norm=True, out=out)
    assert o2.data_ptr() == out.data_ptr() and torch.equal(o2, o) and torch.equal(S2, S)
    if impl in ("triton", "fla"):     # the launchers check it; the twins copy into it
        for bad in (torch.empty(70, 4, 23), torch.empty(70, 4, 24, dtype=torch.bfloat16),
                    torch.empty(4, 70, 24).transpose(0, 1)):
            with pytest.raises(StrataError) as e:
                fn(*x, use_qk_l2norm=True, out=bad)
            assert "\n" not in str(e.value) and "out must be" in str(e.value)


@pytest.mark.parametrize("norm", [gated_rms_norm, gated_rms_norm_torch], ids=["kernel", "twin"])
def test_the_gated_norm_writes_its_given_output(norm):
    gen = torch.Generator().manual_seed(8)
    x, z = (torch.randn(33, 4, 48, generator=gen).bfloat16() for _ in range(2))
    w = 1 + 0.2 * torch.randn(48, generator=gen)
    y = norm(x, z, w, 1e-6)
    out = torch.full_like(x, float("nan"))
    assert norm(x, z, w, 1e-6, out).data_ptr() == out.data_ptr() and torch.equal(out, y)
    for bad in (torch.empty(33, 4, 47, dtype=torch.bfloat16), torch.empty(33, 4, 48),
                torch.empty(4, 33, 48, dtype=torch.bfloat16).transpose(0, 1)):
        with pytest.raises(StrataError) as e:
            norm(x, z, w, 1e-6, bad)
        assert "\n" not in str(e.value) and "out must be" in str(e.value)
