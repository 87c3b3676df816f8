"""strata.kernels.interpreter.lean: one patch of triton.language per interpreted launch.

- Installed wherever strata's kernels run interpreted under the pinned triton (3.6.x).
- A kernel calling @triton.jit helpers n times (its own, and tl.sum, whose module sees tl.core)
  scans triton.language (the interpreter's `_patch_builtin`) as often for n = 2 as for n = 16:
  the launch's patch and the first helpers' (tl.core) only, none per call.
- The helper's result is the same as the stock interpreter's (a launch with lean's wrappers
  taken out), and the language is restored after the launch, also after one that raised.
"""
from __future__ import annotations

import pytest
import torch

from strata._backend import INTERPRET
import triton  # noqa: I001  (after strata._backend: the interpreter where there is no GPU)
import triton.language as tl

pytestmark = pytest.mark.skipif(not INTERPRET, reason="the Triton interpreter (no GPU) only")


@triton.jit
def _twice_plus(x, c):
    return x * 2 + c


@triton.jit
def _loop(X, Y, N_CALLS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(X + offs)
    for i in tl.static_range(N_CALLS):
        # tl.sum: a helper of triton's own (its module sees tl.core, which the launch did not
        # patch: the first call patches it for the rest of the launch)
        x = _twice_plus(x, i) + tl.sum(x * 0, axis=0)
    tl.store(Y + offs, x)


def _count_scans(monkeypatch):
    from triton.runtime import interpreter as it
    calls = []
    real = it._patch_builtin

    def counted(*a, **k):
        calls.append(1)
        return real(*a, **k)
    monkeypatch.setattr(it, "_patch_builtin", counted)
    return calls


def _scans(monkeypatch) -> dict:
    """{helper calls n: language scans of one launch calling it n times}, checking its values."""
    _run(_loop, 2)   # a first launch: what the stock interpreter leaves patched is then left
    scans = {}
    for n in (2, 16):
        calls = _count_scans(monkeypatch)
        assert torch.equal(_run(_loop, n), _want(n))
        scans[n] = len(calls)
    return scans


def _run(kernel, n_calls: int) -> torch.Tensor:
    x = torch.arange(16, dtype=torch.float32)
    y = torch.full_like(x, float("nan"))
    kernel[(1,)](x, y, N_CALLS=n_calls, BLOCK=16)
    return y


def _want(n_calls: int) -> torch.Tensor:
    x = torch.arange(16, dtype=torch.float32)
    for i in range(n_calls):
        x = x * 2 + i
    return x


def test_lean_is_installed_under_the_pinned_triton():
    import strata.kernels  # noqa: F401  (installs it)
    from triton.runtime import interpreter as it
    from strata.kernels.interpreter import lean
    assert getattr(it, "_strata_lean", False) and lean()


def test_a_launch_scans_the_language_once_however_many_helper_calls(monkeypatch):
    import strata.kernels  # noqa: F401
    scans = _scans(monkeypatch)
    assert scans[2] == scans[16] > 0, scans


def test_the_stock_interpreter_gives_the_same_result_and_scans_per_call(monkeypatch):
    """lean's wrappers taken out (the interpreter's own _patch_lang and GridExecutor.__call__):
    the same values, and a scan per helper call, which is what lean saves."""
    import strata.kernels  # noqa: F401
    from triton.runtime import interpreter as it
    from strata.kernels.interpreter import STOCK
    monkeypatch.setattr(it, "_patch_lang", STOCK["patch_lang"])
    monkeypatch.setattr(it.GridExecutor, "__call__", STOCK["call"])
    scans = _scans(monkeypatch)
    assert scans[16] > scans[2], scans


def test_the_language_is_restored_after_a_launch_that_raised():
    import strata.kernels  # noqa: F401
    from strata.kernels.interpreter import _Launch
    before = tl.load
    with pytest.raises(Exception):
        _loop[(1,)](torch.arange(16.0), None, N_CALLS=2, BLOCK=16)
    assert tl.load is before and _Launch.langs is None and not _Launch.pending
    assert torch.equal(_run(_loop, 3), _want(3))
