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
from strata.kernels.decode import pair_tile, pair_words_fit


@triton.jit
def _dequant_fwd_kernel(arena_ptr, slot_ptr, dst_slot_ptr, mat_off, row_bytes, dst_ptr, dst_off,
                        tab_ptr, R, C, FMT: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                        INTERP: tl.constexpr, WORDS: tl.constexpr = False):
    """bf16(decode(expert e's matrix)) at dst_ptr + dst_slot[e] + dst_off (bytes), rows of C;
    experts with dst_slot[e] = -1 do nothing. WORDS (Q8_0/Q4_0, rows a multiple of 4 bytes,
    BK % 64 == 0): the codes come as aligned int32 words a pair of blocks at a time (pair_tile)
    instead of byte by byte."""
    e = tl.program_id(0)
    dst_base = tl.load(dst_slot_ptr + e)
    if dst_base >= 0:
        offs_n = tl.program_id(1) * BN + tl.arange(0, BN)               # [BN]
        w_ptr = arena_ptr + tl.load(slot_ptr + e) + mat_off
        dst = (dst_ptr + dst_base + dst_off).to(tl.pointer_type(tl.bfloat16))
        rows = dst + offs_n[:, None].to(tl.int64) * C
        if WORDS:
            for r in tl.static_range(BK // 64):
                pair = tl.program_id(2) * (BK // 64) + r
                offs_k = pair * 64 + tl.arange(0, 64)
                n_mask = (offs_n < R) & (pair * 64 < C)
                w = _bf16(pair_tile(FMT, w_ptr, row_bytes, offs_n, pair, n_mask, True), INTERP)
                tl.store(rows + offs_k[None, :], w, mask=n_mask[:, None])
        else:
            offs_k = tl.program_id(2) * BK + tl.arange(0, BK)           # [BK]
            mask = (offs_n < R)[:, None] & (offs_k < C)[None, :]
            w = _w_tile(FMT, w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr, INTERP)  # bf16
            tl.store(rows + offs_k[None, :], w, mask=mask)


# Q8_0/Q4_0 rows of whole 4-byte words decode through aligned word loads (a module attribute so
# an A/B can turn it off: experiments/kernel_bench.py's strata-decoded arm measures both).
WORD_DECODE = True


def decode_matrix_into(experts: ExpertSet, mat, dst_slot: torch.Tensor, dst: torch.Tensor,
                       dst_off: int) -> None:
    """Matrix `mat` (a MatrixSlot of the layout) of every expert e with dst_slot[e] >= 0, as bf16
    rows at byte dst_slot[e] + dst_off of the uint8 buffer `dst`. One launch."""
    BN, BK = 64, 64
    words = WORD_DECODE and pair_words_fit(mat.fmt.name, mat.cols, mat.row_bytes, mat.offset)
    grid = (experts.n_expert, triton.cdiv(mat.rows, BN), triton.cdiv(mat.cols, BK))
    _dequant_fwd_kernel[grid](experts.arena, experts.slot_offset, dst_slot, mat.offset,
                              mat.row_bytes, dst, dst_off, device_table("iq", experts.device),
                              mat.rows, mat.cols, FMT=mat.fmt.ggml_type, BN=BN, BK=BK,
                              INTERP=INTERPRET, WORDS=words)


def dequant_experts(experts: ExpertSet, name: str, counts: torch.Tensor, *,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """Matrix `name` of every expert with counts[e] > 0, as bf16 [E, R, C] (see module doc)."""
    mat = getattr(experts.layout, name)
    E = experts.n_expert
    if out is None:
        out = torch.empty(E, mat.rows, mat.cols, dtype=torch.bfloat16, device=experts.device)
    step = mat.rows * mat.cols * 2
    dst_slot = torch.where(counts[:E] > 0,
                           torch.arange(E, device=counts.device, dtype=torch.int64) * step, -1)
    decode_matrix_into(experts, mat, dst_slot, out.view(torch.uint8).view(-1), 0)
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
