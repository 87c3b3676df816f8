"""Packs: a model laid out for streaming (one safetensors file), its importers and synthesizer.

    Pack.open(path)                 memory-mapped, validated pack (strata.packs.file)
    write_pack(path, shape, ...)    the writer (strata.packs.writer)
    assemble_blobs / split_blobs    gate/up/down bytes <-> uint8 [E, blob_size]
"""
from strata.packs.blobs import assemble_blobs, split_blobs
from strata.packs.file import Pack, PackLayer
from strata.archs.names import dense_specs, experts_name
from strata.packs.writer import write_pack

__all__ = ["Pack", "PackLayer", "write_pack", "assemble_blobs", "split_blobs", "dense_specs",
           "experts_name"]
