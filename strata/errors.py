"""User-facing errors.

A StrataError says what is wrong and what to do; the CLI prints it as one line and exits 2.
Anything else escaping is a bug in strata.
"""


class StrataError(Exception):
    """Bad input or an impossible request, explained for the person who made it."""


class PlanError(StrataError):
    """A plan that cannot fit: names the bytes needed and the room."""


class AllocationError(StrataError):
    """A device allocation failed mid-prompt; the request fails, the engine stays usable."""


def first_line(e: BaseException) -> str:
    """An exception's first line (its type's name when it says nothing)."""
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def allocation_failed(e: BaseException) -> str:
    """The line a prompt fails with when a device allocation fails mid-prompt (the engine
    refilled the cache on the way out: strata.engine.session.PromptSession)."""
    return (f"a device allocation failed mid-prompt ({first_line(e)}); the request failed and "
            f"the cache was refilled; try a smaller --chunk or more --vram")
