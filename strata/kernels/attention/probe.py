"""Launch-time choices of the chunk attention that are not its tile: which implementation a
caller gets on a device, and probe launches (the warm-up's).

    with probe_launches():        # every chunk_attention / expand_codes launch: one program
        chunk_attention(q, k, v, prefix, scratch=s)
    with pin_attention("triton"): # the Triton launcher on the CPU too (the interpreter: tests)
        chunk_attention_for(q.device)

A probe launch passes the kernel exactly the arguments the real launch passes (the same
constexprs, the same integer and pointer arguments, so Triton compiles and loads the same
variant: its cache key never includes the grid) but runs only the grid's first program: one
block of rows against the keys it sees. That is how the engine's warm-up reaches the launches
of a long prompt's later chunks (a long int8 prefix cut into pieces: the first, middle and last
launches, their expansions) without paying their attention (strata.engine.warm). What a probe
writes is not a result: its output, scratch and carried state are garbage afterwards.

Both are ContextVars, restored on exit (threads do not see each other's choice).
"""
from __future__ import annotations

import contextlib
from contextvars import ContextVar

from strata.kernels.pins import pinned, pinned_one_of

ATTENTION_IMPLS = ("triton", "torch")

_PROBE: ContextVar[bool] = ContextVar("strata_attn_probe", default=False)
_IMPL: ContextVar[str | None] = ContextVar("strata_attn_impl", default=None)


@contextlib.contextmanager
def probe_launches():
    """Inside the block every attention launch (the attention kernel and the int8 expansion)
    runs its grid's first program only (see the module docstring)."""
    with pinned(_PROBE, True):
        yield


def probing() -> bool:
    return _PROBE.get()


def probe_grid(grid: tuple[int, ...]) -> tuple[int, ...]:
    """The grid a launch runs: `grid`, or its first program when probing."""
    return tuple(1 for _ in grid) if _PROBE.get() else grid


def pin_attention(impl: str):
    """Force the implementation `attention_impl` names inside the block: "triton" (the Triton
    launcher, on the CPU through the interpreter) or "torch" (the plain-torch twin)."""
    return pinned_one_of(_IMPL, impl, ATTENTION_IMPLS, "pin_attention")


def attention_impl(device) -> str:
    """"triton" on CUDA, "torch" elsewhere, unless pinned."""
    pinned = _IMPL.get()
    if pinned is not None:
        return pinned
    return "triton" if str(device).startswith("cuda") else "torch"
