"""chunk_attention's sliding window and sinks (GPT-OSS) against chunk_attention_torch.

The bound is test_chunk_attention's (`attention_bound`: bf16 probabilities and output, fp32
score noise), with the reference's probabilities A taken under the same window and sinks (a sink
only removes probability mass, so A @ |V| shrinks with it). Outputs start NaN (an unwritten row,
or a row whose running max stayed -inf and took exp2(-inf + inf), fails).

Cases: windows shorter than a key tile and longer than the prefix, a window that ends inside
segment a (so the block skips whole tiles), two segments with the window across their seam,
an int8 prefix, G > 1; sinks alone and with a window; small pinned tiles so that a program's
rows lie on both sides of a window edge.
"""
from __future__ import annotations

import math

import pytest
import torch

from strata.errors import StrataError
from strata.kernels.attention import (AttnScratch, AttnTile, KVSegment, chunk_attention,
                                      chunk_attention_torch)
from tests.kernels.test_chunk_attention import U, U32, Case, make_inputs

CASES = [  # case, window, sinks, tile
    (Case(7, 0, 4, 2), 3, False, None),
    (Case(40, 100, 4, 2), 5, False, None),
    (Case(40, 200, 4, 2, split=64), 70, False, None),
    (Case(21, 37, 4, 2, kv="int8", split=16), 9, False, AttnTile(16, 16, 4, 1)),
    (Case(17, 30, 8, 1, hd=32), 128, True, AttnTile(16, 16, 4, 1)),
    (Case(9, 70, 4, 2), 0, True, None),
    (Case(63, 257, 16, 2), 17, True, None),
]


def _id(c):
    case, w, s, tile = c
    return f"{case.id}-W{w}{'-sinks' if s else ''}{'-tile16' if tile else ''}"


def _bound(q, k, v, segs, ref, **extra):
    T, H, hd = q.shape
    scale = 1.0 / math.sqrt(hd)
    keys = [s.dequantized()[0] for s in segs] + [k.float()]
    S = sum(x.shape[0] for x in keys)
    kmax = max(x.norm(dim=-1).max().item() for x in keys if x.numel())
    delta = (hd + 2) * U32 * scale * q.float().norm(dim=-1).max().item() * kmax
    absv = [KVSegment(s.k, s.v.abs(), s.k_scale, s.v_scale) for s in segs]
    a_absv = chunk_attention_torch(q, k, v.abs(), absv, out=torch.empty(q.shape,
                                                                       device=q.device), **extra)
    return (U + 4 * delta + 3 * S * U32) * a_absv + U * ref.abs()


@pytest.mark.parametrize("c", CASES, ids=_id)
def test_window_and_sinks_match_reference(c, device):
    case, window, with_sinks, tile = c
    q, k, v, segs = make_inputs(case, device, seed=3)
    extra = {"window": window}
    if with_sinks:
        # around 4: a sink then holds a visible share against up to ~300 keys of O(1) scores
        extra["sinks"] = (4.0 + torch.randn(case.H, generator=torch.Generator().manual_seed(4))
                          ).to(device)
    out = torch.full_like(q, float("nan"))
    got = chunk_attention(q, k, v, segs, out=out, tile=tile, **extra)
    ref = chunk_attention_torch(q, k, v, segs, out=torch.empty(q.shape, device=device), **extra)
    assert torch.isfinite(got).all(), "rows left unwritten or NaN from an all-masked tile"
    err = (got.float() - ref).abs()
    worst = (err / _bound(q, k, v, segs, ref, **extra)).max().item()
    assert worst <= 1.0, f"error {err.max().item():.3e}, {worst:.2f}x the bound"
    # the case means something: without the window/sinks the result is far outside the bound
    plain = chunk_attention_torch(q, k, v, segs, out=torch.empty(q.shape, device=device))
    assert ((plain - ref).abs() / _bound(q, k, v, segs, ref, **extra)).max().item() > 10


# a window and sinks over an int8 prefix longer than the scratch: the window ends inside the
# prefix (pieces wholly before it skip their tiles by absolute position), crosses the seam of
# two segments and a piece boundary; each int8 path
PIECES = [(Case(21, 300, 4, 2, kv="int8", split=137), 100, 120, "dequant"),
          (Case(9, 70, 4, 2, kv="int8", split=40), 16, 30, "expand"),
          (Case(9, 70, 4, 2, kv="int8", split=40), 16, 30, "dequant")]


@pytest.mark.parametrize("c", PIECES, ids=lambda c: f"{c[0].id}-R{c[1]}-W{c[2]}-{c[3]}")
def test_window_and_sinks_in_pieces(c, device):
    """The pieces' launches visit the same tiles in the same order as one launch (the window's
    skip goes by absolute key position, the sinks join once, in the FINISH launch): the same bits
    in the interpreter, and within the reference's bound."""
    case, rows, window, path = c
    q, k, v, segs = make_inputs(case, device, seed=5)
    tile = AttnTile(16, 16, 4, 1, int8=path)
    extra = {"window": window,
             "sinks": (4.0 + torch.randn(case.H, generator=torch.Generator().manual_seed(6))
                       ).to(device)}
    whole = chunk_attention(q, k, v, segs, out=torch.full_like(q, float("nan")), tile=tile,
                            **extra)
    sc = AttnScratch.of(case.Hkv, case.hd, rows, device, T=case.T, H=case.H)
    sc.k.fill_(float("nan"))
    sc.v.fill_(float("nan"))
    sc.state.fill_(float("nan"))
    pieced = chunk_attention(q, k, v, segs, out=torch.full_like(q, float("nan")), tile=tile,
                             scratch=sc, **extra)
    assert torch.isfinite(pieced).all()
    if device.type == "cpu":
        assert torch.equal(pieced, whole)
    ref = chunk_attention_torch(q, k, v, segs, out=torch.empty(q.shape, device=device), **extra)
    err = (pieced.float() - ref).abs()
    worst = (err / _bound(q, k, v, segs, ref, **extra)).max().item()
    assert worst <= 1.0, f"error {err.max().item():.3e}, {worst:.2f}x the bound"


def test_reference_window_is_the_definition():
    """Window W: query t (absolute P + t) sees exactly keys P + t - W < j <= P + t; sinks add
    exp(sink) to the denominator (checked against a direct computation)."""
    case = Case(5, 6, 2, 1)
    q, k, v, segs = make_inputs(case, "cpu", seed=1)
    sinks = torch.tensor([0.5, -1.0])
    got = chunk_attention_torch(q, k, v, segs, out=torch.empty(q.shape), window=3, sinks=sinks)
    K = torch.cat([segs[0].k, k]).float()
    V = torch.cat([segs[0].v, v]).float()
    for t in range(5):
        for h in range(2):
            js = [j for j in range(11) if 6 + t - 3 < j <= 6 + t]
            s = torch.stack([q[t, h].float() @ K[j, 0] / 4.0 for j in js])
            p = s.exp() / (s.exp().sum() + sinks[h].exp())
            want = (p[:, None] * V[js, 0]).sum(0)
            assert torch.allclose(got[t, h], want, atol=1e-5)


def test_bad_window_and_sinks_refused():
    q, k, v, segs = make_inputs(Case(3, 4, 4, 2), "cpu")
    for fn in (chunk_attention, chunk_attention_torch):
        with pytest.raises(StrataError, match="window must be"):
            fn(q, k, v, segs, window=-1)
        with pytest.raises(StrataError, match="sinks must be"):
            fn(q, k, v, segs, sinks=torch.zeros(3))
