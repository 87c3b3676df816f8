"""Routers of the DeepSeek / GLM-4.5 family: sigmoid scores, a correction bias that steers the
choice, group-limited top-k and a routed scaling factor (torch ops; h -> ids, weights).

Legend: T tokens, E experts, K top-k, G expert groups (E/G experts each), Gk groups kept.

    s = sigmoid(h W^T)                        # [T, E] fp32, the weights come from s
    c = s + bias                              # [T, E] the choice uses the corrected scores
    group score = sum of the top-2 c in the group (one expert per group counts once if E/G = 1)
    keep the Gk best groups; ids = top-K of c over the kept groups' experts
    w = s[ids] (/ sum, when norm_topk_prob) * routed_scale      # the scale, once

`grouped_topk` is the op the model runs (masking the dropped groups, then one top-k);
`grouped_topk_ref` is its brute-force twin of the same signature (every token: enumerate the
kept groups by sorting group scores, then a Python sort of the candidates) for the invariant
tests. Ties between equal scores break toward the lower index in both (the tests draw
continuous scores, where ties have probability 0).
"""
from __future__ import annotations

import torch

from strata.errors import StrataError
from strata.kernels.moe.router import route_logits


def _check(logits, bias, top_k, n_group, topk_group):
    T, E = logits.shape
    if bias is not None and tuple(bias.shape) != (E,):
        raise StrataError(f"the correction bias is {list(bias.shape)}, expected [{E}]")
    if n_group < 1 or E % n_group or not 1 <= topk_group <= n_group:
        raise StrataError(f"{E} experts in {n_group} groups with {topk_group} kept: groups must "
                          f"be whole and 1 <= kept <= groups")
    if not 1 <= top_k <= topk_group * (E // n_group):
        raise StrataError(f"top-k {top_k} must be between 1 and the {topk_group * (E // n_group)} "
                          f"experts of the kept groups")


def grouped_topk(logits: torch.Tensor, bias: torch.Tensor | None, top_k: int, *,
                 n_group: int = 1, topk_group: int = 1, norm_topk_prob: bool = True,
                 routed_scale: float = 1.0, consume: bool = False
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] -> (ids int64 [T, K], weights fp32 [T, K]): see the module doc. `consume`:
    fp32 logits the caller hands over (the router's own), whose bytes take s; the corrected
    scores are masked in place: two [T, E] fp32 live at once, not four (134 MB at a 32K
    DeepSeek-V3 chunk), the same values."""
    _check(logits, bias, top_k, n_group, topk_group)
    T, E = logits.shape
    lf = logits.float()
    s = torch.sigmoid(lf, out=lf) if consume and lf is logits else torch.sigmoid(lf)  # [T, E]
    c = s + bias.float() if bias is not None else s
    if n_group > 1:
        per = E // n_group
        g = c.view(T, n_group, per)
        gs = g.topk(min(2, per), dim=-1).values.sum(-1)                    # [T, G]
        keep = gs.topk(topk_group, dim=-1).indices                         # [T, Gk]
        mask = torch.zeros(T, n_group, dtype=torch.bool, device=c.device)
        mask.scatter_(1, keep, True)
        drop = ~mask.repeat_interleave(per, dim=1)
        # in place where c is its own tensor (s is read for the weights after)
        c = c.masked_fill_(drop, float("-inf")) if c is not s else c.masked_fill(drop,
                                                                                 float("-inf"))
    ids = c.topk(top_k, dim=-1).indices                                     # [T, K]
    w = s.gather(1, ids)
    if norm_topk_prob:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    return ids, w * routed_scale


def grouped_topk_ref(logits: torch.Tensor, bias: torch.Tensor | None, top_k: int, *,
                     n_group: int = 1, topk_group: int = 1, norm_topk_prob: bool = True,
                     routed_scale: float = 1.0, consume: bool = False
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Brute force, token by token in Python (same signature and contract as grouped_topk;
    `consume` is accepted and changes nothing here)."""
    _check(logits, bias, top_k, n_group, topk_group)
    T, E = logits.shape
    per = E // n_group
    s = torch.sigmoid(logits.double()).tolist()
    b = bias.double().tolist() if bias is not None else [0.0] * E
    ids, ws = [], []
    for t in range(T):
        c = [s[t][e] + b[e] for e in range(E)]
        gscore = [sum(sorted(c[g * per:(g + 1) * per], reverse=True)[:2]) for g in range(n_group)]
        kept = sorted(range(n_group), key=lambda g: (-gscore[g], g))[:topk_group]
        cand = [e for g in kept for e in range(g * per, (g + 1) * per)]
        pick = sorted(cand, key=lambda e: (-c[e], e))[:top_k]
        w = [s[t][e] for e in pick]
        if norm_topk_prob:
            tot = sum(w) + 1e-20
            w = [x / tot for x in w]
        ids.append(pick)
        ws.append([x * routed_scale for x in w])
    return (torch.tensor(ids, dtype=torch.int64, device=logits.device),
            torch.tensor(ws, dtype=torch.float32, device=logits.device))


def sigmoid_router(w_router: torch.Tensor, bias: torch.Tensor | None, shape):
    """The layer's router h [T, D] -> (ids, w) for a sigmoid-routed shape (strata.shapes)."""
    def route(h: torch.Tensor):
        r = shape.router
        return grouped_topk(route_logits(h, w_router), bias, shape.top_k,
                            n_group=r.n_group, topk_group=r.topk_group,
                            norm_topk_prob=shape.norm_topk_prob, routed_scale=r.scale,
                            consume=True)
    return route
