"""The one way a launch choice is pinned for a block: a ContextVar set on entry and restored on
exit, also on error (threads and tasks do not see each other's pins). Each `pin_*` checks its
value, then runs its block inside `pinned`."""
from __future__ import annotations

import contextlib
from contextvars import ContextVar


@contextlib.contextmanager
def pinned(var: ContextVar, value):
    """`var` holds `value` inside the block; its previous value comes back on exit."""
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)
