"""Gated DeltaNet (the linear-attention layers of Qwen3-Next and Qwen3.5-MoE) for prefill: the
chunked gated delta rule in Triton with its torch twin and the recurrent reference, the short
causal conv with its carried state, the gates, the q/k L2 norm and the gated output norm, the
input projections' layouts, and the bytes of a layer's state and of a chunk's scratch. One folder per op family, each Triton
launcher beside its plain-torch twin of the same signature.
"""
from strata.kernels.deltanet.chunk import chunk_gated_delta_rule, delta_rule_on
from strata.kernels.deltanet.conv import causal_conv1d, causal_conv1d_torch
from strata.kernels.deltanet.gates import delta_gates
from strata.kernels.deltanet.naive import (chunk_gated_delta_rule_torch,
                                           recurrent_gated_delta_rule)
from strata.kernels.deltanet.norms import (gated_rms_norm, gated_rms_norm_torch, l2norm,
                                           l2norm_torch)
from strata.kernels.deltanet.projections import qwen3_next_inputs, split_qkv
from strata.kernels.deltanet.sizes import (chunk_buffers, chunk_scratch_bytes,
                                           conv_state_bytes, recurrent_state_bytes)

__all__ = ["chunk_gated_delta_rule", "delta_rule_on", "chunk_gated_delta_rule_torch",
           "recurrent_gated_delta_rule", "causal_conv1d", "causal_conv1d_torch", "delta_gates",
           "l2norm", "l2norm_torch", "gated_rms_norm", "gated_rms_norm_torch", "chunk_buffers",
           "chunk_scratch_bytes", "conv_state_bytes", "recurrent_state_bytes",
           "qwen3_next_inputs", "split_qkv"]
