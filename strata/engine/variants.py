"""Which Triton kernel variants a block of code launches, and how many it compiled.

    with KernelLaunches() as seen:
        engine.run(tokens)
    seen.variants     # {(kernel, specialization, options)}: one entry per distinct variant
    seen.plain        # those launched outside the attention's probes (probe_launches)
    seen.launches     # launches of strata's kernels inside the block
    seen.compiled     # kernels Triton compiled (or loaded) inside the block; None in the interpreter

A variant is what Triton keys its cache on: every constexpr's value, and for every other argument
the specialization Triton's own binder computes (triton.runtime.jit.create_function_from_signature
over the kernel's parameters: an integer's type and whether it is 1 or divisible by 16, a
pointer's dtype and 16-byte alignment), plus the launch options (num_warps, num_stages). The
grid is not part of it. The interpreter (TRITON_INTERPRET=1) has no compile cache, so on the CPU
the recorded variants are what proves that one block launched nothing another did not; on CUDA
`compiled` counts the entries the block added to the kernels' caches, Triton's own word.

Every @triton.jit object in the strata.kernels package is watched (a pre-run hook, Triton's
public `add_pre_run_hook`, removed on exit), so no launcher needs to report itself.
"""
from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys

from strata.errors import StrataError

PACKAGE = "strata.kernels"


def _kernel_types() -> tuple[type, ...]:
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction
    return (JITFunction, InterpretedFunction)


def strata_kernels() -> list:
    """Every @triton.jit object in the strata.kernels package (its modules imported first)."""
    pkg = importlib.import_module(PACKAGE)
    for m in pkgutil.walk_packages(pkg.__path__, PACKAGE + "."):
        importlib.import_module(m.name)
    kinds = _kernel_types()
    out, seen = [], set()
    for name, mod in list(sys.modules.items()):
        if mod is None or not (name == PACKAGE or name.startswith(PACKAGE + ".")):
            continue
        for obj in vars(mod).values():
            if isinstance(obj, kinds) and id(obj) not in seen:
                seen.add(id(obj))
                out.append(obj)
    return out


def _binder(kernel):
    """Triton's binder for `kernel`: (*args, **kwargs) -> (params, specialization, options)."""
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import KernelParam, create_function_from_signature
    params = getattr(kernel, "params", None)
    fn = kernel.fn
    sig = inspect.signature(fn)
    if params is None:   # the interpreter's function: the same parameters, nothing skipped
        params = [KernelParam(i, p, False, False) for i, p in enumerate(sig.parameters.values())]
    return create_function_from_signature(sig, params, BaseBackend)


def _cached(kernel) -> int:
    """Compiled variants in a JITFunction's caches (0 for the interpreter's function)."""
    caches = getattr(kernel, "device_caches", None)
    return sum(len(c[0]) for c in caches.values()) if caches is not None else 0


class KernelLaunches:
    """Records the variants of strata's kernels launched inside the block (module docstring)."""

    def __init__(self, *, record: bool = True):
        """record=False: no hooks (nothing added to a launch's cost), only `compiled` (CUDA)."""
        self.record = record
        self.variants: set = set()
        self.plain: set = set()
        self.launches = 0
        self.compiled: int | None = None
        self._hooks: list = []
        self._before = 0

    def _hook(self, kernel):
        from strata.kernels.attention.probe import probing
        name = kernel.fn.__qualname__
        bind = []     # Triton's binder, made at the kernel's first launch

        def hook(*args, **kwargs):
            if not bind:
                bind.append(_binder(kernel))
            _, spec, options = bind[0](*args, **kwargs)
            self.launches += 1
            v = (name, tuple(_plain(s) for s in spec),
                 tuple(sorted((k, repr(v)) for k, v in options.items())))
            self.variants.add(v)
            if not probing():
                self.plain.add(v)
        return hook

    def __enter__(self) -> "KernelLaunches":
        if self._hooks:
            raise StrataError("a KernelLaunches records one block at a time")
        kernels = strata_kernels()
        for k in kernels:
            h = self._hook(k) if self.record else None
            if h is not None:
                k.add_pre_run_hook(h)
            self._hooks.append((k, h))
        self._before = sum(_cached(k) for k in kernels)
        self.compiled = None
        return self

    def __exit__(self, *exc) -> None:
        kernels = [k for k, _ in self._hooks]
        for k, h in self._hooks:
            if h is not None:
                k.pre_run_hooks.remove(h)
        self._hooks = []
        interpreted = all(not hasattr(k, "device_caches") for k in kernels)
        self.compiled = None if interpreted else sum(_cached(k) for k in kernels) - self._before

    def names(self) -> set[str]:
        """The kernels launched (names only)."""
        return {v[0] for v in self.variants}


def _plain(spec):
    """One argument's (type, specialization) with its values made hashable and comparable."""
    kind, val = spec
    if kind == "constexpr":
        return (kind, repr(val))
    return (kind, val if isinstance(val, (str, int, type(None))) else repr(val))
