"""The KV cache of a chunked prefill: keys and values of the tokens read so far, per layer.

Legend: P tokens already cached, T tokens of the chunk, Hkv kv heads, hd head dim, L layers.
"""
from __future__ import annotations

import torch

from strata.errors import StrataError


class KVCache:
    """Keys and values of the tokens read so far, per layer: [Hkv, P, hd] each (post-RoPE keys).

    `capacity` (tokens) preallocates; without it the cache grows by concatenation. `length` is P,
    the absolute position of the next chunk's first token; it advances in `commit` once every layer
    has appended the chunk."""

    def __init__(self, n_layer: int, n_kv_head: int, head_dim: int, *,
                 capacity: int | None = None, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu"):
        """`device`: one device, or one per layer (a layer split over GPUs keeps each layer's
        KV on that layer's GPU)."""
        self.capacity, self.length = capacity, 0
        devs = list(device) if isinstance(device, (list, tuple)) else [device] * n_layer
        n = capacity if capacity is not None else 0
        self.k = [torch.zeros(n_kv_head, n, head_dim, dtype=dtype, device=d) for d in devs]
        self.v = [torch.zeros(n_kv_head, n, head_dim, dtype=dtype, device=d) for d in devs]

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Add this chunk's k, v [Hkv, T, hd] to `layer`; returns all keys/values [Hkv, P+T, hd]."""
        P, T = self.length, k.shape[1]
        if self.capacity is None:
            self.k[layer] = torch.cat([self.k[layer], k], dim=1)
            self.v[layer] = torch.cat([self.v[layer], v], dim=1)
            return self.k[layer], self.v[layer]
        if P + T > self.capacity:
            raise StrataError(f"KV cache holds {self.capacity} tokens; a chunk of {T} at position "
                              f"{P} does not fit")
        self.k[layer][:, P:P + T] = k
        self.v[layer][:, P:P + T] = v
        return self.k[layer][:, :P + T], self.v[layer][:, :P + T]

    def commit(self, n_tokens: int) -> None:
        self.length += n_tokens
