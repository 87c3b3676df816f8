"""Architecture registry: arch name (as GGUF's general.architecture spells it) -> model class.

A model class provides `from_tensors(shape, tensors, device=, dtype=, ffn=)`, `prefill(tokens,
provider, chunk=)` and `forward_chunk(tokens, cache, provider)`; see strata.models.qwen3moe.
"""
from __future__ import annotations

from strata.errors import StrataError

ARCHS: dict[str, type] = {}


def register(name: str):
    def deco(cls):
        ARCHS[name] = cls
        return cls
    return deco


def get_arch(name: str) -> type:
    import strata.models.qwen3moe  # noqa: F401  (registers itself)
    try:
        return ARCHS[name]
    except KeyError:
        raise StrataError(f"architecture {name!r} is not supported; strata runs "
                          f"{', '.join(sorted(ARCHS))}") from None
