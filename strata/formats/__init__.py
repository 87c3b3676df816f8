"""ggml block formats: the one description of each (table), torch references, quantizers.

The block table lives in `strata.formats.table`; everything else (blob layouts, packs, kernels,
memory sizing) reads it from there.
"""
from strata.formats.table import FORMATS, Format, get_format, row_bytes
from strata.formats.codec import dequantize, quantize

__all__ = ["FORMATS", "Format", "get_format", "row_bytes", "dequantize", "quantize"]
