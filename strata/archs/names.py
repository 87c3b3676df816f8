"""The dense tensors of a pack: names (llama.cpp's GGUF names) and torch shapes.

The one description of what a pack's dense part holds; the writer, the reader, the GGUF and HF
importers, the synthesizer and the planner all read it. Shapes are torch order, [out, in] for
matrices (a GGUF `{in, out}` tensor read row-major is exactly this). A layer's tensors are its
architecture's (the record's `layer_specs`, strata.archs.registry).

Legend: D hidden, V vocabulary.
"""
from __future__ import annotations

from strata.archs.dense import OPTIONAL, global_specs, refuse_mismatch
from strata.shapes import ModelShape

__all__ = ["OPTIONAL", "check_dense", "dense_specs", "experts_name", "global_specs", "layer_specs"]


def layer_specs(s: ModelShape, i: int) -> dict[str, tuple[int, ...]]:
    """Layer i's dense tensors, as its architecture's record says."""
    from strata.archs.registry import get_arch
    return get_arch(s.arch).layer_specs(s, i)


def dense_specs(s: ModelShape) -> dict[str, tuple[int, ...]]:
    """Every dense tensor of the model, name -> torch shape, in file order."""
    from strata.archs.registry import get_arch
    return get_arch(s.arch).dense_specs(s)


def experts_name(i: int) -> str:
    """The pack tensor holding layer i's expert blobs, uint8 [E, blob_size]."""
    return f"blk.{i}.experts"


def check_dense(s: ModelShape, shapes: dict[str, tuple[int, ...]], where: str) -> None:
    """Refuse a dense set with missing, extra or mis-shaped tensors, naming the first problems."""
    refuse_mismatch(dense_specs(s), shapes, where)
