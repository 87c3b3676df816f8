"""The family's router (strata.models.routers) against its brute-force twin, and its invariants:
- group-limited top-k picks what enumerating the kept groups and sorting picks;
- the correction bias moves the choice, never the weights (they are the unbiased sigmoid);
- routed_scale multiplies the weights exactly once;
- with one group (Kimi-K2, GLM-4.5) the groups mask nothing.
Scores are continuous draws, so ties (where the two may break differently) have probability 0.
"""
from __future__ import annotations

import torch
from hypothesis import example, given, settings, strategies as st

from strata.models.routers import grouped_topk, grouped_topk_ref


@st.composite
def cases(draw):
    G = draw(st.sampled_from([1, 2, 4, 8]))
    per = draw(st.integers(1, 6))
    E = G * per
    Gk = draw(st.integers(1, G))
    K = draw(st.integers(1, Gk * per))
    T = draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    logits = 2 * torch.randn(T, E, generator=g)
    bias = draw(st.sampled_from([0.0, 0.1, 1.0])) * torch.randn(E, generator=g)
    return dict(logits=logits, bias=bias, top_k=K, n_group=G, topk_group=Gk,
                norm=draw(st.booleans()), scale=draw(st.sampled_from([1.0, 2.5, 2.827])))


def run(fn, c, **over):
    kw = dict(c, **over)
    return fn(kw["logits"], kw["bias"], kw["top_k"], n_group=kw["n_group"],
              topk_group=kw["topk_group"], norm_topk_prob=kw["norm"], routed_scale=kw["scale"])


@settings(max_examples=60, deadline=None)
@given(c=cases())
def test_grouped_topk_equals_brute_force(c):
    ids, w = run(grouped_topk, c)
    rids, rw = run(grouped_topk_ref, c)
    assert torch.equal(ids, rids)
    torch.testing.assert_close(w, rw, rtol=1e-6, atol=1e-7)


@settings(max_examples=40, deadline=None)
@given(c=cases())
def test_weights_are_the_unbiased_scores(c):
    """Whatever the bias chose, the weights are sigmoid(logit) of the chosen experts
    (normalized when asked), times the scale: the bias shifts the choice only."""
    ids, w = run(grouped_topk, c)
    s = torch.sigmoid(c["logits"]).gather(1, ids)
    if c["norm"]:
        s = s / s.sum(-1, keepdim=True)
    torch.testing.assert_close(w, s * c["scale"], rtol=1e-6, atol=1e-7)


@example(e=3)
@given(e=st.integers(0, 7))
def test_a_large_bias_moves_the_choice_not_the_weight(e):
    """One group, top-2 of 8: a bias of +10 on expert e puts it in every token's choice; its
    weight is still its own sigmoid score, not the biased one."""
    g = torch.Generator().manual_seed(e)
    logits = torch.randn(5, 8, generator=g)
    bias = torch.zeros(8)
    bias[e] = 10.0
    ids, w = grouped_topk(logits, bias, 2, norm_topk_prob=False)
    assert (ids == e).any(-1).all()
    picked = (ids == e).float().argmax(-1)
    got = w.gather(1, picked[:, None])[:, 0]
    torch.testing.assert_close(got, torch.sigmoid(logits[:, e]))
    base, _ = grouped_topk(logits, None, 2, norm_topk_prob=False)
    assert not torch.equal(base, ids) or bool((base == e).any(-1).all())


@settings(max_examples=30, deadline=None)
@given(c=cases())
def test_scale_applied_once(c):
    _, w1 = run(grouped_topk, c, scale=1.0)
    _, ws = run(grouped_topk, c)
    torch.testing.assert_close(ws, w1 * c["scale"], rtol=1e-6, atol=1e-7)
    if c["norm"]:   # normalized weights sum to the scale, not to scale^2 or 1
        torch.testing.assert_close(ws.sum(-1), torch.full((ws.shape[0],), c["scale"]))


def test_group_limit_excludes_the_dropped_groups():
    """8 experts in 4 groups, 1 kept: every pick comes from one group, the one whose top-2
    corrected scores sum highest — even when a lone high score sits in another group."""
    logits = torch.tensor([[5.0, -5.0, 1.0, 1.0, -5, -5, -5, -5]])
    ids, _ = grouped_topk(logits, None, 2, n_group=4, topk_group=1)
    assert sorted(ids[0].tolist()) == [2, 3]   # group 1 (1+1 > 5-5 after sigmoid)
    ids_all, _ = grouped_topk(logits, None, 2, n_group=1, topk_group=1)
    assert 0 in ids_all[0].tolist()


def test_consumed_logits_route_the_same_and_others_are_left_alone():
    """consume=True (the router's own logits): s takes the logits' bytes and the corrected
    scores are masked in place; the ids and weights are the copying call's bits, with a bias
    and without (where c is s itself: masked out of place), one group or several; without
    consume the caller's logits are untouched."""
    gen = torch.Generator().manual_seed(3)
    for bias in (torch.randn(16, generator=gen), None):
        for n_group, topk_group in ((1, 1), (4, 2)):
            logits = torch.randn(9, 16, generator=gen)
            kw = dict(n_group=n_group, topk_group=topk_group, routed_scale=2.5)
            keep = logits.clone()
            ids, w = grouped_topk(logits, bias, 4, **kw)
            assert torch.equal(logits, keep)
            ids2, w2 = grouped_topk(logits, bias, 4, consume=True, **kw)
            assert torch.equal(ids2, ids) and torch.equal(w2, w)
            assert torch.equal(logits, torch.sigmoid(keep))           # s in the logits' bytes
