"""The decode loop after a prompt: one token at a time through the model's chunk forward at
T = 1, the prompt's KV extended in place and its experts served as the prompt's were (the
resident arena; streamed: the expert cache, a miss streamed through the ring, one token's K
routed experts per layer). A checking and research loop, not a server: no batching, no
speculative steps, a fixed count of tokens.

    pick = Sampler(temperature=0.0, top_k=0, seed=0)       # greedy unless temperature > 0
    out = decode(model, provider, cache, logits, n=64, pick=pick, providers=[...])
    out.tokens, out.seconds, out.tokens_per_s, out.bytes_streamed, out.routed, out.cache_hits

`logits` are the prompt's last position's (fp32 [1, V] or [V]); the first token is picked from
them, and each later one from the forward of the one before, so n tokens take n - 1 forwards
and the KV must hold the prompt + n - 1 tokens.

The bound beside the measured rate (`decode_bound`): a streamed token's routed experts that
missed the cache cross PCIe, and so does the prompt's host-held KV (a long prompt's older tokens,
staged back at every step's attention), so tokens/s <= rate / (expert + KV bytes streamed per
token); with every expert resident (or every routed one cached) and the KV in VRAM nothing
crosses and the bound is the device's.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from strata.errors import StrataError

PINNED_PCIE_GBPS = 55.4      # pinned PCIe 5 x16 host -> device (the prefill summary's ceiling)


@dataclass
class Sampler:
    """Greedy (temperature 0) or sampled: softmax(logits / temperature) over the top_k logits
    (0: all), drawn from a generator seeded with `seed` (the same tokens every run)."""
    temperature: float = 0.0
    top_k: int = 0
    seed: int = 0
    _gen: torch.Generator = field(init=False, repr=False, default=None)

    def __post_init__(self):
        if self.temperature < 0 or self.top_k < 0:
            raise StrataError(f"--temperature and --top-k must be >= 0, got {self.temperature} "
                              f"and {self.top_k}")
        self._gen = torch.Generator().manual_seed(self.seed)

    def __call__(self, logits: torch.Tensor) -> int:
        x = logits.reshape(-1).float().cpu()
        if self.temperature == 0:
            return int(x.argmax())
        ids = torch.arange(x.numel())
        if self.top_k and self.top_k < x.numel():
            x, ids = torch.topk(x, self.top_k)
        p = torch.softmax(x / self.temperature, dim=0)
        return int(ids[torch.multinomial(p, 1, generator=self._gen)])


@dataclass
class Decoded:
    tokens: list[int]
    forwards: int = 0             # tokens forwarded (n - 1)
    seconds: float = 0.0          # the forwards, synchronized
    bytes_streamed: int = 0       # expert bytes streamed host -> device during them
    kv_bytes_streamed: int = 0    # host-held KV staged back to the device during them
    routed: int = 0               # (layer, expert) pairs routed
    cache_hits: int = 0           # of those, served from the cache

    @property
    def tokens_per_s(self) -> float:
        return self.forwards / self.seconds if self.seconds > 0 else 0.0


def decode(model, provider, cache, logits: torch.Tensor, n: int, pick: Sampler, *,
           providers=(), sync=None) -> Decoded:
    """n tokens after a prompt whose KV is `cache` (room for n - 1 more positions), through
    `provider` (the prompt's). `providers`: the streaming providers whose chunk statistics
    count the decode's traffic; `sync()`: waits for the devices (timing)."""
    if n < 1:
        raise StrataError(f"-n must be at least 1, got {n}")
    marks = [len(p.chunks) for p in providers]
    kv0 = getattr(cache, "streamed", None)    # PromptKV: each step stages its host-held part
    out = Decoded([pick(_finite(logits, 0))])
    if sync is not None:
        sync()
    t0 = time.perf_counter()
    for i in range(1, n):
        tok = torch.tensor([out.tokens[-1]], dtype=torch.int64)
        logits = model.prefill(tok, provider, cache=cache, logits="last")
        out.tokens.append(pick(_finite(logits, i)))   # the host read of each step
        out.forwards += 1
    if sync is not None:
        sync()
    out.seconds = time.perf_counter() - t0
    if kv0 is not None:
        out.kv_bytes_streamed = cache.streamed - kv0
    for p, m in zip(providers, marks):
        for c in p.chunks[m:]:
            c.settle()
            out.bytes_streamed += c.bytes_streamed
            out.routed += c.routed
            out.cache_hits += c.cache_hits
    return out


def _finite(logits: torch.Tensor, step: int) -> torch.Tensor:
    if not bool(torch.isfinite(logits).all()):
        raise StrataError(f"decode step {step}: the logits are not finite (NaN/Inf); the pack "
                          f"or the dtype overflows")
    return logits[-1]


def routed_bytes_per_token(shape, blob_sizes) -> int:
    """Expert bytes one token routes to: K blobs in every MoE layer (all missing the cache)."""
    return sum(shape.top_k * b for l, b in enumerate(blob_sizes) if shape.is_moe_layer(l))


def decode_bound(out: Decoded, shape, blob_sizes, gbps: float | None, resident: bool) -> dict:
    """The decode's bound beside its rate: resident experts (no PCIe), else the measured (or
    declared) host -> device rate over the expert bytes a token streamed, and over the bytes
    every routed expert would take (an empty cache)."""
    routed = routed_bytes_per_token(shape, blob_sizes)
    r = {"tokens_per_s": out.tokens_per_s, "forwards": out.forwards, "seconds": out.seconds,
         "routed_bytes_per_token": routed}
    if resident:
        r.update(bound="resident", bound_tokens_per_s=None)
        return r
    rate = (gbps or PINNED_PCIE_GBPS) * 1e9
    per = out.bytes_streamed / out.forwards if out.forwards else 0.0
    kv = out.kv_bytes_streamed / out.forwards if out.forwards else 0.0
    r.update(bound="pcie", pcie_gbps=rate / 1e9, bytes_streamed_per_token=per,
             kv_bytes_per_token=kv,
             cache_hit_fraction=out.cache_hits / out.routed if out.routed else None,
             bound_tokens_per_s=rate / (per + kv) if per + kv else None,
             empty_cache_bound_tokens_per_s=rate / (routed + kv) if routed + kv else None)
    return r
