"""The kinds of entry of the hparam tables (strata.packs.hparams): used, refused, inert, and the
bounds a used or refused value is held to."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

USED, REFUSED, INERT = "used", "refused", "inert"
NO_DEFAULT = "<no default>"
ROPE_DICTS = ("rope_parameters", "rope_scaling")   # config.json's RoPE dicts (audited by field)
ROPE = "rope_parameters."


@dataclass(frozen=True)
class OneOf:
    """The values strata implements; () means none: the key must be absent."""
    values: tuple

    def holds(self, v, get) -> bool:
        return any(v == x and isinstance(v, bool) == isinstance(x, bool) for x in self.values)

    def __str__(self) -> str:
        return " or ".join(_show(x) for x in self.values) if self.values else "none (absent)"


@dataclass(frozen=True)
class SameAs:
    """Equal to another key's value (`key`, else `fallback(get)` when that key is absent)."""
    key: str
    fallback: Callable | None = None

    def holds(self, v, get) -> bool:
        want = get(self.key)
        if want is None and self.fallback is not None:
            want = self.fallback(get)
        return want is None or v == want

    def __str__(self) -> str:
        return f"the value of {self.key}"


@dataclass(frozen=True)
class Where:
    """A predicate with its words."""
    test: Callable
    text: str

    def holds(self, v, get) -> bool:
        try:
            return bool(self.test(v))
        except (TypeError, ValueError):
            return False

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class Hp:
    kind: str
    fields: tuple[str, ...] = ()
    ok: OneOf | SameAs | Where | None = None
    why: str = ""
    missing: str = ""
    default: Any = NO_DEFAULT
    array: bool = False
    also: tuple[str, ...] = ()


def _ok(ok):
    return OneOf(tuple(ok)) if isinstance(ok, (tuple, list)) else ok


def used(*fields: str, ok=None, why: str = "", **kw) -> Hp:
    return Hp(USED, fields, _ok(ok), why, **kw)


def refused(ok, why: str, **kw) -> Hp:
    return Hp(REFUSED, (), _ok(ok), why, **kw)


def inert(why: str, *fields: str, **kw) -> Hp:
    return Hp(INERT, fields, None, why, **kw)


def _head_dim(get):   # llama.cpp's fallback head size: n_embd / n_head
    try:
        return int(get("embedding_length")) // int(get("attention.head_count"))
    except (TypeError, ValueError, ZeroDivisionError):
        return None


NONZERO = Where(lambda v: float(v) != 0.0, "a nonzero value")
TOKENIZER = "the tokenizer: strata.tokenize carries it into the pack; token ids, not logits"


def _show(v) -> str:
    s = repr(v)
    return s if len(s) <= 60 else s[:57] + "..."
