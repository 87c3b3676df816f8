"""The int8 KV format: symmetric per-token-per-head scales (strata.kernels.attention.kv_int8).

Invariants (Hypothesis): the round trip stays within scale · (1/2 + 2^-16) per element (the
module docstring derives the slack); codes lie in [-127, 127]; a row's largest magnitude maps to
±127 (unless the row is below 127 · 2^-126, where the scale is clamped); quantizing is odd (q(-x) = -q(x)); and quantizing a batch of tokens equals quantizing each
token alone — the property that lets the cache append a chunk without touching older tokens.
"""
import numpy as np
import pytest
import torch
from hypothesis import example, given, strategies as st

from strata.errors import StrataError
from strata.kernels.attention import dequantize_kv, kv_token_bytes, quantize_kv
from strata.kernels.attention.kv_int8 import MAX_ABS, QMAX, ROUNDTRIP_SLACK, TINY


def roundtrip_ok(x: torch.Tensor):
    q, s = quantize_kv(x)
    err = (x.double() - dequantize_kv(q, s).double()).abs()
    bound = s.double()[..., None] * (0.5 + ROUNDTRIP_SLACK)
    assert (err <= bound).all(), f"worst {(err - bound).max().item():.3e} over the bound"
    return q, s


def test_roundtrip_random_bf16_keys():
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(257, 4, 128, generator=gen) * 3).to(torch.bfloat16)
    q, s = roundtrip_ok(x)
    assert q.dtype == torch.int8 and s.dtype == torch.float32 and s.shape == (257, 4)
    assert (q.abs().amax(-1) == QMAX).all()          # every row uses the whole range


def test_writes_into_cache_views():
    x = torch.randn(5, 2, 16)
    cache_q = torch.zeros(2, 9, 16, dtype=torch.int8)   # a [Hkv, S, hd] cache
    cache_s = torch.zeros(2, 9)
    q, s = quantize_kv(x, out=cache_q[:, 3:8].transpose(0, 1),
                       scale_out=cache_s[:, 3:8].transpose(0, 1))
    want_q, want_s = quantize_kv(x)
    assert torch.equal(cache_q[:, 3:8].transpose(0, 1), want_q)
    assert torch.equal(cache_s[:, 3:8].transpose(0, 1), want_s)
    assert not cache_q[:, :3].any() and not cache_q[:, 8:].any()


def test_unvalidated_nan_propagates_without_a_sync():
    """validate=False (the hot path): no host check, and a NaN row stays visible as NaN."""
    x = torch.randn(3, 2, 8)
    x[1, 0, 3] = float("nan")
    q, s = quantize_kv(x, validate=False)
    assert torch.isnan(s[1, 0]) and torch.isfinite(s[[0, 2]]).all()
    assert torch.isnan(dequantize_kv(q, s)[1, 0]).all()
    torch.testing.assert_close(quantize_kv(x[[0, 2]])[0], q[[0, 2]], rtol=0, atol=0)


def test_bad_input_refused():
    with pytest.raises(StrataError):
        quantize_kv(torch.zeros(3, 4))
    with pytest.raises(StrataError):
        quantize_kv(torch.tensor([[[1.0, float("nan")]]]))
    with pytest.raises(StrataError):
        quantize_kv(torch.tensor([[[1.0, 3e38]]]))
    with pytest.raises(StrataError):
        dequantize_kv(torch.zeros(2, 1, 4, dtype=torch.int8), torch.zeros(2, 2))
    with pytest.raises(StrataError):
        kv_token_bytes("fp8", 4, 128)


def test_token_bytes():
    assert kv_token_bytes("bf16", 4, 128) == 2048          # Qwen3-30B: 4 heads · 128 · 2 · (k, v)
    assert kv_token_bytes("int8", 4, 128) == 2 * 4 * 132   # 0.516 of bf16


rows = st.integers(1, 3).flatmap(lambda S: st.integers(1, 2).flatmap(lambda H: st.integers(
    1, 12).flatmap(lambda D: st.lists(st.floats(-MAX_ABS, MAX_ABS, width=32),
                                      min_size=S * H * D, max_size=S * H * D).map(
        lambda v: np.array(v, dtype=np.float32).reshape(S, H, D)))))


@given(rows)
@example(np.zeros((2, 1, 4), np.float32))                            # zero rows: scale 0, exact
@example(np.array([[[1e30, 1.0, -1e-30, 0.0]]], np.float32))          # tiny beside huge -> 0
@example(np.array([[[127.0, 0.5, 1.5, -2.5, 126.5]]], np.float32))    # exact .5 ties
@example(np.array([[[1e-40, -3e-41, 0.0]]], np.float32))              # subnormal row: TINY scale
@example(np.array([[[MAX_ABS, -MAX_ABS, 1.0]]], np.float32))          # the largest accepted
def test_quantizer_invariants(x):
    t = torch.from_numpy(x)
    q, s = roundtrip_ok(t)
    amax = t.abs().amax(-1)
    assert (q.abs() <= QMAX).all()
    assert ((s == 0) == (amax == 0)).all()
    assert (s[amax > 0] >= TINY).all()
    full = amax >= QMAX * TINY                       # rows whose scale is amax / 127 itself
    assert (q.abs().amax(-1)[full] == QMAX).all()   # ... use the whole range
    qn, sn = quantize_kv(-t)
    assert torch.equal(qn, -q) and torch.equal(sn, s)
    per_token = [quantize_kv(t[i:i + 1]) for i in range(t.shape[0])]
    assert torch.equal(torch.cat([p[0] for p in per_token]), q)
    assert torch.equal(torch.cat([p[1] for p in per_token]), s)
