"""A layer's output into its own normed input (strata.models.layers.into_view / matmul_into):
the product's bits whether it lands in `into` or in a new tensor, in `into` exactly when that
is a contiguous tensor of the product's shape, dtype and device, and nothing of a rejected
`into` written."""
from __future__ import annotations

import torch
from hypothesis import given, settings, strategies as st

from strata.models.layers import into_view, matmul_into

DTYPES = [torch.float32, torch.bfloat16]


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 9), st.integers(1, 12), st.integers(1, 12), st.sampled_from(DTYPES),
       st.sampled_from(["fits", "rows", "cols", "dtype", "strided", "none"]))
def test_matmul_into_is_the_product_where_into_takes_it(T, n, m, dt, case):
    """The models' operands share a dtype (the activations are the weights' dtype)."""
    g = torch.Generator().manual_seed(T * 97 + n * 13 + m)
    a = torch.randn(T, n, generator=g).to(dt)
    wt = torch.randn(m, n, generator=g).to(dt)
    into = {"fits": lambda: torch.full((T, m), float("nan"), dtype=dt),
            "rows": lambda: torch.full((T + 1, m), float("nan"), dtype=dt),
            "cols": lambda: torch.full((T, m + 1), float("nan"), dtype=dt),
            "dtype": lambda: torch.full((T, m), float("nan"),
                                        dtype=torch.float16 if dt != torch.float16 else
                                        torch.float32),
            "strided": lambda: torch.full((m, T), float("nan"), dtype=dt).t(),
            "none": lambda: None}[case]()
    before = None if into is None else into.clone()
    got = matmul_into(a, wt, into)
    assert torch.equal(got, a @ wt.t()) and got.dtype == dt
    takes = into is not None and (case == "fits" or case == "strided" and into.is_contiguous())
    if takes:
        assert got.data_ptr() == into.data_ptr() and into_view(into, got.shape, dt, a.device) \
            is not None
    elif into is not None:
        assert got.data_ptr() != into.data_ptr()
        assert torch.equal(into.isnan(), before.isnan())       # nothing written into it


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 6), st.integers(0, 40), st.sampled_from(DTYPES))
def test_buf_view_reads_a_contiguous_buffer_flat(r, c, n, dt):
    """buf_view over a contiguous buffer of any shape is a view of its first values in
    row-major order, where they are; a transposed (non-contiguous) one, a short one or one of
    another dtype answers None."""
    from strata.models.layers import buf_view
    buf = torch.arange(r * c, dtype=torch.float32).to(dt).view(r, c)
    shape = (n,)
    got = buf_view(buf, shape, dt, buf.device)
    if n > r * c:
        assert got is None
    else:
        assert torch.equal(got, buf.reshape(-1)[:n])
        assert n == 0 or got.data_ptr() == buf.data_ptr()     # (an empty view points nowhere)
    if r > 1 and c > 1:
        assert buf_view(buf.t(), (1,), dt, buf.device) is None
    other = torch.float16 if dt != torch.float16 else torch.float32
    assert buf_view(buf, (1,), other, buf.device) is None
