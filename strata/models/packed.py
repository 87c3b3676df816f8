"""Packed sequences: several independent sequences read back to back as one chunk.

Legend: T = sum(lengths) tokens of the chunk, n sequences.

    p = Packed.of([5, 3, 7])        # T = 15, three sequences
    p.starts(dev)    int32 [T]      the chunk index of each token's sequence's first token
                                    (0,0,0,0,0, 5,5,5, 8,...): attention's block-diagonal mask
                                    (query t sees keys starts[t]..t)
    p.positions(dev) int64 [T]      each token's position in its own sequence (0..4, 0..2,
                                    0..6): RoPE restarts per sequence
    p.bounds         [(a, b)]       each sequence's chunk rows a..b-1

A packed chunk is read alone: the KV holds nothing before it (no sequence continues one in the
cache, none spans two chunks), so the experts stream once for all n sequences and the KV of
one batch never meets the next's (each batch is a prompt of its own).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from strata.errors import StrataError


@dataclass(frozen=True)
class Packed:
    lengths: tuple[int, ...]

    @classmethod
    def of(cls, lengths) -> "Packed":
        lengths = tuple(int(n) for n in lengths)
        if not lengths or min(lengths) < 1:
            raise StrataError(f"packed sequences need one or more lengths >= 1, got "
                              f"{list(lengths)}")
        return cls(lengths)

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

    def starts(self, device) -> torch.Tensor:
        return torch.cat([torch.full((b - a,), a, dtype=torch.int32)
                          for a, b in self.bounds]).to(device)

    def positions(self, device) -> torch.Tensor:
        return torch.cat([torch.arange(b - a) for a, b in self.bounds]).to(device)
