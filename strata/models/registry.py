"""Architecture registry: arch name (as GGUF's general.architecture spells it) -> model class.

A model class is a wiring (strata.models.qwen3moe): a `strata.models.decoder.Decoder` (the chunk
loop, `prefill(tokens, provider, chunk=, observer=)`) that provides `from_tensors(shape, tensors,
device=, dtype=, ffn=, device_map=)`, `new_cache(capacity, kv=)` and `forward_chunk(tokens,
cache, provider, logits=, observer=)` from the shared layers, attention and MoE block. The
registry imports the wirings; they never import it (no circle).
"""
from __future__ import annotations

from strata.errors import StrataError


def wirings() -> dict[str, type]:
    """strata arch name -> its model class."""
    from strata.models.deepseek import DeepSeek2
    from strata.models.glm4moe import Glm4Moe
    from strata.models.gpt_oss import GptOss
    from strata.models.mixtral import Mixtral
    from strata.models.qwen3moe import Qwen3Moe
    return {"qwen3moe": Qwen3Moe, "mixtral": Mixtral, "gpt-oss": GptOss, "glm4moe": Glm4Moe,
            "deepseek2": DeepSeek2}


def get_arch(name: str) -> type:
    archs = wirings()
    try:
        return archs[name]
    except KeyError:
        raise StrataError(f"architecture {name!r} is not supported; strata runs "
                          f"{', '.join(sorted(archs))}") from None
