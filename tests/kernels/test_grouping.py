"""Routing invariants: top-k weights, and grouping by expert (ragged and block-padded)."""
import pytest
import torch
from hypothesis import example, given, strategies as st

from strata.errors import StrataError
from strata.kernels.moe.grouping import group_blocked, group_ragged, topk_route


def _ids(T, E, K, seed, mode="random"):
    g = torch.Generator().manual_seed(seed)
    if mode == "one":
        return torch.full((T, K), E // 2, dtype=torch.int64) if K == 1 else \
            torch.stack([torch.full((T,), (E // 2 + j) % E) for j in range(K)], 1)
    # distinct experts per token, as top-k produces
    return torch.argsort(torch.rand(T, E, generator=g), dim=1)[:, :K]


def _check(ids, E, BM):
    T, K = ids.shape
    rag = group_ragged(ids, E)
    flat = ids.reshape(-1)
    n = T * K
    # order is a permutation and inverse its inverse
    assert sorted(rag.order.tolist()) == list(range(n))
    assert torch.equal(rag.order[rag.inverse], torch.arange(n))
    assert torch.equal(rag.inverse[rag.order], torch.arange(n))
    # sorted by expert, stable (token order kept inside an expert)
    se = flat[rag.order]
    assert torch.all(se[1:] >= se[:-1])
    for e in range(E):
        run = rag.order[rag.offsets[e]:rag.offsets[e + 1]]
        assert torch.all(flat[run] == e) and torch.all(run[1:] > run[:-1])
    assert torch.equal(rag.counts, torch.bincount(flat, minlength=E))
    assert torch.equal(rag.offsets[1:] - rag.offsets[:-1], rag.counts)
    assert int(rag.offsets[-1]) == int(rag.counts.sum()) == n
    blk = group_blocked(ids, E, BM)
    sid = blk.sorted_ids.long()
    real = sid[sid < n]
    assert sorted(real.tolist()) == list(range(n))          # every assignment exactly once
    assert blk.n_blocks == int(((rag.counts + BM - 1) // BM).sum())  # no block for idle experts
    assert sid.numel() == blk.n_blocks * BM
    for b in range(blk.n_blocks):                            # each block one expert, as labelled
        rows = sid[b * BM:(b + 1) * BM]
        rows = rows[rows < n]
        assert rows.numel() > 0, "a block of pure padding costs work for nothing"
        assert torch.all(flat[rows] == blk.block_expert[b])
    pad = blk.padded_offsets
    assert torch.all((pad[1:] - pad[:-1]) % BM == 0)
    assert torch.all(pad[1:] - pad[:-1] >= rag.counts)


@pytest.mark.parametrize("T,E,K,BM,mode", [
    pytest.param(3, 8, 2, 16, "random", id="T3-lt-BM16"),       # T < BLOCK_M: one padded block
    pytest.param(40, 7, 3, 16, "random", id="E7-prime"),          # prime E: no power-of-2 luck
    pytest.param(33, 13, 1, 16, "random", id="K1"),               # K = 1: no reduction over k
    pytest.param(9, 5, 5, 16, "random", id="K-eq-E"),             # K = E: every expert every token
    pytest.param(50, 8, 1, 16, "one", id="all-on-one"),           # every token on one expert
    pytest.param(1, 4, 2, 64, "random", id="T1"),
])
def test_grouping_edge_cases(T, E, K, BM, mode):
    _check(_ids(T, E, K, 0, mode), E, BM)


@given(T=st.integers(1, 70), E=st.integers(1, 17), k_frac=st.floats(0, 1),
       bm=st.sampled_from([16, 32, 64]), seed=st.integers(0, 2**16))
@example(T=1, E=1, k_frac=1.0, bm=16, seed=0)       # a single expert and token
@example(T=16, E=4, k_frac=0.0, bm=16, seed=1)      # counts landing exactly on block edges
def test_grouping_invariants(T, E, k_frac, bm, seed):
    K = 1 + int(k_frac * (E - 1))
    _check(_ids(T, E, K, seed), E, bm)


def test_grouping_skewed_counts():
    # repeated experts per token are legal input too (not from top-k, but cheap to support)
    ids = torch.tensor([[0, 0], [2, 0], [2, 2]])
    _check(ids, 3, 16)


def test_topk_route_renormalizes():
    logits = torch.randn(11, 9, generator=torch.Generator().manual_seed(3))
    ids, w = topk_route(logits, 3)
    assert ids.shape == w.shape == (11, 3) and w.dtype == torch.float32
    torch.testing.assert_close(w.sum(1), torch.ones(11))
    p = torch.softmax(logits, -1)
    ids2, w2 = topk_route(logits, 3, renormalize=False)
    assert torch.equal(ids, ids2)
    torch.testing.assert_close(w2, p.gather(1, ids))
    assert torch.all(w2[:, :-1] >= w2[:, 1:])                 # descending, as torch.topk
    # the chosen experts are the largest logits
    assert torch.equal(torch.sort(ids, 1).values, torch.sort(torch.topk(logits, 3).indices, 1).values)


def test_bad_routing_inputs():
    with pytest.raises(StrataError, match="top-k"):
        topk_route(torch.randn(2, 4), 5)
    with pytest.raises(StrataError, match="outside"):
        group_blocked(torch.tensor([[0, 4]]), 4, 16)
    with pytest.raises(StrataError, match="integer"):
        group_blocked(torch.tensor([[0.0, 1.0]]), 4, 16)


def test_absent_expert_named():
    slot = torch.tensor([0, -1, 256, -1])
    with pytest.raises(StrataError, match=r"experts \[1\] are routed to but not resident"):
        group_blocked(torch.tensor([[0, 1], [2, 0]]), 4, 16, slot_offset=slot)
    group_blocked(torch.tensor([[0, 2]]), 4, 16, slot_offset=slot)  # absent but unused: fine


def test_routed_mask_ignores_skipped_ids():
    """The engine's passes mark other passes' assignments -1; they route to nobody."""
    from strata.kernels.moe.grouping import routed_mask
    ids = torch.tensor([[0, -1], [3, 3], [-1, -1]])
    assert routed_mask(ids, 5).tolist() == [True, False, False, True, False]
