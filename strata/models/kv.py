"""The KV cache of a chunked prefill: keys and values of the tokens read so far, per layer.

- KVCache: the model's own (growing or preallocated, the model's dtype, one device per layer)
- PromptKV: the streaming engine's (bf16 or int8, a resident window in VRAM, the older tokens in
  pinned host memory streamed back through a staging buffer for each later chunk's attention)

Legend: P tokens already cached, T tokens of the chunk, Hkv kv heads, hd head dim, L layers.
"""
from __future__ import annotations

import math

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


class PromptKV:
    """One prompt's KV in a fixed placement: of its n_tokens, the oldest `host` = n_tokens - R
    tokens of every layer live in host memory (pinned on CUDA), the newest R = min(n_tokens,
    resident) in VRAM; bf16, or int8 codes with one fp32 scale per token per kv head
    (strata.kernels.attention.kv_int8). Keys join the cache normed and rotated.

    Per layer per chunk at position P: the host-held tokens 0..min(P, host) stream back into that
    layer's staging buffer (`stages[layer]`: a uint8 view of KS·KVB bytes carved from the loan,
    strata.planning.KV_STAGE_BUF) on the copy lane, ordered after the compute that last read it by
    an event, and the attention waits for the copy's event (no host sync). The attention runs
    over [staged host tokens, resident tokens] + the chunk's own keys: `chunk_attention` on CUDA,
    `chunk_attention_torch` on the CPU (one signature). The next layer's copy is issued as soon
    as this layer's attention has read the stage, so it lands while this layer's experts run.
    int8 segments are expanded to bf16 codes for the kernel's bf16 tile path in `scratch[layer]`
    (an AttnScratch over the layout's kv_expand_k / kv_expand_v / attn_state buffers,
    strata.planning.KV_EXPAND_BUFS; absent: the launcher allocates its own).

    Legend: S tokens, Hkv kv heads, hd head dim; storage per layer is [S, Hkv, hd] (+ [S, Hkv]
    scales), the layout KVSegment reads."""

    def __init__(self, n_layer: int, n_kv_head: int, head_dim: int, n_tokens: int, *,
                 kv: str = "bf16", resident: int | None = None, devices, stages=None,
                 lanes=None, pin: bool = False, scratch=None):
        from strata.kernels.attention.kv_int8 import KV_DTYPES
        if kv not in KV_DTYPES:
            raise StrataError(f"kv dtype must be one of {KV_DTYPES}, got {kv!r}")
        self.kv, self.length, self.n_tokens = kv, 0, n_tokens
        self.res = n_tokens if resident is None else min(n_tokens, resident)
        self.host = n_tokens - self.res
        self.Hkv, self.hd = n_kv_head, head_dim
        self.devices = list(devices)
        self.lanes = lanes or {}
        self.scratch = scratch or {}   # layer -> AttnScratch (int8 on CUDA)
        self.code = torch.int8 if kv == "int8" else torch.bfloat16
        self.streamed = 0          # bytes of host KV copied back to the stages
        if self.host and stages is None:
            raise StrataError("a prompt whose KV lives partly in host memory needs staging "
                              "buffers (the layout's kv_stage)")
        self.resident = [self._store(self.res, d) for d in self.devices]
        hostdev = torch.device("cpu")
        self.hosted = [self._store(self.host, hostdev, pin=pin) for _ in range(n_layer)]
        self.stages = ({l: self._view(stages[l], self.host) for l in range(n_layer)}
                       if self.host else {})
        self._ready: dict[int, object] = {}    # layer -> event of its staged copy

    # -- storage ---------------------------------------------------------------------------
    def _store(self, n: int, device, pin: bool = False) -> list[torch.Tensor]:
        mk = dict(device=device, pin_memory=pin)
        parts = [torch.empty(n, self.Hkv, self.hd, dtype=self.code, **mk) for _ in range(2)]
        if self.kv == "int8":
            parts += [torch.empty(n, self.Hkv, dtype=torch.float32, **mk) for _ in range(2)]
        return parts

    def _view(self, buf: torch.Tensor, n: int) -> list[torch.Tensor]:
        """k, v (and k_scale, v_scale) views of n tokens over a uint8 stage of n·KVB bytes."""
        flat, out, at = buf.reshape(-1), [], 0
        shapes = [((n, self.Hkv, self.hd), self.code)] * 2
        if self.kv == "int8":
            shapes += [((n, self.Hkv), torch.float32)] * 2
        for shp, dt in shapes:
            nb = math.prod(shp) * dt.itemsize
            out.append(flat[at:at + nb].view(dt).view(shp))
            at += nb
        if at > flat.numel():
            raise StrataError(f"the KV stage holds {flat.numel():,} B but {n} tokens need {at:,}")
        return out

    @staticmethod
    def _segment(parts, n: int):
        from strata.kernels.attention import KVSegment
        return KVSegment(*[p[:n] for p in parts])

    # -- the chunk's protocol -------------------------------------------------------------
    def stage(self, layer: int) -> None:
        """Issue the copy of `layer`'s host-held tokens seen by the current chunk into its stage
        (after everything the compute lane has queued: the stage's last reader, the host writes)."""
        n = min(self.length, self.host)
        if n == 0 or layer in self._ready:
            return
        lane = self.lanes.get(layer)
        after = lane.event() if lane is not None else None
        done = None
        for dst, src in zip(self.stages[layer], self.hosted[layer]):
            if lane is None:
                dst[:n].copy_(src[:n])
            else:
                _, done = lane.copy_into(dst[:n], src[:n], after=after)
            self.streamed += src[:n].numel() * src.element_size()
        self._ready[layer] = done

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               **extra) -> torch.Tensor:
        """q [T, H, hd], k, v [T, Hkv, hd] (bf16, normed and rotated) of the chunk at
        positions length.. -> o [T, H, hd] bf16; then k, v join the cache. `extra`: the
        attention's window / sinks (chunk_attention's keywords), for the layers that have them.
        A sliding layer still keeps (and stages) every token: its window only masks."""
        from strata.kernels.attention import chunk_attention_for
        P = self.length
        n_host, n_res = min(P, self.host), max(0, P - self.host)
        prefix = []
        if n_host:
            self.stage(layer)
            lane = self.lanes.get(layer)
            if lane is not None:
                lane.wait(self._ready[layer])
            prefix.append(self._segment(self.stages[layer], n_host))
        if n_res:
            prefix.append(self._segment(self.resident[layer], n_res))
        fn = chunk_attention_for(q.device)      # Triton on CUDA, unless pinned
        o = fn(q, k, v, prefix, scratch=self.scratch.get(layer), **extra)
        self._append(layer, k, v)
        nxt = layer + 1
        if n_host and nxt in self.stages:
            self.stage(nxt)     # the next layer's copy overlaps this layer's experts
        return o

    def _append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        P, T = self.length, k.shape[0]
        if P + T > self.n_tokens:
            raise StrataError(f"the KV holds {self.n_tokens} tokens; a chunk of {T} at position "
                              f"{P} does not fit")
        if self.kv == "int8":
            from strata.kernels.attention.kv_int8 import quantize_kv
            (kq, ks), (vq, vs) = (quantize_kv(k, validate=False),
                                  quantize_kv(v, validate=False))
            vals = [kq, vq, ks, vs]
        else:
            vals = [k, v]
        h = max(0, min(P + T, self.host) - P)      # this chunk's tokens that go to the host
        for dst, src in zip(self.hosted[layer], vals):
            if h:
                dst[P:P + h].copy_(src[:h], non_blocking=True)
        for dst, src in zip(self.resident[layer], vals):
            if T - h:
                a = P + h - self.host
                dst[a:a + T - h].copy_(src[h:])

    def commit(self, n_tokens: int) -> None:
        self.length += n_tokens
        self._ready.clear()

    def release(self) -> None:
        """Drop every tensor (the resident KV, the pinned host KV, the stage and scratch views)."""
        self.resident, self.hosted, self.stages, self._ready = [], [], {}, {}
        self.scratch = {}

    @property
    def host_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for parts in self.hosted for t in parts)
