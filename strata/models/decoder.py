"""What every decoder wiring shares: token checks and the chunk loop of a prefill.

A wiring (strata.models.qwen3moe) subclasses `Decoder` and provides `shape`, `device`,
`lm_head`, `new_cache(capacity)` and `forward_chunk(tokens, cache, provider, logits=, observer=)`;
`prefill` cuts a prompt into chunks and brackets them with the provider's protocol calls
(strata.models.provider).
"""
from __future__ import annotations

import torch

from strata.errors import StrataError


class Decoder:
    def check_tokens(self, tokens) -> torch.Tensor:
        """1-D int64 ids inside the vocabulary, on the model's device (else a StrataError)."""
        tokens = torch.as_tensor(tokens, dtype=torch.int64)
        if tokens.ndim != 1 or tokens.numel() == 0:
            raise StrataError(f"tokens must be a non-empty 1-D list of ids, got shape "
                              f"{list(tokens.shape)}")
        bad = (tokens < 0) | (tokens >= self.shape.vocab)
        if bool(bad.any()):
            i = int(torch.nonzero(bad)[0])
            raise StrataError(f"token id {int(tokens[i])} at position {i} is outside the "
                              f"vocabulary [0, {self.shape.vocab})")
        return tokens.to(self.device)

    def prefill(self, tokens, provider, *, chunk: int | None = None, cache=None, progress=None,
                logits: str = "all", observer=None, packed=None) -> torch.Tensor | None:
        """Logits fp32 of a prompt read in chunks of `chunk` tokens (all at once if None):
        logits="all" -> [T, V]; "last" -> [1, V] (the next-token logits; a 32K prompt's [T, V]
        would not fit in memory at V = 151936); "none" -> None (a timed read skips the LM head).
        `progress(n_tokens_done)` after each chunk; `observer` (strata.models.observe) sees each
        layer's routing and residual. `packed` (strata.models.packed.Packed): the tokens are
        several independent sequences back to back, read as one chunk into an empty `cache`
        (block-diagonal causal attention, positions restarting per sequence); "last" then
        gives each sequence's next-token logits, [n, V]."""
        if logits not in ("all", "last", "none"):
            raise StrataError(f"logits must be 'all', 'last' or 'none', got {logits!r}")
        tokens = self.check_tokens(tokens)
        T = tokens.numel()
        chunk = T if chunk is None else int(chunk)
        if chunk < 1:
            raise StrataError(f"chunk must be at least 1 token, got {chunk}")
        cache = cache if cache is not None else self.new_cache(capacity=T)
        if packed is not None:
            packed.check_chunk(T, cache.length, chunk)
        rows = T if logits == "all" else (1 if packed is None else len(packed.lengths))
        out = (torch.zeros(rows, self.shape.vocab, dtype=torch.float32,
                           device=self.lm_head.device) if logits != "none" else None)
        provider.begin_prompt(T, min(chunk, T))
        ok = False
        cache.packed = packed     # the chunk's sequence layout: its attention and positions read it
        try:
            for start in range(0, T, chunk):
                part = tokens[start:start + chunk]
                last = start + part.numel() == T
                mode = logits if logits != "last" else ("last" if last else "none")
                provider.begin_chunk(cache.length, part.numel())
                y = self.forward_chunk(part, cache, provider, logits=mode, observer=observer)
                provider.end_chunk()
                if mode == "all":
                    out[start:start + part.numel()] = y
                elif mode == "last":
                    out[:] = y
                if progress is not None:
                    progress(start + part.numel())
            ok = True
        finally:
            cache.packed = None
            provider.end_prompt(ok)
        return out
