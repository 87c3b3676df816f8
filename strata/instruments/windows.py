"""A text's tokens as llama-perplexity's windows.

    w = Windows.of(tokens, ctx=512, bos=tok.add_bos)   # tokens: the whole text, BOS first if any
    w.n                     number of windows: len(tokens) // ctx (the tail is dropped)
    w.first                 ctx // 2: the first position whose logits are scored
    w.n_scored              ctx - 1 - first tokens scored per window
    w.ids(i)                int64 [ctx]: window i as read, its first token replaced by BOS when
                            the vocabulary adds one (every window starts like a fresh prompt)
    w.targets(i)            int64 [n_scored]: the tokens the scored logits predict, the text's
                            own tokens at positions first+1 .. ctx-1 of window i

The logits of position p predict token p + 1, so a window scores its positions first .. ctx-2;
the first half only gives the model context (llama.cpp's protocol, after Hugging Face's
"perplexity of fixed-length models").

The instrument reads logits through a `Read` function:

    read(ids: int64 [n, ctx]) -> float32 [n, n_scored, V]   logits of positions first .. ctx-2

called with a batch of windows at a time; strata.commands.perplexity reads them as packed
sequences (strata.models.packed), one chunk a batch.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from strata.errors import StrataError

Read = Callable[[torch.Tensor], torch.Tensor]

MIN_CTX = 4     # the smallest window that scores a token: first = 2, scored position 2


def check_ctx(ctx: int, max_pos: int | None = None, *, even: bool = True) -> None:
    """--ctx must be even, at least MIN_CTX, and within the model's context (one line each);
    `even=False` for a window a base file brings (llama.cpp takes an odd one: first = ctx//2)."""
    if ctx < MIN_CTX:
        raise StrataError(f"--ctx {ctx} is too small: a window needs at least {MIN_CTX} tokens "
                          f"(its first half is context, its second half is scored)")
    if even and ctx % 2:
        raise StrataError(f"--ctx {ctx} is odd; give an even window (half context, half "
                          f"scored), e.g. {ctx + 1}")
    if max_pos is not None and ctx > max_pos:
        raise StrataError(f"--ctx {ctx} is longer than the model's context of {max_pos} tokens; "
                          f"give a smaller --ctx")


@dataclass(frozen=True)
class Windows:
    tokens: torch.Tensor        # int64 [n·ctx]: the text's tokens that windows cover
    ctx: int
    bos: int | None             # the id that replaces each window's first token, or None

    @classmethod
    def of(cls, tokens, ctx: int, bos: int | None, *, what: str = "the text",
           even: bool = True, min_windows: int = 2) -> "Windows":
        """The windows of `tokens`; fewer than 2·ctx tokens are refused as llama.cpp refuses a
        text (a base file's tokens, windowed already, may hold one: min_windows=1)."""
        check_ctx(ctx, even=even)
        t = torch.as_tensor(tokens, dtype=torch.int64).flatten()
        if t.numel() < min_windows * ctx:
            raise StrataError(f"{what} tokenizes to {t.numel():,} tokens; perplexity at --ctx "
                              f"{ctx} needs at least {min_windows * ctx:,} (two windows): give "
                              f"a longer text or a smaller --ctx")
        n = t.numel() // ctx
        return cls(t[:n * ctx].clone(), ctx, bos)

    @property
    def n(self) -> int:
        return self.tokens.numel() // self.ctx

    @property
    def first(self) -> int:
        return self.ctx // 2

    @property
    def n_scored(self) -> int:
        return self.ctx - 1 - self.first

    def ids(self, i: int) -> torch.Tensor:
        w = self.tokens[i * self.ctx:(i + 1) * self.ctx].clone()
        if self.bos is not None:
            w[0] = self.bos
        return w

    def batch(self, start: int, stop: int) -> torch.Tensor:
        """int64 [stop - start, ctx]: windows start .. stop-1 as read."""
        return torch.stack([self.ids(i) for i in range(start, stop)])

    def targets(self, i: int) -> torch.Tensor:
        base = i * self.ctx
        return self.tokens[base + self.first + 1:base + self.ctx]
