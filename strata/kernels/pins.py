"""The one way a launch choice is pinned for a block: a ContextVar set on entry and restored on
exit, also on error (threads and tasks do not see each other's pins). Each `pin_*` checks its
value, then runs its block inside `pinned`; a pin among named choices is `pinned_one_of`."""
from __future__ import annotations

import contextlib
from contextvars import ContextVar

from strata.errors import StrataError


@contextlib.contextmanager
def pinned(var: ContextVar, value):
    """`var` holds `value` inside the block; its previous value comes back on exit."""
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


def pinned_one_of(var: ContextVar, value, choices: tuple, what: str):
    """`pinned(var, value)` once `value` is one of `choices` (else a StrataError naming `what`
    and the choices): the pins that pick an implementation by name."""
    if value not in choices:
        raise StrataError(f"{what} takes one of {choices}, got {value!r}")
    return pinned(var, value)
