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
