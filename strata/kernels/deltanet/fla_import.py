"""fla-core's five forward kernels imported without the rest of fla-core.

fla's package `__init__`s import every op, layer and model it has (`import fla.ops.common.
chunk_delta_h` loads ~270 fla modules), and its `dispatch` decorator wraps each op's Python
function in `torch.compiler.disable`, whose first call imports torch._dynamo and torch._inductor.
strata launches five Triton kernels and none of those functions, yet paid for all of it in a
fresh process's first prompt: 2.2 s on the CPU machine with Python's bytecode cache warm, and
7.1-7.7 s on the H100 machine, whose image ships no bytecode (every module compiles from
source), as long as a Qwen3.5 warm-up's whole 7.3 s one-time load. Imported as below: 0.22 s
there (experiments/results/fla_import-NVIDIA_H100-35cf527.txt).

`lean_kernel_modules(names)` imports the named fla modules with two things held for the import
only: the packages of LEAN_PACKAGES that are not imported yet stand in sys.modules as empty
packages on their own folders (their `__init__`s do not run), and `torch.compiler.disable` is
the identity (its wrappers are of functions strata never calls; only torch.compile's tracing of
them would see the difference). Afterwards the empty packages leave sys.modules, so a later
`import fla` in the same process runs fla's own `__init__`s and finds the kernel modules
already loaded; where fla is imported already, the names import as usual.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
import types

# the packages above the five kernel modules whose __init__ import the rest of fla
LEAN_PACKAGES = ("fla", "fla.ops", "fla.ops.common", "fla.ops.gated_delta_rule")


def _identity(fn=None, *args, **kwargs):
    """torch.compiler.disable's two forms (`disable(fn, ...)`, `disable(...)(fn)`), doing
    nothing."""
    return fn if fn is not None else (lambda f: f)


@contextlib.contextmanager
def _lean(version: str):
    import torch
    stand_ins = []
    locations = None
    for name in LEAN_PACKAGES:
        if name in sys.modules:
            continue
        if locations is None:
            spec = importlib.util.find_spec("fla")
            locations = list(spec.submodule_search_locations or [])
        m = types.ModuleType(name)
        m.__path__ = [f"{loc}/{name.partition('.')[2].replace('.', '/')}".rstrip("/")
                      for loc in locations]
        m.__package__ = name
        if name == "fla":
            m.__version__ = version        # fla.utils reads it at import
        sys.modules[name] = m
        stand_ins.append(name)
    held = torch.compiler.disable
    torch.compiler.disable = _identity
    try:
        yield
    finally:
        torch.compiler.disable = held
        for name in stand_ins:
            sys.modules.pop(name, None)


def lean_kernel_modules(names, version: str):
    """The fla modules `names` (dotted), imported as the module docstring says."""
    if "fla" in sys.modules:
        return [importlib.import_module(n) for n in names]
    with _lean(version):
        return [importlib.import_module(n) for n in names]
