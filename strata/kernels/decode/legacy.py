"""Triton decoders of the 32-weight one-fp16-scale blocks Q8_0, Q4_0, Q5_0 and Q2_0's 64-weight
block, and the scale-and-offset blocks Q4_1, Q5_1 (mirrors strata.formats.legacy).

Each format is split in two: _<fmt>_scale gives the per-block fp32 factor and _<fmt>_code the
per-weight code as fp32; decode_<fmt> combines them with the format's one combining expression,
so decode_tile (scale per weight) and decode_tile_runs (scale per run) form identical products.

    _<fmt>_scale / _<fmt>_code / decode_<fmt>(w_ptr, row_bytes, offs_n, offs_k, mask)
        -> fp32 [BN, BK]   (arguments: see the package doc)
"""
import triton
import triton.language as tl

from strata.kernels.decode._common import (_block_off, _ld_f16, _ld_u8, _nibble32, _scale_first,
                                           fmt_consts)

GGML_Q8_0, Q8_0_LOG2, Q8_0_BYTES = fmt_consts("Q8_0")
GGML_Q4_0, Q4_0_LOG2, Q4_0_BYTES = fmt_consts("Q4_0")
GGML_Q5_0, Q5_0_LOG2, Q5_0_BYTES = fmt_consts("Q5_0")
GGML_Q2_0, Q2_0_LOG2, Q2_0_BYTES = fmt_consts("Q2_0")
GGML_Q4_1, Q4_1_LOG2, Q4_1_BYTES = fmt_consts("Q4_1")
GGML_Q5_1, Q5_1_LOG2, Q5_1_BYTES = fmt_consts("Q5_1")


@triton.jit
def _q8_0_scale(w_ptr, row_bytes, offs_n, offs_k, mask):
    return _ld_f16(w_ptr, _block_off(row_bytes, offs_n, offs_k, Q8_0_LOG2, Q8_0_BYTES), mask)


@triton.jit
def _q8_0_code(w_ptr, row_bytes, offs_n, offs_k, mask):
    blk = _block_off(row_bytes, offs_n, offs_k, Q8_0_LOG2, Q8_0_BYTES)   # [BN, BK]
    q = tl.load(w_ptr + blk + 2 + (offs_k & 31)[None, :], mask=mask, other=0)
    return q.to(tl.int8, bitcast=True).to(tl.float32)


@triton.jit
def _q8_0_value(d, q):
    return q * d


@triton.jit
def decode_q8_0(w_ptr, row_bytes, offs_n, offs_k, mask):
    """Q8_0 (34 B): fp16 d; int8 qs[32]. w = q * d."""
    return _q8_0_value(_q8_0_scale(w_ptr, row_bytes, offs_n, offs_k, mask),
                       _q8_0_code(w_ptr, row_bytes, offs_n, offs_k, mask))


@triton.jit
def _q4_0_scale(w_ptr, row_bytes, offs_n, offs_k, mask):
    return _ld_f16(w_ptr, _block_off(row_bytes, offs_n, offs_k, Q4_0_LOG2, Q4_0_BYTES), mask)


@triton.jit
def _q4_0_code(w_ptr, row_bytes, offs_n, offs_k, mask):
    blk = _block_off(row_bytes, offs_n, offs_k, Q4_0_LOG2, Q4_0_BYTES)
    return (_nibble32(w_ptr, blk, offs_k & 31, mask, 2) - 8).to(tl.float32)


@triton.jit
def decode_q4_0(w_ptr, row_bytes, offs_n, offs_k, mask):
    """Q4_0 (18 B): fp16 d; qs[16], weight j in qs[j % 16] (low nibble j < 16). w = d * (q - 8)."""
    return _scale_first(_q4_0_scale(w_ptr, row_bytes, offs_n, offs_k, mask),
                        _q4_0_code(w_ptr, row_bytes, offs_n, offs_k, mask))


@triton.jit
def _q5_0_scale(w_ptr, row_bytes, offs_n, offs_k, mask):
    return _ld_f16(w_ptr, _block_off(row_bytes, offs_n, offs_k, Q5_0_LOG2, Q5_0_BYTES), mask)


@triton.jit
def _q5_0_code(w_ptr, row_bytes, offs_n, offs_k, mask):
    j = offs_k & 31
    blk = _block_off(row_bytes, offs_n, offs_k, Q5_0_LOG2, Q5_0_BYTES)
    hb = _ld_u8(w_ptr, blk + 2 + (j >> 3)[None, :], mask)
    q = _nibble32(w_ptr, blk, j, mask, 6) | (((hb >> (j & 7)[None, :]) & 1) << 4)
    return (q - 16).to(tl.float32)


