"""chunk_attention over packed sequences (`starts`: block-diagonal causal) against its torch
twin, and the twin against each sequence attended alone.

Several sequences of odd lengths back to back in one chunk; query t sees only chunk keys of its
own sequence up to itself. The kernel's bound is test_chunk_attention_window's (bf16
probabilities and output, fp32 score noise), with the reference's probabilities under the same
mask. The twin equals each sequence read alone as its own chunk within fp32 rounding: the same
products, a softmax over the same keys (the masked ones add exact zeros), so 8 u32 of |o|'s
scale (the sums' length only matters through the softmax's normalization). Small pinned tiles
put one program's rows on both sides of a sequence seam, and tiles wholly before a block's first
sequence are skipped. Window and sinks hold within each sequence.
"""
from __future__ import annotations

import pytest
import torch

from strata.errors import StrataError
from strata.kernels.attention import AttnTile, KVSegment, chunk_attention, chunk_attention_torch
from strata.models.packed import Packed
from tests.kernels.test_chunk_attention import U32, Case, make_inputs
from tests.kernels.test_chunk_attention_window import _bound

CASES = [  # lengths, H, Hkv, hd, window, sinks, tile
    ((5, 3, 7), 4, 2, 16, 0, False, None),
    ((1, 17, 9, 33, 2), 4, 2, 16, 0, False, AttnTile(16, 16, 4, 1)),
    ((40, 23, 1, 31), 8, 1, 32, 0, False, None),
    ((13, 29, 7), 8, 1, 32, 5, True, AttnTile(16, 16, 4, 1)),
    ((70, 11, 45), 4, 2, 16, 17, True, None),
]


def _id(c):
    lengths, H, Hkv, hd, w, s, tile = c
    return (f"L{'-'.join(map(str, lengths))}-G{H // Hkv}-hd{hd}-W{w}{'-sinks' if s else ''}"
            f"{'-tile16' if tile else ''}")


def _inputs(c, device):
    lengths, H, Hkv, hd, window, with_sinks, tile = c
    p = Packed.of(lengths)
    q, k, v, _ = make_inputs(Case(p.n_tokens, 0, H, Hkv, hd), device, seed=5)
    extra = {"window": window}
    if with_sinks:
        extra["sinks"] = (2.0 + torch.randn(H, generator=torch.Generator().manual_seed(4))
                          ).to(device)
    return p, q, k, v, extra, tile


@pytest.mark.parametrize("c", CASES, ids=_id)
def test_packed_kernel_matches_its_twin(c, device):
    p, q, k, v, extra, tile = _inputs(c, device)
    starts = p.starts(device)
    out = torch.full_like(q, float("nan"))
    got = chunk_attention(q, k, v, [], out=out, tile=tile, starts=starts, **extra)
    ref = chunk_attention_torch(q, k, v, [], out=torch.empty(q.shape, device=device),
                                starts=starts, **extra)
    assert torch.isfinite(got).all(), "rows left unwritten or NaN from an all-masked tile"
    err = (got.float() - ref).abs()
    worst = (err / _bound(q, k, v, [], ref, starts=starts, **extra)).max().item()
    assert worst <= 1.0, f"error {err.max().item():.3e}, {worst:.2f}x the bound"
    # the case means something: read as one sequence, the result is far outside the bound
    plain = chunk_attention_torch(q, k, v, [], out=torch.empty(q.shape, device=device), **extra)
    assert ((plain - ref).abs() / _bound(q, k, v, [], ref, starts=starts, **extra)
            ).max().item() > 10


@pytest.mark.parametrize("c", CASES, ids=_id)
def test_packed_twin_equals_each_sequence_alone(c, device):
    p, q, k, v, extra, _ = _inputs(c, device)
    packed = chunk_attention_torch(q.float(), k.float(), v.float(), [],
                                   starts=p.starts(device), **extra)
    scale = v.float().abs().max().item()
    for a, b in p.bounds:
        alone = chunk_attention_torch(q[a:b].float(), k[a:b].float(), v[a:b].float(), [],
                                      **extra)
        err = (packed[a:b] - alone).abs().max().item()
        assert err <= 8 * U32 * scale, f"sequence {a}..{b}: {err:.3e}"


def test_packed_reads_no_prefix(device):
    q, k, v, segs = make_inputs(Case(6, 4, 4, 2), device)
    with pytest.raises(StrataError, match="no keys before it"):
        chunk_attention_torch(q, k, v, segs, starts=Packed.of([2, 4]).starts(device))
    with pytest.raises(StrataError, match=r"starts must be an int32/int64 \[T=6\]"):
        chunk_attention_torch(q, k, v, [], starts=torch.zeros(5, dtype=torch.int32,
                                                               device=device))
