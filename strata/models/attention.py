"""Causal GQA self-attention of one chunk against the KV cache (chunked prefill).

Legend: T tokens of the chunk, P tokens already in the cache, D hidden, H query heads,
Hkv kv heads, hd head dim.

    q = Wq x, k = Wk x, v = Wv x                 # [T, H, hd], [T, Hkv, hd], [T, Hkv, hd]
    q, k = qnorm(q), knorm(k)                    # per-head RMSNorm, when the weights carry one
    q, k = rope(q), rope(k)                      # cos/sin from the caller (strata.models.layers)
    o = softmax(q k^T / sqrt(hd) + causal) v     # keys: the P cached + this chunk's T
                                                 # (a PromptKV: chunk_attention over its
                                                 # [host-staged, resident] segments, bf16)
    y = Wo o                                     # [T, D]

The optional pieces are fields of `AttentionWeights` (Qwen3 has q/k norms, Mixtral none); an
architecture with biases, learned sinks or a sliding window adds fields and their steps here, so
the wirings that lack them stay as they are.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from strata.models.kv import KVCache, PromptKV
from strata.models.layers import apply_rope, rms_norm


@dataclass
class AttentionWeights:
    wq: torch.Tensor                     # [H*hd, D]
    wk: torch.Tensor                     # [Hkv*hd, D]
    wv: torch.Tensor                     # [Hkv*hd, D]
    wo: torch.Tensor                     # [D, H*hd]
    q_norm: torch.Tensor | None = None   # [hd] per-head RMSNorm of q before RoPE (None: none)
    k_norm: torch.Tensor | None = None   # [hd] the same for k

    def map(self, fn) -> "AttentionWeights":
        """The same weights with `fn` applied to every tensor (dtype or device moves)."""
        return AttentionWeights(**{k: None if t is None else fn(t) for k, t in vars(self).items()})


@dataclass(frozen=True)
class AttentionShape:
    n_head: int          # H
    n_kv_head: int       # Hkv (H % Hkv == 0: query head h reads kv head h // (H / Hkv))
    head_dim: int        # hd
    norm_eps: float      # eps of the q/k norms


def attention(x: torch.Tensor, w: AttentionWeights, s: AttentionShape, cos: torch.Tensor,
              sin: torch.Tensor, cache: KVCache | PromptKV, layer: int) -> torch.Tensor:
    """x [T, D] (already normed) at positions P..P+T-1 -> [T, D]; appends k, v to `cache`."""
    T = x.shape[0]
    q = (x @ w.wq.t()).view(T, s.n_head, s.head_dim)                 # [T, H, hd]
    k = (x @ w.wk.t()).view(T, s.n_kv_head, s.head_dim)              # [T, Hkv, hd]
    v = (x @ w.wv.t()).view(T, s.n_kv_head, s.head_dim)
    if w.q_norm is not None:
        q = rms_norm(q, w.q_norm, s.norm_eps)
    if w.k_norm is not None:
        k = rms_norm(k, w.k_norm, s.norm_eps)
    q = apply_rope(q.transpose(0, 1), cos, sin)                      # [H, T, hd]
    k = apply_rope(k.transpose(0, 1), cos, sin)                      # [Hkv, T, hd]
    return attend(q, k, v, cache, layer).reshape(T, s.n_head * s.head_dim) @ w.wo.t()


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache | PromptKV,
           layer: int) -> torch.Tensor:
    """q [H, T, hd], k [Hkv, T, hd] (normed, rotated), v [T, Hkv, hd] of the chunk at positions
    P..P+T-1 -> o [T, H, hd] in q's dtype; k, v join `cache` (the attention every GQA wiring
    shares once its projections are done)."""
    T, P = q.shape[1], cache.length
    if isinstance(cache, PromptKV):   # the engine's KV: bf16 or int8, resident + host-held
        bf = torch.bfloat16
        o = cache.attend(layer, q.transpose(0, 1).to(bf), k.transpose(0, 1).to(bf),
                         v.to(bf))                                   # [T, H, hd] bf16
        return o.to(q.dtype)
    k_all, v_all = cache.extend(layer, k, v.transpose(0, 1))         # [Hkv, P+T, hd]
    # GQA without copying K/V per query head (enable_gqa: query head h reads kv head
    # h // (H / Hkv)). A later chunk's query i sits at P+i and sees keys 0..P+i: the causal
    # mask aligned to the bottom right, which flash attention runs without materializing it.
    mask = None if P == 0 else causal_lower_right(T, P + T)
    o = F.scaled_dot_product_attention(q[None], k_all[None], v_all[None], attn_mask=mask,
                                       is_causal=P == 0, enable_gqa=True)[0]  # [H, T, hd]
    return o.transpose(0, 1)                                                  # [T, H, hd]
