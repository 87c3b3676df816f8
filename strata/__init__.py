"""strata: MoE prefill with experts streamed from host memory through a ring of VRAM slots.

Shape legend used across the package:
    T tokens in a chunk, D hidden size, F expert width (n_ff_exp), E experts per layer,
    K experts per token (top-k), L layers, V vocabulary, H query heads, Hkv key/value heads.
"""
from strata import _backend  # noqa: F401  (must run before triton is imported anywhere)
from strata.errors import StrataError

__version__ = "0.1.0"
__all__ = ["StrataError", "__version__"]
