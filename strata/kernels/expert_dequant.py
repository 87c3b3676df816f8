"""Decode the routed experts' matrices to bf16 (the "decode, then a dense grouped GEMM" baseline).

strata.kernels.dequant decodes one raw matrix; this reads an ExpertSet (arena + slot table) and
skips experts without tokens on the device, so it needs no sync.

Legend: E experts, R rows (output features), C columns (inputs) of one matrix.

    out[e] = bf16(decode(blob_e.matrix))      for every e with counts[e] > 0; others untouched

`dequant_experts` (Triton, no device sync: idle experts exit early on the device) and
`dequant_experts_torch` share one signature.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from strata._backend import INTERPRET
from strata.experts import ExpertSet
from strata.formats.tables import device_table
from strata.kernels._moe_kernel import _bf16, _w_tile


@triton.jit
def _dequant_fwd_kernel(arena_ptr, slot_ptr, counts_ptr, mat_off, row_bytes, out_ptr, tab_ptr, R, C,
                        FMT: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                        INTERP: tl.constexpr):
    e = tl.program_id(0)
    if tl.load(counts_ptr + e) > 0:
        offs_n = tl.program_id(1) * BN + tl.arange(0, BN)               # [BN]
        offs_k = tl.program_id(2) * BK + tl.arange(0, BK)               # [BK]
        mask = (offs_n < R)[:, None] & (offs_k < C)[None, :]
        w_ptr = arena_ptr + tl.load(slot_ptr + e) + mat_off
        w = _w_tile(FMT, w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr, INTERP)  # [BN, BK] bf16
        dst = out_ptr + e.to(tl.int64) * R * C + offs_n[:, None].to(tl.int64) * C + offs_k[None, :]
        tl.store(dst, w, mask=mask)


def dequant_experts(experts: ExpertSet, name: str, counts: torch.Tensor, *,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """Matrix `name` of every expert with counts[e] > 0, as bf16 [E, R, C] (see module doc)."""
    mat = getattr(experts.layout, name)
    E = experts.n_expert
    if out is None:
        out = torch.empty(E, mat.rows, mat.cols, dtype=torch.bfloat16, device=experts.device)
    BN, BK = 64, 64
    grid = (E, triton.cdiv(mat.rows, BN), triton.cdiv(mat.cols, BK))
    _dequant_fwd_kernel[grid](experts.arena, experts.slot_offset, counts, mat.offset,
                              mat.row_bytes, out, device_table("iq3s", experts.device),
                              mat.rows, mat.cols, FMT=mat.fmt.ggml_type,
                              BN=BN, BK=BK, INTERP=INTERPRET)
    return out


def dequant_experts_torch(experts: ExpertSet, name: str, counts: torch.Tensor, *,
                          out: torch.Tensor | None = None) -> torch.Tensor:
    from strata.kernels.moe import dequantize_matrix
    mat = getattr(experts.layout, name)
    if out is None:
        out = torch.empty(experts.n_expert, mat.rows, mat.cols, dtype=torch.bfloat16,
                          device=experts.device)
    for e in torch.nonzero(counts > 0).flatten().tolist():
        out[e] = dequantize_matrix(experts, e, name).to(torch.bfloat16)
    return out
