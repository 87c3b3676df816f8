"""The KL-divergence base file: llama-perplexity's own `--kl-divergence-base` layout, followed by
strata's identity trailer.

    offset  what
    0       b"_logits_"
    8       int32 ctx, int32 n_vocab, int32 n_windows
    20      int32 tokens [n_windows · ctx]        the text's tokens as windowed (BOS not applied)
    ...     uint16 rows [n_windows, ctx - 1 - ctx/2, NV]   strata.instruments.logprobs
    ...     trailer: UTF-8 JSON, uint64 its length, b"STRATAKL"

Why llama.cpp's layout rather than top-k plus the rest's mass: the KLD it gives is the one
llama.cpp computes from the same 16-bit rows (a top-k base would be a lower bound on it, by the
data-processing inequality, and could not be compared within 1e-3), and a base file moves both
ways: llama-perplexity --kl-divergence reads strata's (it stops before the trailer), and strata
reads llama.cpp's (without a trailer the text is still checked token by token). The price is
2·V bytes per scored token (V = 151936: 297 KiB; a 512-token window scores 255 tokens, 76 MB).

The trailer names what the rows mean: the tokenizer (a SHA-256 of its vocabulary: every
token's text and id, and the BOS id it adds) and a SHA-256 of the tokens, so a base made with
another tokenizer or from another text is refused in one line rather than compared.

    with BaseWriter(path, windows, n_vocab, identity) as w:   # written whole or not at all
        w.add(rows)                                           # uint16 [n_scored, NV] per window
    base = Base.open(path); base.check(...); base.rows(i)
"""
from __future__ import annotations

import hashlib
import json
import struct
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import torch

from strata.atomic import atomic_write
from strata.errors import StrataError
from strata.instruments.logprobs import row_width
from strata.instruments.windows import Windows

MAGIC, TRAILER_MAGIC = b"_logits_", b"STRATAKL"
FORMAT = "strata-kld/1"


