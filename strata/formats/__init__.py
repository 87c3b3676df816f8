"""ggml block formats: the one description of each (table), torch references, quantizers.

- table:   Format + FORMATS, the one description of every block format (sizes, layout, scale
           fields); blob layouts, packs, kernels and memory sizing read it from there
- tables:  IQ4_NL / MXFP4 levels, the IQ3_S grid, ksigns; the other i-quant grids read from
           gguf-py; one device table of every grid for the Triton decoders
- codec:   dequantize(raw, qtype) -> fp32 and quantize(x, qtype) -> uint8, gguf-py's call shapes
- plain, legacy, kquants, iquants, iq2, iq1, mxfp4: the per-family torch references (bit-exact
           with gguf-py / ggml), one function per format and direction
Triton decoders of the same formats: strata.kernels.decode.
"""
from strata.formats.table import FORMATS, Format, get_format, row_bytes
from strata.formats.codec import dequantize, quantize

__all__ = ["FORMATS", "Format", "get_format", "row_bytes", "dequantize", "quantize"]
