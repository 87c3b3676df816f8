"""YaRN's attention factors as the checkpoints state them (pure arithmetic, no tensors): what the
readers turn a GGUF's or a config.json's rope scaling into (ModelShape.yarn's attn / kq) and
what strata.models.layers' RoPE tables multiply by."""
from __future__ import annotations

import math


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature 0.1 m ln(factor) + 1 (1 when factor <= 1)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def deepseek_yarn(factor: float, mscale: float | None, mscale_all_dim: float | None,
                  attention_factor: float | None = None) -> tuple[float, float]:
    """(cos/sin multiplier, softmax-scale multiplier) of DeepSeek's YaRN as transformers'
    DeepseekV3 reads its config: cos and sin scale by mscale's temperature over mscale_all_dim's
    (both given; else YaRN's default temperature; `attention_factor` overrides it), and the
    softmax scale 1/sqrt(hd) by mscale_all_dim's temperature squared (when given). DeepSeek-V3 /
    Kimi-K2 (mscale = mscale_all_dim = 1, factor 40): (1, 1.369²)."""
    if attention_factor is not None:
        attn = float(attention_factor)
    elif mscale and mscale_all_dim:
        attn = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
    else:
        attn = yarn_mscale(factor)
    kq = yarn_mscale(factor, mscale_all_dim) ** 2 if mscale_all_dim else 1.0
    return attn, kq