@triton.jit
def decode_q5_0(w_ptr, row_bytes, offs_n, offs_k, mask):
    """Q5_0 (22 B): fp16 d; qh[4] (bit j = 5th bit of weight j); qs[16] as Q4_0. w = d*(q - 16)."""
    return _scale_first(_q5_0_scale(w_ptr, row_bytes, offs_n, offs_k, mask),
                        _q5_0_code(w_ptr, row_bytes, offs_n, offs_k, mask))


@triton.jit
def _q2_0_scale(w_ptr, row_bytes, offs_n, offs_k, mask):
    return _ld_f16(w_ptr, _block_off(row_bytes, offs_n, offs_k, Q2_0_LOG2, Q2_0_BYTES), mask)


@triton.jit
def _q2_0_code(w_ptr, row_bytes, offs_n, offs_k, mask):
    j = offs_k & 63
    blk = _block_off(row_bytes, offs_n, offs_k, Q2_0_LOG2, Q2_0_BYTES)
    byte = _ld_u8(w_ptr, blk + 2 + (j >> 2)[None, :], mask)
    return (((byte >> ((j & 3) * 2)[None, :]) & 3) - 1).to(tl.float32)


@triton.jit
def decode_q2_0(w_ptr, row_bytes, offs_n, offs_k, mask):
    """Q2_0 (18 B / 64 weights): fp16 d; weight j at bits 2*(j%4) of qs[j/4]. w = (q - 1) * d."""
    return _q8_0_value(_q2_0_scale(w_ptr, row_bytes, offs_n, offs_k, mask),
                       _q2_0_code(w_ptr, row_bytes, offs_n, offs_k, mask))


@triton.jit
def _q4_1_scale(w_ptr, row_bytes, offs_n, offs_k, mask):
    """(d, m) of the block."""
    blk = _block_off(row_bytes, offs_n, offs_k, Q4_1_LOG2, Q4_1_BYTES)
    return _ld_f16(w_ptr, blk, mask), _ld_f16(w_ptr, blk + 2, mask)


@triton.jit
def _q4_1_code(w_ptr, row_bytes, offs_n, offs_k, mask):
    blk = _block_off(row_bytes, offs_n, offs_k, Q4_1_LOG2, Q4_1_BYTES)
    return _nibble32(w_ptr, blk, offs_k & 31, mask, 4).to(tl.float32)


@triton.jit
def _affine_value(d, m, q):
    return d * q + m


@triton.jit
def decode_q4_1(w_ptr, row_bytes, offs_n, offs_k, mask):
    """Q4_1 (20 B): fp16 d, m; qs[16] nibbles as Q4_0. w = d * q + m."""
    d, m = _q4_1_scale(w_ptr, row_bytes, offs_n, offs_k, mask)
    return _affine_value(d, m, _q4_1_code(w_ptr, row_bytes, offs_n, offs_k, mask))


@triton.jit
def _q5_1_scale(w_ptr, row_bytes, offs_n, offs_k, mask):
    blk = _block_off(row_bytes, offs_n, offs_k, Q5_1_LOG2, Q5_1_BYTES)
    return _ld_f16(w_ptr, blk, mask), _ld_f16(w_ptr, blk + 2, mask)


@triton.jit
def _q5_1_code(w_ptr, row_bytes, offs_n, offs_k, mask):
    j = offs_k & 31
    blk = _block_off(row_bytes, offs_n, offs_k, Q5_1_LOG2, Q5_1_BYTES)
    hb = _ld_u8(w_ptr, blk + 4 + (j >> 3)[None, :], mask)
    q = _nibble32(w_ptr, blk, j, mask, 8) | (((hb >> (j & 7)[None, :]) & 1) << 4)
    return q.to(tl.float32)


@triton.jit
def decode_q5_1(w_ptr, row_bytes, offs_n, offs_k, mask):
    """Q5_1 (24 B): fp16 d, m; qh[4] (bit j = 5th bit of weight j); qs[16]. w = d * q + m."""
    d, m = _q5_1_scale(w_ptr, row_bytes, offs_n, offs_k, mask)
    return _affine_value(d, m, _q5_1_code(w_ptr, row_bytes, offs_n, offs_k, mask))
