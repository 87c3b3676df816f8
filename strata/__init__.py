"""strata: MoE prefill with experts streamed from host memory through a ring of VRAM slots.

Shape legend used across the package:
    T tokens in a chunk, D hidden size, F expert width (n_ff_exp), E experts per layer,
    K experts per token (top-k), L layers, V vocabulary, H query heads, Hkv key/value heads.

Importing strata imports no torch (strata.engine.early reads a pack ahead of torch's import);
strata.kernels picks the Triton backend (strata._backend) before any kernel module imports
triton.
"""
from strata.errors import StrataError

__version__ = "0.1.0"
__all__ = ["StrataError", "__version__"]
