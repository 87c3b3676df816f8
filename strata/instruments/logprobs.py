"""Per-token rows of llama-perplexity, vectorised over the scored positions of a window.

Shapes: n = scored positions, V = vocabulary, NV = 2·ceil(V/2) + 4 (llama.cpp's row of uint16).

    nll_rows(logits [n, V], targets [n])   -> float64 [n]   -log softmax(logits)[target]
    quantize_rows(logits [n, V])           -> uint16 [n, NV]   the base file's rows
    kld_rows(logits [n, V], base [n, NV], targets [n]) -> KldRows (per-token values)

The base row is llama.cpp's (perplexity.cpp `log_softmax(..., uint16_t * log_prob, ...)`):
floats scale and min_log_prob in its first 4 uint16 (8 bytes), then one uint16 per vocabulary
entry, padded to an even count. With max / min the row's logits, min clipped to max - 16:

    scale        = (max - min) / 65535
    min_log_prob = min - max - logsumexp(logits - max)
    q[i]         = round((logit[i] - min) / scale)  if logit[i] > min  else 0
    log p[i]     = scale · q[i] + min_log_prob      (16 nats of range in 65535 steps: 2.4e-4)

and the KL-divergence of a token (kld_rows) sums p_base·(log p_base - log p_Q) over the entries
whose base log-prob exceeds -16, as llama.cpp does; the base's top token is the first entry of
its largest q, the model's the first of its largest logit.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

LOG_RANGE = 16.0      # nats of log-prob a base row keeps below its top token


def row_width(n_vocab: int) -> int:
    """uint16 per base row: 4 for the two floats, then the vocabulary padded to even."""
    return 2 * ((n_vocab + 1) // 2) + 4


def _lse(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(max [n] float32, log sum exp(logits - max) [n] float32; the sum in float64)."""
    mx = logits.max(dim=1).values
    s = torch.exp(logits - mx[:, None]).double().sum(dim=1)
    return mx, torch.log(s).float()


def nll_rows(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """float64 [n]: max + logsumexp - logit[target] of each row (llama.cpp's -log_softmax)."""
    logits = logits.float()
    mx, lse = _lse(logits)
    tgt = logits.gather(1, targets.to(logits.device, torch.int64)[:, None])[:, 0]
    return (mx.double() + lse.double() - tgt.double()).cpu()


def quantize_rows(logits: torch.Tensor) -> np.ndarray:
    """uint16 [n, NV]: llama.cpp's compressed log-probs of each row (the module docstring)."""
    logits = logits.float()
    n, V = logits.shape
    mx, lse = _lse(logits)
    mn = torch.maximum(logits.min(dim=1).values, mx - LOG_RANGE)
    min_log_prob = mn - mx - lse
    scale = (mx - mn) / 65535.0
    inv = torch.where(scale > 0, 1.0 / torch.where(scale > 0, scale, 1.0), 0.0)
    q = torch.round(inv[:, None] * (logits - mn[:, None]))
    q = torch.where(logits > mn[:, None], q, 0.0).clamp_(0, 65535)
    out = np.zeros((n, row_width(V)), dtype=np.uint16)
    head = np.stack([scale.cpu().numpy(), min_log_prob.cpu().numpy()], axis=1).astype(np.float32)
    out[:, :4] = head.view(np.uint16)
    out[:, 4:4 + V] = q.to(torch.int32).cpu().numpy().astype(np.uint16)
    return out


def base_log_probs(rows: np.ndarray, n_vocab: int) -> torch.Tensor:
    """float32 [n, V]: the log-probs a base row stands for (scale · q + min_log_prob)."""
    rows = np.ascontiguousarray(rows)
    head = rows[:, :4].copy().view(np.float32)          # [n, 2]: scale, min_log_prob
    q = torch.from_numpy(rows[:, 4:4 + n_vocab].astype(np.float32))
    scale = torch.from_numpy(head[:, 0].copy())
    low = torch.from_numpy(head[:, 1].copy())
    return scale[:, None] * q + low[:, None]


@dataclass
class KldRows:
    """One window's per-token values (each [n]): what llama.cpp accumulates."""
    nll: torch.Tensor          # float64: -log p_Q(target)
    nll_base: torch.Tensor     # float64: -log p_base(target), from the base row
    kld: torch.Tensor          # float64: KL(base || Q) of the token's distribution
    p_diff: torch.Tensor       # float32: p_Q(target) - p_base(target)
    same_top: torch.Tensor     # bool: the two distributions' top tokens agree


def kld_rows(logits: torch.Tensor, base: np.ndarray, targets: torch.Tensor) -> KldRows:
    """Computed where the logits are (the GPU's [n, V] work stays there); results on the CPU."""
    logits = logits.float()
    V = logits.shape[1]
    mx, lse = _lse(logits)
    log_q = logits - (mx + lse)[:, None]                        # [n, V] float32
    lp_base = base_log_probs(base, V).to(logits.device)         # [n, V] float32
    t = targets.to(logits.device, torch.int64)[:, None]
    nll = -log_q.gather(1, t)[:, 0].double()
    nll_base = -lp_base.gather(1, t)[:, 0].double()
    keep = lp_base > -LOG_RANGE
    terms = torch.where(keep, torch.exp(lp_base) * (lp_base - log_q), 0.0)
    kld = terms.double().sum(dim=1)
    same = logits.argmax(dim=1) == lp_base.argmax(dim=1)
    p_diff = torch.exp(-nll.float()) - torch.exp(-nll_base.float())
    return KldRows(nll.cpu(), nll_base.cpu(), kld.cpu(), p_diff.cpu(), same.cpu())
