"""A rig (VRAM per GPU) turned into plan participants: layer split, dense weights, cache size.

Layers are split over the GPUs in proportion to their VRAM (contiguous ranges, the first GPU
holds the token embeddings, the last the output norm and LM head). Each GPU's expert cache is

    cache = VRAM - dense weights of its layers - RESERVE

and holds whole slots of its own layers' experts (CacheLayout.build, round-robin).
RESERVE (1 GiB) stands for the CUDA context (~0.5 GiB on recent drivers), allocator slack and
the attention workspace (what attention kernels allocate beside the carve: one launch's output
at most, strata.kernels.attention.flash.OUT_BYTES, 128 MiB, and MLA's out_bytes); the KV of
earlier chunks is charged separately (`kv_tokens`, 0 in `strata plan`: the prefill engine knows
its prompt length, the planner does not).
The dense bytes and the KV bytes per layer are the model's to say (`Sizes.dense_layer`,
`dense_first`, `dense_last`, `dense_scratch`, `kv_bytes`; strata.planning.model_sizes builds them;
`Sizes.gpu_dense` adds them up for a GPU).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from strata.errors import StrataError
from strata.memory.cache import CacheLayout
from strata.memory.loan import LEND_CAP
from strata.memory.scan import Participant
from strata.memory.sizes import Sizes
from strata.units import fmt_bytes

RESERVE = 1 << 30


def split_layers(n_layer: int, vram: Sequence[int]) -> list[range]:
    """Contiguous layer ranges in proportion to each GPU's VRAM (every GPU gets >= 1 layer)."""
    if not vram:
        raise StrataError("give at least one --vram")
    if len(vram) > n_layer:
        raise StrataError(f"{len(vram)} GPUs but only {n_layer} layers to split")
    total = sum(vram)
    bounds, acc = [0], 0
    for i, v in enumerate(vram[:-1]):
        acc += v
        b = round(n_layer * acc / total)
        b = min(max(b, bounds[-1] + 1), n_layer - (len(vram) - 1 - i))
        bounds.append(b)
    bounds.append(n_layer)
    return [range(a, b) for a, b in zip(bounds, bounds[1:])]


@dataclass(frozen=True)
class GpuBudget:
    name: str
    vram: int
    layers: range
    dense: int
    reserve: int
    kv: int
    cache: int


def explicit_split(n_layer: int, counts: Sequence[int], n_gpu: int) -> list[range]:
    """`--layer-split N,N,...`: layers per GPU, in order; they must add up to the model's."""
    if len(counts) != n_gpu:
        raise StrataError(f"--layer-split names {len(counts)} GPUs but {n_gpu} --vram budgets "
                          f"were given; give one count per GPU")
    if any(c < 1 for c in counts) or sum(counts) != n_layer:
        raise StrataError(f"--layer-split {','.join(map(str, counts))} must give every GPU at "
                          f"least one layer and add up to the model's {n_layer} layers")
    bounds = [0]
    for c in counts:
        bounds.append(bounds[-1] + c)
    return [range(a, b) for a, b in zip(bounds, bounds[1:])]


def budgets(sizes: Sizes, vram: Sequence[int], *, cache: int | None = None,
            reserve: int = RESERVE, kv_tokens: int = 0,
            split: Sequence[int] | None = None) -> list[GpuBudget]:
    """Per GPU: its layers, dense bytes and the expert cache bytes it can give (or `cache`).
    `split` (layers per GPU) overrides the split in proportion to VRAM."""
    out = []
    splits = (explicit_split(sizes.n_layer, split, len(vram)) if split is not None
              else split_layers(sizes.n_layer, vram))
    for i, (v, layers) in enumerate(zip(vram, splits)):
        dense = sizes.gpu_dense(layers, first=i == 0, last=i == len(vram) - 1)
        kv = sizes.kv_vram(kv_tokens, layers)
        c = cache if cache is not None else v - dense - reserve - kv
        if c <= 0:
            raise StrataError(
                f"CUDA{i} ({fmt_bytes(v)}) has no room for an expert cache: its dense weights "
                f"take {fmt_bytes(dense)} and the reserve {fmt_bytes(reserve)}; give it more "
                f"--vram, add GPUs, or set --cache")
        out.append(GpuBudget(f"CUDA{i}", v, layers, dense, reserve, kv, c))
    return out


def participants(sizes: Sizes, layer_blob: Mapping[int, int] | Sequence[int],
                 vram: Sequence[int], *, cache: int | None = None,
                 lend_cap: float = LEND_CAP, reserve: int = RESERVE,
                 kv_tokens: int = 0, split: Sequence[int] | None = None
                 ) -> tuple[list[Participant], list[GpuBudget]]:
    """Participants (cache layouts of their own layers) for a rig."""
    if not isinstance(layer_blob, Mapping):
        layer_blob = dict(enumerate(layer_blob))
    if not 0.0 < lend_cap <= 1.0:
        raise StrataError(f"--lend-cap must be in (0, 1], got {lend_cap}")
    bud = budgets(sizes, vram, cache=cache, reserve=reserve, kv_tokens=kv_tokens, split=split)
    # a layer without routed experts (blob 0: a leading dense layer) has no cache slots
    parts = [Participant(b.name, CacheLayout.build(b.cache, {l: layer_blob[l] for l in b.layers
                                                             if layer_blob[l] > 0},
                                                   sizes.n_expert), lend_cap) for b in bud]
    return parts, bud
