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
