"""The MoE layer's kernels, each a launcher beside its private @triton.jit module.

- ffn (_ffn_kernel): moe_ffn / moe_ffn_torch, one layer's expert FFN on quantized blobs
- plane (_plane_kernel): the expert FFN over plane-layout experts (strata.planes)
- decoded, expert_dequant (_expert_dequant_kernel), grouped (_grouped_kernel): decode-once, then
  the BF16 grouped GEMM
- grouping (_group_kernel): top-k and the grouping of assignments by expert
- router (_router_kernel): the router's logits to top-k weights; combine (_combine_kernel): the
  sum over K of the per-assignment rows
- tiles: the expert GEMM's tile heuristic, `pin_tile` and its launch plan; random_experts:
  synthetic experts for tests and benchmarks
"""
