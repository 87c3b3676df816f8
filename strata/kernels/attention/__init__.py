"""Chunked-prefill attention: a Triton flash-attention kernel over (older + resident + current)
keys, its plain-torch twin, the int8 KV format it reads and its tile choice.

- chunk_attention / chunk_attention_torch: one chunk's causal GQA attention (chunk.py)
- KVSegment: one run of earlier tokens' keys/values (bf16, or int8 + scales)
- quantize_kv / dequantize_kv / kv_token_bytes: the int8 KV format (kv_int8.py)
- expand_codes / expand_codes_torch: int8 codes -> exact bf16, the "expand" int8 path (expand.py)
- AttnScratch / expand_rows / needs_state / state_floats: that path's VRAM, cut into pieces of a
  long prefix (scratch.py)
- AttnTile / choose_attn_tile / pin_attn_tile: launch choices as data (tiles.py)
- chunk_attention_for / pin_attention / probe_launches: the implementation a device gets, and
  the warm-up's one-program probe launches (probe.py)
"""
from strata.kernels.attention.chunk import (KVSegment, causal_pairs, chunk_attention,
                                            chunk_attention_for, chunk_attention_torch)
from strata.kernels.attention.expand import expand_codes, expand_codes_torch
from strata.kernels.attention.kv_int8 import dequantize_kv, kv_token_bytes, quantize_kv
from strata.kernels.attention.probe import pin_attention, probe_launches
from strata.kernels.attention.scratch import (AttnScratch, expand_rows, needs_state,
                                              pin_expand_rows, state_floats)
from strata.kernels.attention.tiles import (AttnProblem, AttnTile, choose_attn_tile,
                                            pin_attn_tile, resolve_attn_tile)

__all__ = ["chunk_attention", "chunk_attention_torch", "KVSegment", "causal_pairs",
           "quantize_kv", "dequantize_kv", "kv_token_bytes", "AttnTile", "AttnProblem",
           "choose_attn_tile", "pin_attn_tile", "resolve_attn_tile", "expand_codes",
           "expand_codes_torch", "AttnScratch", "expand_rows", "needs_state", "state_floats",
           "pin_expand_rows", "chunk_attention_for", "pin_attention", "probe_launches"]
