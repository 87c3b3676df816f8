"""Triton's interpreter with one patch of triton.language per launch (`lean`).

Without a GPU strata's kernels run in Triton's interpreter (strata._backend). Triton 3.6's
interpreter patches triton.language when a launch starts (every builtin of tl, tl.tensor and
tl.math, found by inspect.getmembers) and restores it when the grid is done; it patches it again
at every call of a @triton.jit helper inside the kernel, where the launch's patch already holds
and the scan finds nothing left to patch. The decoders and epilogues are such helpers, called at
every reduction step, so that scan was about a fifth of an interpreted engine read (a Q4_K_M
plane-int8 read: 54 s, 44 s without it). `lean()` lets a helper called inside a launch reuse the
launch's patch when the launch (or an earlier helper of it) patched every language module the
helper's module sees; a helper called outside a launch is patched as before. The kernels run the
same code with the same semantics (tests/kernels/test_interpreter.py).
"""
from __future__ import annotations

LEAN_TRITON = "3.6."     # the interpreter whose internals lean() wraps (pyproject pins 3.6.x)


class _Launch:
    pending = False      # a launch is about to patch the language for its grid
    langs = None         # the language modules the running launch patched (ids), or None


STOCK: dict = {}         # the interpreter's own _patch_lang and GridExecutor.__call__ (tests)


def lean() -> bool:
    """Install the one-patch-per-launch interpreter (idempotent); False where this triton's
    interpreter is not the one it wraps (then nothing changes)."""
    import triton
    from triton.runtime import interpreter as it
    if getattr(it, "_strata_lean", False):
        return True
    if not triton.__version__.startswith(LEAN_TRITON) or not all(
            hasattr(it, n) for n in ("_patch_lang", "_LangPatchScope", "GridExecutor")):
        return False
    import triton.language as tl
    real_patch, real_call = it._patch_lang, it.GridExecutor.__call__
    STOCK.update(patch_lang=real_patch, call=real_call)

    def seen(fn) -> frozenset:
        # the modules _patch_lang patches for fn: tl and tl.core where fn's module names them
        return frozenset(id(v) for v in fn.__globals__.values() if v is tl or v is tl.core)

    def patch_lang(fn):
        if _Launch.pending:                  # the launch's own patch, for its whole grid
            _Launch.pending = False
            scope = real_patch(fn)
            _Launch.langs = seen(fn)
            return scope
        langs = seen(fn)
        if _Launch.langs is None:
            return real_patch(fn)
        if langs <= _Launch.langs:
            return it._LangPatchScope()      # a helper inside the launch: already patched
        # a helper seeing another module (triton's own, tl.core): the stock call patches it
        # and never restores it, so it stays patched for the rest of the launch
        scope = real_patch(fn)
        _Launch.langs = _Launch.langs | langs
        return scope

    def call(self, *args, **kwargs):
        _Launch.pending = True
        try:
            return real_call(self, *args, **kwargs)
        finally:
            _Launch.pending, _Launch.langs = False, None

    it._patch_lang = patch_lang
    it.GridExecutor.__call__ = call
    it._strata_lean = True
    return True
