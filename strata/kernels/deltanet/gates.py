"""The per-token, per-value-head gates of a DeltaNet layer from its projections, as transformers
5.24's Qwen3NextGatedDeltaNet / Qwen3_5MoeGatedDeltaNet compute them.

Legend: T tokens, Hv value heads.

    delta_gates(a, b [T, Hv], A_log, dt_bias [Hv]) -> (g [T, Hv] fp32, beta [T, Hv] in b's dtype)
    beta = sigmoid(b)            g = -exp(A_log) * softplus(a + dt_bias)    (fp32, g <= 0)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from strata.errors import StrataError


def delta_gates(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
                dt_bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(g, beta) of the gated delta rule (see the module docstring)."""
    if (a.dim() != 2 or b.shape != a.shape or A_log.shape != (a.shape[1],)
            or dt_bias.shape != (a.shape[1],)):
        raise StrataError(f"delta_gates: a, b [T, Hv] and A_log, dt_bias [Hv]; got a "
                          f"{list(a.shape)} b {list(b.shape)} A_log {list(A_log.shape)} "
                          f"dt_bias {list(dt_bias.shape)}")
    beta = b.sigmoid()
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias)
    return g, beta
