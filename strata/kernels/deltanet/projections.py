"""How a DeltaNet layer's input projections are laid out, so the model file only multiplies:
Qwen3-Next's fused in_proj_qkvz / in_proj_ba (interleaved by key-head group) and Qwen3.5's
split in_proj_qkv / z / b / a both become the conv's input and the per-head z, b, a (transformers
5.24's Qwen3NextGatedDeltaNet.fix_query_key_value_ordering and Qwen3_5MoeGatedDeltaNet.forward).

Legend: T tokens, Hk key heads, Hv value heads, r = Hv / Hk, dk / dv head dims,
C = 2 Hk dk + Hv dv the conv channels, in the order [q of all heads | k | v].

    qwen3_next_inputs(qkvz [T, Hk (2 dk + 2 r dv)], ba [T, Hk (2 r)], Hk, Hv, dk, dv)
        -> mixed_qkv [T, C], z [T, Hv, dv], b [T, Hv], a [T, Hv]
    split_qkv(mixed [T, C] | ([T, 2 Hk dk], [T, Hv dv]), Hk, Hv, dk, dv)
        -> q [T, Hk, dk], k [T, Hk, dk], v [T, Hv, dv]
Qwen3.5's in_proj_qkv output is already mixed_qkv; its z, b, a are plain reshapes.
"""
from __future__ import annotations

import torch

from strata.errors import StrataError


def qwen3_next_inputs(qkvz: torch.Tensor, ba: torch.Tensor, h_k: int, h_v: int, d_k: int,
                      d_v: int):
    """Qwen3-Next's two fused projections -> (mixed_qkv, z, b, a) (see the module docstring)."""
    r = h_v // h_k
    T = qkvz.shape[0]
    if (qkvz.dim() != 2 or qkvz.shape[1] != h_k * (2 * d_k + 2 * r * d_v) or h_v % h_k
            or ba.shape != (T, 2 * h_v)):
        raise StrataError(f"qwen3_next_inputs: qkvz [T, {h_k * (2 * d_k + 2 * r * d_v)}] and ba "
                          f"[T, {2 * h_v}], got {list(qkvz.shape)} and {list(ba.shape)}")
    g = qkvz.view(T, h_k, 2 * d_k + 2 * r * d_v)                           # [T, Hk, group]
    q, k, v, z = torch.split(g, [d_k, d_k, r * d_v, r * d_v], dim=2)
    b, a = torch.split(ba.view(T, h_k, 2 * r), [r, r], dim=2)
    mixed = torch.cat([q.reshape(T, -1), k.reshape(T, -1), v.reshape(T, -1)], dim=1)
    return mixed, z.reshape(T, h_v, d_v), b.reshape(T, h_v), a.reshape(T, h_v)


def split_qkv(mixed, h_k: int, h_v: int, d_k: int, d_v: int):
    """The conv's output [T, C], or its split pair ([T, 2 Hk dk], [T, Hv dv]: causal_conv1d's
    `split`, v contiguous) -> q, k [T, Hk, dk] and v [T, Hv, dv] (views)."""
    qk_w, v_w = 2 * h_k * d_k, h_v * d_v
    if isinstance(mixed, tuple) and len(mixed) == 2:
        qk, v = mixed
        if (qk.dim() != 2 or v.dim() != 2 or qk.shape != (qk.shape[0], qk_w)
                or v.shape != (qk.shape[0], v_w)):
            raise StrataError(f"split_qkv: the pair must be [T, {qk_w}] and [T, {v_w}], got "
                              f"{list(qk.shape)} and {list(v.shape)}")
        q, k = torch.split(qk, [h_k * d_k, h_k * d_k], dim=1)
    else:
        if not isinstance(mixed, torch.Tensor) or mixed.dim() != 2 \
                or mixed.shape[1] != qk_w + v_w:
            raise StrataError(f"split_qkv: mixed must be [T, {qk_w + v_w}], got "
                              f"{list(getattr(mixed, 'shape', []))}")
        q, k, v = torch.split(mixed, [h_k * d_k, h_k * d_k, v_w], dim=1)
    T = q.shape[0]
    return q.view(T, h_k, d_k), k.view(T, h_k, d_k), v.view(T, h_v, d_v)
