"""Packed sequences: several independent sequences read back to back as one chunk.

Legend: T = sum(lengths) tokens of the chunk, n sequences.

    p = Packed.of([5, 3, 7])        # T = 15, three sequences
    p.starts(dev)    int32 [T]      the chunk index of each token's sequence's first token
                                    (0,0,0,0,0, 5,5,5, 8,...): attention's block-diagonal mask
                                    (query t sees keys starts[t]..t)
    p.positions(dev) int64 [T]      each token's position in its own sequence (0..4, 0..2,
                                    0..6): RoPE restarts per sequence
    p.bounds         [(a, b)]       each sequence's chunk rows a..b-1
    p.last_rows(x)   [n, ...]       each sequence's last row (logits="last" of a packed read:
                                    every sequence's next-token logits)

A packed chunk is read alone: the KV holds nothing before it (no sequence continues one in the
cache, none spans two chunks), so the experts stream once for all n sequences and the KV of
one batch never meets the next's (each batch is a prompt of its own). A linear-attention
layer's recurrent state restarts at zero for each sequence (strata.models.qwen3_next).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from strata.errors import StrataError


@dataclass(frozen=True)
class Packed:
    lengths: tuple[int, ...]
    _on: dict = field(default_factory=dict, compare=False, repr=False)   # device -> starts

    @classmethod
    def of(cls, lengths) -> "Packed":
        lengths = tuple(int(n) for n in lengths)
        if not lengths or min(lengths) < 1:
            raise StrataError(f"packed sequences need one or more lengths >= 1, got "
                              f"{list(lengths)}")
        return cls(lengths)

    def check_chunk(self, T: int, P: int, chunk: int) -> None:
        """A chunk of T tokens at position P read in chunks of `chunk`: it must be this batch,
        whole, with nothing before it (one line each)."""
        if T != self.n_tokens:
            raise StrataError(f"the packed batch holds {self.n_tokens} tokens "
                              f"({len(self.lengths)} sequences); the prompt has {T}")
        if T > chunk:
            raise StrataError(f"a packed batch is read as one chunk: its {T} tokens "
                              f"({len(self.lengths)} sequences) exceed the chunk of {chunk}; "
                              f"put fewer sequences in a batch")
        if P:
            raise StrataError(f"a packed batch is read with an empty KV; this one holds {P} "
                              f"tokens")

    @property
    def n_tokens(self) -> int:
        return sum(self.lengths)

    @property
    def bounds(self) -> list[tuple[int, int]]:
        out, a = [], 0
        for n in self.lengths:
            out.append((a, a + n))
            a += n
        return out

    def last_rows(self, x: torch.Tensor) -> torch.Tensor:
        """Each sequence's last row of x [T, ...] -> [n, ...] (its next-token logits' input)."""
        return x[torch.tensor([b - 1 for _, b in self.bounds], device=x.device)]

    def starts(self, device) -> torch.Tensor:
        """int32 [T] on `device` (made once per device: every layer's attention reads it)."""
        device = torch.device(device)
        if device not in self._on:
            self._on[device] = torch.cat([torch.full((b - a,), a, dtype=torch.int32)
                                          for a, b in self.bounds]).to(device)
        return self._on[device]

    def positions(self, device) -> torch.Tensor:
        return torch.cat([torch.arange(b - a) for a, b in self.bounds]).to(device)


def packed_head(x: torch.Tensor, logits: str, cache) -> tuple[torch.Tensor, str]:
    """(hidden rows, logits mode) the LM head reads for a chunk: with the cache's packed
    sequences, "last" is every sequence's last row (logits [n, V])."""
    packed = getattr(cache, "packed", None)
    if packed is None or logits != "last":
        return x, logits
    return packed.last_rows(x), "all"
