"""The expert FFN as "decode the pass's experts once, then the BF16 expert GEMM".

Legend: T tokens, D hidden, F expert width, E experts, K top-k, n experts with tokens in the pass,
BB = bf16_layout(layout).size bytes of one expert in bf16 (3·D·F·2, each matrix 256-aligned, plus
the bias slot's fp32 2F + D, 256-aligned, when the experts carry biases).

    for every expert e with tokens:  dec[c(e)] = bf16(decode(blob_e))      (one launch a matrix)
                                     dec[c(e)].bias = blob_e.bias          (raw fp32, one launch)
    y = moe_ffn(x, topk_ids, topk_weights, ExpertSet(dec, c(e) * BB, bf16 layout))

The fused kernel (`moe_ffn` on quantized blobs) decodes each weight tile inside the GEMM's inner
loop for every row block of its expert; at long chunks an expert has hundreds of rows, so
decoding its blob once (memory-bound, microseconds) and running the BF16 tiles (tensor-core bound)
is the faster order. Numerics are the fused kernel's: it too rounds every decoded weight to bf16
before the dot (its "decode" dot; the scaled-code dots of Q8_0/Q4_0 sum in another order), and
the biases reach the epilogue as the same fp32 bits. Same signature as `moe_ffn`;
`workspace["wdec"]` (uint8, >= n*BB bytes) replaces the decode buffer's allocation — the
carve's, in the streaming engine.

The BF16 GEMM is strata's Triton kernel ("triton") or torch._grouped_mm straight over the decode
buffer ("grouped", strata.kernels.moe.grouped: cutlass on sm90+, faster at long chunks); "auto"
picks by device and rows an expert; `pin_decoded_gemm` pins the choice for a block. Experts with
biases or another activation than silu (GPT-OSS's) always take the Triton GEMM, whose epilogue
applies them (the grouped path has none; `last_decoded_gemm` says so when grouped was asked).
"""
from __future__ import annotations

import torch

from strata.blob import bf16_layout  # noqa: F401 (re-exported: the decode buffer's blob)
from strata.errors import StrataError
from strata.experts import ExpertSet
from strata.kernels.moe.expert_dequant import copy_biases_into, decode_matrix_into
from strata.kernels.moe.grouped import (GROUPED_MIN_ROWS, grouped_ffn,  # noqa: F401
                                        last_decoded_gemm, pin_decoded_gemm, record,
                                        resolve)
from strata.kernels.moe.ffn import moe_ffn
from strata.kernels.moe.grouping import routed_mask


def decode_experts(experts: ExpertSet, dst_slot: torch.Tensor, dst: torch.Tensor) -> ExpertSet:
    """Decode every expert e with dst_slot[e] >= 0 into dst[dst_slot[e]:] as a BF16 blob
    (bf16_layout: its biases, if any, copied bit for bit into the blob's bias slot).

    Returns the ExpertSet over `dst` (slot_offset = dst_slot). Experts with dst_slot -1 are not
    touched (no program work). No host sync."""
    lay = experts.layout
    out_lay = bf16_layout(lay)
    for m, o in zip(lay.matrices, out_lay.matrices):
        decode_matrix_into(experts, m, dst_slot, dst, o.offset)
    if lay.bias is not None:
        copy_biases_into(experts, dst_slot, dst, out_lay.bias.offset)
    return ExpertSet(dst, dst_slot, out_lay)


def moe_ffn_decoded(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                    experts: ExpertSet, *, schedule=None, scratch_alloc=None, out=None,
                    workspace=None, check: bool = True, combine: str = "pass") -> torch.Tensor:
    """`moe_ffn`'s meaning and signature, computed as decode-once then the BF16 GEMM."""
    lay = experts.layout
    kw = dict(schedule=schedule, scratch_alloc=scratch_alloc, out=out, check=check,
              combine=combine)
    if all(m.fmt.name == "BF16" for m in lay.matrices):   # nothing to decode
        record("triton", "BF16 experts: nothing to decode, moe_ffn reads the blobs in place")
        return moe_ffn(x, topk_ids, topk_weights, experts, workspace=workspace, **kw)
    E = experts.n_expert
    dev = experts.device
    present = routed_mask(topk_ids, E) & (experts.slot_offset >= 0)          # [E]
    # experts routed to but absent keep -1 below: moe_ffn then names them in its error
    bb = bf16_layout(lay).size
    cidx = torch.cumsum(present.long(), 0) - 1                               # [E]
    buf = (workspace or {}).get("wdec")
    if buf is None and check:   # standalone: size the buffer from the count (one sync)
        n = int(present.sum())
        buf = torch.empty(max(n, 1) * bb, dtype=torch.uint8, device=dev)
    elif buf is None:   # no sync: room for every expert the T·K assignments can reach
        n = min(E, topk_ids.numel())
        buf = torch.empty(max(n, 1) * bb, dtype=torch.uint8, device=dev)
    elif buf.dtype != torch.uint8 or buf.dim() != 1 or buf.device != dev or buf.numel() < bb:
        raise StrataError(f"workspace['wdec'] must be a 1-D uint8 buffer on {dev} of at least one "
                          f"bf16 expert ({bb:,} B); got {buf.dtype} {list(buf.shape)} on "
                          f"{buf.device}")
    # With the engine's buffer no sync is needed: a pass holds at most as many experts as it
    # was sized for. An expert past its capacity is simply not decoded (slot -1), so a pass too
    # big for the buffer fails moe_ffn's residency check by name instead of writing past it.
    cap = buf.numel() // bb
    dst_slot = torch.where(present & (cidx < cap), cidx * bb, -1)
    dec = decode_experts(experts, dst_slot, buf)
    ws = {k: v for k, v in (workspace or {}).items() if k != "wdec"} or None
    if resolve(x, topk_ids, dec, workspace) == "grouped":
        return grouped_ffn(x, topk_ids, topk_weights, dec, out=out, workspace=ws, check=check,
                           combine=combine)
    return moe_ffn(x, topk_ids, topk_weights, dec, workspace=ws, **kw)
