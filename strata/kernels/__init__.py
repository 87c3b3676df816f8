"""strata's Triton kernels, each with a plain-torch reference of the same signature.

- moe_ffn / moe_ffn_torch: one layer's MoE feed-forward on quantized blobs (strata.kernels.moe.ffn)
- dequantize / dequantize_torch: whole rows of blocks decoded on the device (strata.kernels.dequant)
- decode: the per-format @triton.jit block decoders the GEMM calls (strata.kernels.decode)
- routing: top-k and grouping by expert (strata.kernels.moe.grouping)
- tiles: the expert GEMM's tile heuristic, `pin_tile` and its launch plan (`plan_launch`)
- decoded: the expert FFN as decode-once then the BF16 GEMM (strata.kernels.moe.decoded)
- combine_rows / combine_rows_torch: the expert FFN's sum over K of its per-assignment rows, in one
  pass (strata.kernels.moe.combine)
- chunk_attention / chunk_attention_torch: one prefill chunk's causal GQA attention over up to two
  prefix KV segments (bf16 or int8) and its own keys; quantize_kv / dequantize_kv the int8 KV
  format; AttnTile / pin_attn_tile its launch choice (strata.kernels.attention)
- norm: rms_norm / qk_norm_rope (+ _torch twins): RMSNorm over rows, attention's per-head q/k
  norm with NEOX RoPE in one pass; pin_norm the models' choice (strata.kernels.norm)
The @triton.jit kernels live in private modules (moe/_ffn_kernel, moe/_combine_kernel,
_dequant_kernel, moe/_expert_dequant_kernel, _norm_kernel, attention/_kernel) behind these small
launchers; the MoE layer's kernels are the package strata.kernels.moe.
"""
from strata import _backend  # noqa: F401, I001  (before triton is imported: the CPU's interpreter)
from strata.kernels.interpreter import lean  # noqa: I001

if _backend.INTERPRET:
    lean()      # one patch of triton.language per interpreted launch (its module docstring)
from strata.kernels.attention import (AttnTile, KVSegment, chunk_attention, chunk_attention_torch,
                                      dequantize_kv, pin_attn_tile, quantize_kv)
from strata.kernels.dequant import dequantize, dequantize_torch
from strata.kernels.moe.ffn import LaunchRecord, last_launch, moe_ffn, moe_ffn_torch
from strata.kernels.moe.grouping import group_blocked, group_ragged, topk_route
from strata.kernels.moe.tiles import LaunchPlan, TileConfig, choose_tile, pin_tile, plan_launch

__all__ = ["moe_ffn", "moe_ffn_torch", "last_launch", "LaunchRecord", "topk_route",
           "group_blocked", "group_ragged", "TileConfig", "choose_tile", "pin_tile",
           "dequantize", "dequantize_torch", "plan_launch", "LaunchPlan", "chunk_attention",
           "chunk_attention_torch", "KVSegment", "quantize_kv", "dequantize_kv", "AttnTile",
           "pin_attn_tile"]
