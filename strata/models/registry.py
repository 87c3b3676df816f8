"""Architecture registry: arch name (as GGUF's general.architecture spells it) -> model class.

A model class is a wiring (strata.models.qwen3moe): a `strata.models.decoder.Decoder` (the chunk
loop, `prefill(tokens, provider, chunk=, observer=)`) that provides `from_tensors(shape, tensors,
device=, dtype=, ffn=, device_map=)`, `new_cache(capacity)` and `forward_chunk(tokens, cache,
provider, logits=, observer=)` from the shared layers, attention and MoE block.
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
    import strata.models.qwen3moe  # noqa: F401  (each wiring registers itself)
    import strata.models.mixtral  # noqa: F401
    import strata.models.gpt_oss  # noqa: F401
    import strata.models.glm4moe  # noqa: F401
    import strata.models.deepseek  # noqa: F401
    try:
        return ARCHS[name]
    except KeyError:
        raise StrataError(f"architecture {name!r} is not supported; strata runs "
                          f"{', '.join(sorted(ARCHS))}") from None
