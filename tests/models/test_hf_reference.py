"""The hybrids' references are transformers' own torch forward, whatever is installed beside it.

transformers 5.24 decorates its torch delta rule (torch_chunk_gated_delta_rule,
torch_recurrent_gated_delta_rule) so that fla-core's kernels run instead whenever `fla` imports;
strata's fla backend installs fla-core (dev.sh). tests/conftest.py imports those modules with fla
hidden; here each decorated function must resolve to the torch body it wraps.
"""
from __future__ import annotations

import importlib
import inspect

import pytest

from tests.conftest import HF_DELTA_MODULES


def _implementation(fn):
    """The callable a transformers hub-kernel wrapper calls (its closure's `implementation`)."""
    seen = set()
    while fn is not None and id(fn) not in seen:
        seen.add(id(fn))
        cells = inspect.getclosurevars(fn).nonlocals
        if "implementation" in cells:
            return cells["implementation"]
        fn = getattr(fn, "__wrapped__", None)
    return None


@pytest.mark.parametrize("module", HF_DELTA_MODULES)
@pytest.mark.parametrize("name", ["torch_chunk_gated_delta_rule",
                                  "torch_recurrent_gated_delta_rule"])
def test_transformers_delta_rule_is_its_torch_one(module, name):
    mod = importlib.import_module(module)
    fn = getattr(mod, name, None)
    if fn is None:
        pytest.skip(f"{module} has no {name}")
    impl = _implementation(fn)
    assert impl is not None, f"{module}.{name}: no hub-kernel wrapper found (transformers changed?)"
    assert impl.__module__ == module, (f"{module}.{name} runs {impl.__module__}.{impl.__name__}, "
                                       f"not transformers' torch body")
