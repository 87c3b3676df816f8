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


def pinned_record(var: ContextVar, in_force, launch, changes: dict, what: str):
    """`pinned(var, ...)` of a launch record (a frozen dataclass): `launch` (or `in_force`, the
    record in force) with the fields `changes` names replaced; a record of another type or an
    unknown field is a StrataError naming `what` and the fields (the record's own __post_init__
    checks the values)."""
    from dataclasses import fields, replace
    kind = type(in_force)
    if launch is not None and not isinstance(launch, kind):
        raise StrataError(f"{what} takes a launch record of type {kind.__name__}, got "
                          f"{type(launch).__name__}")
    names = [f.name for f in fields(kind)]
    bad = set(changes) - set(names)
    if bad:
        raise StrataError(f"{what}: unknown field(s) {sorted(bad)}; fields: {', '.join(names)}")
    return pinned(var, replace(launch or in_force, **changes))


# the device a plan is made for (strata plan plans a GPU from any host): launch choices that
# depend on the machine (the delta rule's backend, the prefix blocks' kernel) read it while a
# plan is made, so the plan counts what that device's read takes
_PLAN_TARGET: ContextVar[str | None] = ContextVar("strata_plan_target", default=None)


def planning_for(device_type: str):
    """Inside the block the machine-dependent launch choices resolve for a read on
    `device_type` ("cuda" or "cpu"), not for this process's devices."""
    if device_type not in ("cuda", "cpu"):
        raise StrataError(f"planning_for takes cuda or cpu, got {device_type!r}")
    return pinned(_PLAN_TARGET, device_type)


def plan_target() -> str | None:
    """The device type planning_for names, None outside a plan."""
    return _PLAN_TARGET.get()