def vocab_sha256(entry: dict) -> str:
    """A pack tokenizer entry's identity: SHA-256 of its vocabulary (text -> id, the added
    tokens included) and the BOS id it prepends; the normalizer and merges are not in it, the
    token hash covers what they do to this text."""
    tj = json.loads(entry["json"])
    vocab = dict(tj.get("model", {}).get("vocab") or {})
    for t in tj.get("added_tokens") or []:
        vocab[t["content"]] = t["id"]
    blob = json.dumps({"vocab": sorted(vocab.items(), key=lambda kv: (kv[1], kv[0])),
                       "add_bos": entry.get("add_bos")}, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


def tokens_sha256(tokens: torch.Tensor) -> str:
    return hashlib.sha256(tokens.to(torch.int32).numpy().astype("<i4").tobytes()).hexdigest()


class BaseWriter:
    """Writes a base file window by window into a temp file, renamed onto `path` only when every
    window was added (an error or Ctrl-C leaves nothing)."""

    def __init__(self, path, windows: Windows, n_vocab: int, identity: dict):
        self.path, self.w, self.n_vocab = Path(path), windows, n_vocab
        self.identity = {"format": FORMAT, **identity, "ctx": windows.ctx, "n_vocab": n_vocab,
                         "tokens_sha256": tokens_sha256(windows.tokens)}
        self.added = 0

    def __enter__(self) -> "BaseWriter":
        self._stack = ExitStack()
        tmp = self._stack.enter_context(atomic_write(self.path))
        self.f = self._stack.enter_context(open(tmp, "wb"))
        self.f.write(MAGIC + struct.pack("<iii", self.w.ctx, self.n_vocab, self.w.n))
        self.f.write(self.w.tokens.to(torch.int32).numpy().astype("<i4").tobytes())
        return self

    def add(self, rows: np.ndarray) -> None:
        want = (self.w.n_scored, row_width(self.n_vocab))
        if rows.shape != want or rows.dtype != np.uint16:
            raise ValueError(f"base rows {rows.dtype}{list(rows.shape)}, want uint16{list(want)}")
        self.f.write(np.ascontiguousarray(rows).astype("<u2").tobytes())
        self.added += 1

    def __exit__(self, kind, exc, tb):
        if kind is None:
            try:
                self._finish()
            except BaseException as e:      # the temp file goes with the failure
                self._stack.__exit__(type(e), e, e.__traceback__)
                raise
        return self._stack.__exit__(kind, exc, tb)

    def _finish(self) -> None:
        if self.added != self.w.n:
            raise StrataError(f"{self.path}: {self.added} of {self.w.n} windows written")
        trailer = json.dumps(self.identity).encode()
        self.f.write(trailer + struct.pack("<Q", len(trailer)) + TRAILER_MAGIC)


class Base:
    """A base file opened for reading: ctx, n_vocab, tokens (int64 [n·ctx]), identity (the
    trailer's dict, or None for a file llama.cpp wrote) and rows(i)."""

    def __init__(self, path, ctx, n_vocab, n, tokens, identity, rows_at):
        self.path, self.ctx, self.n_vocab, self.n = Path(path), ctx, n_vocab, n
        self.tokens, self.identity, self._rows_at = tokens, identity, rows_at
        self.n_scored = ctx - 1 - ctx // 2
        self._mm = None

    @classmethod
    def open(cls, path, flag: str = "--kld") -> "Base":
        p = Path(path)
        if not p.is_file():
            what = "is a folder" if p.is_dir() else "does not exist"
            raise StrataError(f"{flag} {p} {what}; give a base file written by --kld-save (or "
                              f"llama-perplexity --kl-divergence-base)")
        size = p.stat().st_size
        with open(p, "rb") as f:
            head = f.read(20)
            if len(head) < 20 or head[:8] != MAGIC:
                raise StrataError(f"{flag} {p} is not a KL-divergence base file (no _logits_ "
                                  f"header); write one with --kld-save")
            ctx, n_vocab, n = struct.unpack("<iii", head[8:])
            if ctx < 2 or n_vocab < 1 or n < 1:
                raise StrataError(f"{flag} {p}: its header (ctx {ctx}, vocabulary {n_vocab}, "
                                  f"{n} windows) is corrupted")
            rows_at = 20 + 4 * n * ctx
            body = rows_at + 2 * n * (ctx - 1 - ctx // 2) * row_width(n_vocab)
            if size < body:
                raise StrataError(f"{flag} {p} is cut short ({size:,} of {body:,} bytes); "
                                  f"write it again")
            tokens = torch.from_numpy(np.fromfile(f, dtype="<i4", count=n * ctx)
                                      .astype(np.int64))
            identity = _trailer(f, p, flag, body, size)
        return cls(p, ctx, n_vocab, n, tokens, identity, rows_at)

    def rows(self, i: int) -> np.ndarray:
        """uint16 [n_scored, NV]: window i's base rows."""
        if self._mm is None:
            self._mm = np.memmap(self.path, dtype="<u2", mode="r", offset=self._rows_at,
                                 shape=(self.n, self.n_scored, row_width(self.n_vocab)))
        return np.asarray(self._mm[i])

    def check(self, *, vocab_sha: str | None, n_vocab: int, ctx: int | None,
              tokens: torch.Tensor | None, flag: str = "--kld") -> None:
        """Refuse, in one line, a base this read cannot be compared with: another vocabulary
        or tokenizer, another window, another text."""
        p = self.path
        if n_vocab != self.n_vocab:
            raise StrataError(f"{flag} {p} holds log-probs over {self.n_vocab:,} tokens; this "
                              f"pack's vocabulary has {n_vocab:,}: the base is of another model")
        theirs = (self.identity or {}).get("vocab_sha256")
        if theirs and vocab_sha and theirs != vocab_sha:
            raise StrataError(f"{flag} {p} was made with another tokenizer "
                              f"({self.identity.get('tokenizer', '?')}, vocabulary "
                              f"{theirs[:12]}) than this pack's ({vocab_sha[:12]}); make the base "
                              f"from a pack of the same model")
        if ctx is not None and ctx != self.ctx:
            raise StrataError(f"{flag} {p} was made with --ctx {self.ctx}, not {ctx}; drop "
                              f"--ctx or give --ctx {self.ctx}")
        if tokens is not None:
            mine = tokens[:self.n * self.ctx]
            if mine.numel() < self.n * self.ctx:
                raise StrataError(f"{flag} {p} covers {self.n * self.ctx:,} tokens but the text "
                                  f"gives {tokens.numel():,}: it was made from another text")
            diff = torch.nonzero(mine != self.tokens)
            if diff.numel():
                raise StrataError(f"{flag} {p} was made from another text (or tokenization): "
                                  f"its tokens differ from this text's at position "
                                  f"{int(diff[0]):,}")


def _trailer(f, p: Path, flag: str, body: int, size: int) -> dict | None:
    if size == body:
        return None          # llama-perplexity's own file
    if size < body + 16:
        raise StrataError(f"{flag} {p} has {size - body} stray bytes after its rows; it is "
                          f"corrupted")
    f.seek(size - 16)
    n, magic = struct.unpack("<Q8s", f.read(16))
    if magic != TRAILER_MAGIC or body + n + 16 != size:
        raise StrataError(f"{flag} {p} has {size - body} bytes after its rows that are not "
                          f"strata's trailer; it is corrupted")
    f.seek(body)
    try:
        ident = json.loads(f.read(n).decode())
    except (ValueError, UnicodeDecodeError):
        raise StrataError(f"{flag} {p}: its trailer is not readable JSON; it is "
                          f"corrupted") from None
    if not isinstance(ident, dict) or ident.get("format") != FORMAT:
        raise StrataError(f"{flag} {p}: its trailer is not a {FORMAT} identity")
    return ident

