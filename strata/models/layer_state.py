"""The recurrent state of a model's linear-attention layers (Gated DeltaNet: ModelShape.linear),
carried from chunk to chunk beside the KV of its full-attention layers.

Legend: K the conv kernel, Hk / Hv key / value heads, dk / dv head dims, C = 2 Hk dk + Hv dv
the conv channels.

    per linear layer l:  conv[l] [K-1, C] in the activations' dtype (the last K-1 conv inputs)
                         S[l]    [Hv, dk, dv] fp32 (the delta rule's state)

Both start at zero (the first chunk's conv pads with zeros, the rule starts from S = 0: what
transformers does without a cache) and are updated in place by each chunk. `nbytes` is
strata.kernels.deltanet.sizes.recurrent_state_bytes summed over the linear layers: the count
the plan charges (strata.planning.model_sizes) and the caches report (KVCache.vram_bytes,
PromptKV.vram_bytes). A cache holds one as `states` (None: a model without linear layers).
`scratch` (layer -> {name: view}) hands the delta rule the prompt layout's dn_* buffers
(strata.planning.deltanet_bufs) where the engine carved them; absent, the launcher allocates.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from strata.kernels.deltanet.sizes import conv_channels, recurrent_state_bytes


def state_dtype(kv: str | None, dense: torch.dtype) -> torch.dtype:
    """The conv state's dtype (the activations'): the dense dtype when no KV dtype is given (a
    model's own reference forward), fp32 beside fp32 KV (the CPU's dense math), else bf16 (the
    GPU's, beside bf16 or int8 KV). The plan charges its bytes (strata.planning.model_sizes),
    the caches allocate it."""
    if kv is None:
        return dense
    return torch.float32 if kv == "fp32" else torch.bfloat16


def linear_layers(shape) -> list[int]:
    """The layers of `shape` that are linear attention (ModelShape.layer_kind)."""
    return [l for l in range(shape.n_layer) if shape.layer_kind(l) == "linear"]


def state_bytes(shape, itemsize: int) -> int:
    """One linear layer's carried state: conv [K-1, C] of `itemsize` bytes + S fp32."""
    lin = shape.linear
    return recurrent_state_bytes(lin.n_k_head, lin.n_v_head, lin.k_head_dim, lin.v_head_dim,
                                 conv_kernel=lin.conv_kernel, itemsize=itemsize)


class RecurrentStates:
    """Every linear layer's conv state and S (see the module doc), on its layer's device;
    `layers`: the ones kept here (default all linear layers; a pipeline stage keeps its own)."""

    def __init__(self, shape, *, dtype: torch.dtype, devices, layers: Sequence[int] | None = None):
        lin = shape.linear
        devs = list(devices) if isinstance(devices, (list, tuple)) else [devices] * shape.n_layer
        keep = linear_layers(shape) if layers is None else [
            l for l in layers if shape.layer_kind(l) == "linear"]
        C = conv_channels(lin.n_k_head, lin.n_v_head, lin.k_head_dim, lin.v_head_dim)
        self.conv = {l: torch.zeros(lin.conv_kernel - 1, C, dtype=dtype, device=devs[l])
                     for l in keep}
        self.S = {l: torch.zeros(lin.n_v_head, lin.k_head_dim, lin.v_head_dim,
                                 dtype=torch.float32, device=devs[l]) for l in keep}
        self.scratch: dict[int, dict[str, torch.Tensor]] = {}

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.conv.values(), *self.S.values()))


def carved_scratch(bufs) -> dict[str, torch.Tensor]:
    """The delta rule's scratch from a carve of the prompt layout: dn_<name> -> name."""
    return {n[3:]: t for n, t in bufs.bufs.items() if n.startswith("dn_") and t is not None}


def new_states(shape, *, dtype: torch.dtype, devices, layers=None) -> RecurrentStates | None:
    """The states of `shape`'s linear layers, or None when it has none."""
    if shape.linear is None:
        return None
    return RecurrentStates(shape, dtype=dtype, devices=devices, layers=layers)
