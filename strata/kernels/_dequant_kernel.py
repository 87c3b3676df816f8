"""The @triton.jit kernel behind strata.kernels.dequant.dequantize (its launcher and reference).

Legend: N rows, K weights a row, BN x BK one program's tile; raw rows of ggml blocks in, out
[N, K] in fp32 / bf16 / fp16 (OUT 0 / 1 / 2).
"""
import triton
import triton.language as tl

from strata.kernels.decode import decode_tile, decode_tile_runs, pair_tile


@triton.jit
def _to_out(v, OUT: tl.constexpr, INTERP: tl.constexpr):
    """fp32 -> the output dtype, round to nearest even (the GPU's cvt). The interpreter's bf16
    cast truncates, so there bf16 is rounded on the bits (NaN kept a NaN)."""
    if OUT == 0:
        return v
    elif OUT == 2:
        return v.to(tl.float16)
    elif INTERP:
        u = v.to(tl.uint32, bitcast=True)
        u = tl.where(v != v, u | 0x00400000, u + 0x7FFF + ((u >> 16) & 1))
        return (u >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return v.to(tl.bfloat16)


@triton.jit
def _dequant_kernel(w_ptr, out_ptr, tab_ptr, N, K, row_bytes, FMT: tl.constexpr,
                    OUT: tl.constexpr, INTERP: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                    RUNS: tl.constexpr, WORDS: tl.constexpr = False):
    """out[n, k] = decode(w)[n, k] for the [BN, BK] tile (program_id(0), program_id(1)).
    w_ptr uint8 [N, row_bytes]; out_ptr [N, K] of OUT; tab_ptr the IQ3_S grid. RUNS: scales once
    per run (decode_tile_runs); WORDS (Q8_0/Q4_0 rows of whole 4-byte words, BK % 64 == 0): a
    pair of blocks a step as aligned int32 words (pair_tile)."""
    offs_n = tl.program_id(0) * BN + tl.arange(0, BN)                     # [BN]
    if WORDS:   # Q8_0/Q4_0, rows of whole 4-byte words: one pair of blocks (64 weights) a step
        for r in tl.static_range(BK // 64):
            pair = tl.program_id(1) * (BK // 64) + r
            n_mask = (offs_n < N) & (pair * 64 < K)
            v = pair_tile(FMT, w_ptr, row_bytes, offs_n, pair, n_mask, True)     # fp32 [BN, 64]
            o = offs_n.to(tl.int64)[:, None] * K + pair * 64 + tl.arange(0, 64)[None, :]
            tl.store(out_ptr + o, _to_out(v, OUT, INTERP), mask=n_mask[:, None])
        return
    offs_k = tl.program_id(1) * BK + tl.arange(0, BK)                     # [BK]
    mask = (offs_n < N)[:, None] & (offs_k < K)[None, :]                  # [BN, BK]
    if RUNS:  # BK is a power of two >= 32 and tiles start at multiples of BK: whole runs
        v = decode_tile_runs(FMT, w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr)
    else:
        v = decode_tile(FMT, w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr)  # fp32 [BN, BK]
    o = offs_n.to(tl.int64)[:, None] * K + offs_k[None, :]
    tl.store(out_ptr + o, _to_out(v, OUT, INTERP), mask=mask)
