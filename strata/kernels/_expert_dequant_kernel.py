"""The @triton.jit kernel behind strata.kernels.expert_dequant (decode the routed experts' matrices
to bf16; the launcher and reference live there).

Legend: E experts, R rows (output features), C columns (inputs) of one matrix; BN x BK a
program's tile; grid (E, cdiv(R, BN), cdiv(C, BK)).
"""
import triton
import triton.language as tl

from strata.kernels._moe_kernel import _bf16, _w_tile
from strata.kernels.decode import pair_tile


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
