"""What the memory manager is told about a model and its kernels: numbers, not names.

The memory manager (cache, loan, carve, ring, scan, rig) never looks at a model's tensors or a
kernel's tile rule. Everything it sizes from them arrives in one `Sizes`, built outside memory by
the assembler that knows both (strata.planning.model_sizes):

    dims(T, ring, batch)   values of a LayoutSpec's symbols for a chunk of T tokens (activation
                           bytes per token follow from the Buf dims; workspace rows such as TKP
                           come from the kernel's launch plan)
    kv_bytes(n_tokens, layer)   `layer`'s KV bytes in VRAM for a prompt of n_tokens (a full
                           layer: the resident window's share of the architecture's count; a
                           sliding layer: its window's last W - 1 tokens; in the KV dtype)
    kv_host(n_tokens, layer)    `layer`'s KV bytes kept in pinned host memory for such a prompt
                           (a full layer's tokens outside the resident window; 0 when all of
                           it is resident, and always for a sliding layer)
    dense_layer            one layer's dense weight bytes (every layer's, unless dense_layers)
    dense_layers           per layer, when layers differ (a leading dense FFN, shared experts)
    dense_scratch          per layer, the most its dense matrices kept as blocks hold decoded at
                           once in its turn (one layer's turn at a time: a GPU holds the largest
                           of its layers')
    dense_first            dense bytes only the first GPU holds (token embeddings)
    dense_last             dense bytes only the last GPU holds (output norm, LM head)
    n_layer, n_expert, top_k   the routing facts the ring and the cache need (L, E, K)
    wider(dims)            the same chunk's dims with a larger launch choice (MLA's attention
                           block doubled), or None when there is none: the carve takes the
                           widest whose bytes are no more than the dims' own
                           (strata.memory.layout.PromptLayout.carve)
    layer_work(T)          FLOPs of the heaviest streamed layer's work outside its experts
                           (attention, dense GEMMs, a linear layer's delta rule) for a chunk of
                           T tokens: what the ring's run-ahead covers (scan.py's run-ahead rule)

Legend: T tokens, L layers, E experts, K top-k.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol


class Routing(Protocol):
    """What the ring needs of a model: E experts per layer, K routed per token."""
    n_expert: int
    top_k: int


@dataclass(frozen=True)
class Sizes:
    n_layer: int
    n_expert: int
    top_k: int
    dims: Callable[[int, int, int | None], Mapping[str, int]] = field(compare=False, repr=False)
    kv_bytes: Callable[[int, int], int] = field(compare=False, repr=False)
    kv_host: Callable[[int, int], int] = field(default=lambda n, layer: 0, compare=False,
                                               repr=False)
    dense_layer: int = 0
    dense_layers: tuple[int, ...] = ()

    def layer_dense(self, layer: int) -> int:
        """Dense weight bytes of `layer` (dense_layers[layer] when given, else dense_layer)."""
        return self.dense_layers[layer] if self.dense_layers else self.dense_layer

    def gpu_dense(self, layers: Iterable[int], first: bool, last: bool) -> int:
        """Dense bytes a GPU holding `layers` needs: their weights, the largest of their decode
        scratches (one layer's turn at a time), and the embeddings (`first`) and head (`last`)
        where it holds them."""
        layers = list(layers)
        return (sum(self.layer_dense(l) for l in layers)
                + max((self.dense_scratch[l] for l in layers if self.dense_scratch), default=0)
                + (self.dense_first if first else 0) + (self.dense_last if last else 0))

    def kv_vram(self, n_tokens: int, layers: Iterable[int] | None = None) -> int:
        """KV bytes in VRAM of `layers` (default all) for a prompt of n_tokens."""
        layers = range(self.n_layer) if layers is None else layers
        return sum(self.kv_bytes(n_tokens, l) for l in layers)

    def kv_host_all(self, n_tokens: int, layers: Iterable[int] | None = None) -> int:
        """KV bytes in host memory of `layers` (default all) for a prompt of n_tokens."""
        layers = range(self.n_layer) if layers is None else layers
        return sum(self.kv_host(n_tokens, l) for l in layers)
    dense_first: int = 0
    dense_last: int = 0
    dense_scratch: tuple[int, ...] = ()
    layer_work: Callable[[int], float] = field(default=lambda T: 0.0, compare=False, repr=False)
    wider: Callable[[Mapping[str, int]], Mapping[str, int] | None] = field(
        default=lambda dims: None, compare=False, repr=False)
