"""The logit error fp32 arithmetic in another order may cause on a model forward, derived from
fp32's backward error instead of fixed at a number one machine happens to pass.

Any evaluation order of an fp32 dot product of length n returns the exact dot product of inputs
perturbed elementwise by relative errors θ_i, each a product of at most n roundings of size
<= u = 2^-24 (Higham, Accuracy and Stability of Numerical Algorithms, §3.1). The roundings are
independent and of mean zero in practice, so |θ_i| <= λ √n u but for a probability that falls as
exp(-λ²/2) (Higham & Mary, SIAM J. Sci. Comput. 41(5), 2019, thm 2.4); the worst case n u is
√n times wider and never met. Two runs of the same forward that differ only in summation order
(chunked vs whole, another BLAS blocking, AVX2 vs AVX-512 kernels) are both exact forwards of
weights perturbed that much. `order_bound` propagates the perturbation through the model itself:
it reruns the forward with every matrix multiplied by (1 ± λ √n u) (n its reduction length, at
least the tokens an attention row sums over; a vector such as a norm weight: one rounding, λ u),
random signs, `draws` times; takes the largest normalized logit change and doubles it (two runs,
each that far from the exact forward). First order, and it holds for the model's own
amplification (depth, routing softmax, norms), which a constant cannot know. λ = 4.
"""
from __future__ import annotations

import copy
from typing import Callable, Mapping

import numpy as np
import torch

U32 = 2.0 ** -24
LAMBDA = 4.0


def theta(n: int) -> float:
    """The probabilistic backward error λ √n u of an fp32 sum of n products."""
    return LAMBDA * n ** 0.5 * U32


def rel(a, b) -> float:
    """Normalized error max |a - b| / max |b|."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


def order_bound(forward: Callable[[Mapping[str, torch.Tensor]], torch.Tensor],
                weights: Mapping[str, torch.Tensor], tokens: int, *, draws: int = 2,
                seed: int = 0) -> float:
    """2 x the largest rel(forward(perturbed weights), forward(weights)) over `draws` sign draws
    (see the module doc; `tokens` the prompt length, the longest attention sum): the normalized
    logit difference two fp32 orders of `forward` may show."""
    base = forward(weights)
    g = torch.Generator().manual_seed(seed)
    worst = 0.0
    for _ in range(draws):
        pert = {}
        for k, w in weights.items():
            sign = torch.randint(0, 2, w.shape, generator=g).to(w.dtype) * 2 - 1
            amp = theta(max(w.shape[-1], tokens)) if w.dim() > 1 else LAMBDA * U32
            pert[k] = w * (1 + amp * sign)
        worst = max(worst, rel(forward(pert), base))
    return 2 * worst


def model_order_bound(model: torch.nn.Module, logits: Callable[[torch.nn.Module], object],
                      tokens: int, **kw) -> float:
    """order_bound of a transformers model's forward: `logits(m)` reads the logits of a copy of
    `model` holding each draw's perturbed floating-point weights (`model` itself untouched)."""
    probe = copy.deepcopy(model)
    weights = {k: v for k, v in model.state_dict().items() if v.is_floating_point()}

    def forward(w):
        probe.load_state_dict(w, strict=False)
        return logits(probe)
    return order_bound(forward, weights, tokens, **kw)
