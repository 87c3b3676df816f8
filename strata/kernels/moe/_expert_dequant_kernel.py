"""The @triton.jit kernels behind strata.kernels.moe.expert_dequant (decode the routed experts'
matrices to bf16; copy their fp32 biases beside them; the launchers and references live there).

Legend: E experts, R rows (output features), C columns (inputs) of one matrix; BN x BK a
program's tile; grid (E, cdiv(R, BN), cdiv(C, BK)). The STREAM path is launched on the matrix
viewed as [R C / 32, 32] (decode_view): BN blocks a program, BK = C = 32. The bias copy: N
4-byte words an expert, BW a program's words; grid (E, cdiv(N, BW)).
"""
import triton
import triton.language as tl

from strata.kernels.moe._ffn_kernel import _bf16, _w_tile
from strata.kernels.decode import pair_tile
from strata.kernels.decode.streams import stream_block
from strata.kernels.decode.superblocks import (SUPERBLOCK_K, superblock_base, superblock_head,
                                              superblock_run, superblock_words)


@triton.jit
def _rows16(dst_ptr, dst_base, dst_off, offs_n, C):
    """bf16 pointers [BN, 1] at the start of each output row, for the word paths: their rows are
    whole 32-weight multiples and dst_slot[e], dst_off are multiples of 16 bytes (see
    decode_matrix_into); spelling dst_base as (dst_base >> 4) * 16 shows the compiler as much
    (tl.multiple_of does not reach a loaded scalar), so the stores can be wide vectors."""
    dst = (dst_ptr + (dst_base >> 4) * 16 + dst_off).to(tl.pointer_type(tl.bfloat16))
    return dst + offs_n[:, None].to(tl.int64) * C


@triton.jit
def _dequant_fwd_kernel(arena_ptr, slot_ptr, dst_slot_ptr, mat_off, row_bytes, dst_ptr, dst_off,
                        tab_ptr, R, C, FMT: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                        INTERP: tl.constexpr, WORDS: tl.constexpr = False,
                        SUPER: tl.constexpr = False, ALIGNED: tl.constexpr = False,
                        STREAM: tl.constexpr = False):
    """bf16(decode(expert e's matrix)) at dst_ptr + dst_slot[e] + dst_off (bytes), rows of C;
    experts with dst_slot[e] = -1 do nothing. WORDS (Q8_0/Q4_0, rows a multiple of 4 bytes,
    BK % 64 == 0): the codes come as aligned int32 words a pair of blocks at a time (pair_tile)
    instead of byte by byte. SUPER (the super-block formats, BK % 256 == 0): BK / 256 whole
    super-blocks a row, header words once, then run by run as int32 words
    (decode.superblocks); ALIGNED: every super-block starts on a word (superblock_words_fit).
    STREAM (MXFP4, launched one block a row, C = 32): BN whole blocks a program, each from
    aligned int32 words wherever it starts (decode.streams; stream_words_fit)."""
    e = tl.program_id(0)
    dst_base = tl.load(dst_slot_ptr + e)
    if dst_base >= 0:
        offs_n = tl.program_id(1) * BN + tl.arange(0, BN)               # [BN]
        w_ptr = arena_ptr + tl.load(slot_ptr + e) + mat_off
        dst = (dst_ptr + dst_base + dst_off).to(tl.pointer_type(tl.bfloat16))
        rows = dst + offs_n[:, None].to(tl.int64) * C
        if SUPER:
            rows = _rows16(dst_ptr, dst_base, dst_off, offs_n, C)
            # byte offsets from the arena's (aligned) first byte; blob slots are 256-aligned
            # (strata.blob), which (slot >> 4) * 16 tells the compiler: with 16-aligned blocks
            # and fields (Q4_K, Q5_K) code words load as 16-byte vectors
            p32 = arena_ptr.to(tl.pointer_type(tl.int32))
            mat_base = (tl.load(slot_ptr + e) >> 4) * 16 + mat_off
            NSB: tl.constexpr = BK // SUPERBLOCK_K
            for r in tl.static_range(NSB):
                sb = tl.program_id(2) * NSB + r
                n_mask = (offs_n < R) & (sb * SUPERBLOCK_K < C)
                base = mat_base + superblock_base(FMT, row_bytes, offs_n, sb)    # [BN]
                head = superblock_head(FMT, p32, base, n_mask, ALIGNED)
                words = superblock_words(FMT, p32, base, n_mask, ALIGNED)
                for run in tl.static_range(SUPERBLOCK_K // 32):
                    v = superblock_run(FMT, words, head, run, n_mask)               # [BN, 32]
                    offs_k = sb * SUPERBLOCK_K + run * 32 + tl.arange(0, 32)
                    tl.store(rows + offs_k[None, :], _bf16(v, INTERP), mask=n_mask[:, None])
        elif STREAM:
            rows = _rows16(dst_ptr, dst_base, dst_off, offs_n, FMT.BLOCK)
            p32 = arena_ptr.to(tl.pointer_type(tl.int32))
            n_mask = offs_n < R
            base = (tl.load(slot_ptr + e) >> 4) * 16 + mat_off + offs_n.to(tl.int64) * FMT.BYTES
            lo, hi = stream_block(FMT, p32, base, n_mask)                      # [BN, 16] x 2
            offs_k = tl.arange(0, FMT.BLOCK // 2)
            tl.store(rows + offs_k[None, :], _bf16(lo, INTERP), mask=n_mask[:, None])
            tl.store(rows + FMT.BLOCK // 2 + offs_k[None, :], _bf16(hi, INTERP),
                     mask=n_mask[:, None])
        elif WORDS:
            rows = _rows16(dst_ptr, dst_base, dst_off, offs_n, C)
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


@triton.jit
def _copy_words_kernel(arena_ptr, slot_ptr, src_off, dst_slot_ptr, dst_ptr, dst_off, N,
                       BW: tl.constexpr):
    """N 4-byte words from arena_ptr + slot[e] + src_off to dst_ptr + dst_slot[e] + dst_off
    (bytes), as int32 bits (an fp32 bias arrives bit for bit); experts with dst_slot[e] = -1 do
    nothing. Both regions start 4-byte aligned (256-aligned blobs and bias slots)."""
    e = tl.program_id(0)
    dst_base = tl.load(dst_slot_ptr + e)
    if dst_base >= 0:
        offs = tl.program_id(1) * BW + tl.arange(0, BW)                   # [BW]
        mask = offs < N
        src = (arena_ptr + tl.load(slot_ptr + e) + src_off).to(tl.pointer_type(tl.int32))
        dst = (dst_ptr + dst_base + dst_off).to(tl.pointer_type(tl.int32))
        tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)
