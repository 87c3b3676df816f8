"""Triton decoders of the 256-weight k-quants Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (mirrors
strata.formats.kquants).

Split as the legacy family's (_<fmt>_scale, _<fmt>_code, one combining expression); the scale of
Q4_K is a pair (d * sc, dmin * m) per 32-weight sub-block, Q6_K's one factor per 16 weights.

    _<fmt>_scale / _<fmt>_code / decode_<fmt>(w_ptr, row_bytes, offs_n, offs_k, mask)
        -> fp32 [BN, BK]   (arguments: see the package doc)
"""
import triton
import triton.language as tl

from strata.kernels.decode._common import _block_off, _ld_f16, _ld_u8, _scale_first, fmt_consts

GGML_Q4_K, Q4_K_LOG2, Q4_K_BYTES = fmt_consts("Q4_K")
GGML_Q6_K, Q6_K_LOG2, Q6_K_BYTES = fmt_consts("Q6_K")
GGML_Q2_K, Q2_K_LOG2, Q2_K_BYTES = fmt_consts("Q2_K")
GGML_Q3_K, Q3_K_LOG2, Q3_K_BYTES = fmt_consts("Q3_K")
GGML_Q5_K, Q5_K_LOG2, Q5_K_BYTES = fmt_consts("Q5_K")


@triton.jit
def _scale_min_k4(w_ptr, blk, s, mask):
    """(d * sc[s], dmin * m[s]) of the Q4_K/Q5_K block at `blk` for sub-blocks s [BK]: fp16 d,
    dmin at bytes 0, 2; 6-bit sc/m from scales[12] at byte 4 as ggml's get_scale_min_k4."""
    d = _ld_f16(w_ptr, blk, mask)
    dmin = _ld_f16(w_ptr, blk + 2, mask)
    sj = (s & 3)[None, :]
    b_d = _ld_u8(w_ptr, blk + 4 + sj, mask)
    b_m = _ld_u8(w_ptr, blk + 8 + sj, mask)
    b_md = _ld_u8(w_ptr, blk + 12 + sj, mask)
    first = (s < 4)[None, :]
    sc = tl.where(first, b_d & 63, (b_md & 15) | ((b_d >> 6) << 4))
    mn = tl.where(first, b_m & 63, (b_md >> 4) | ((b_m >> 6) << 4))
    return d * sc.to(tl.float32), dmin * mn.to(tl.float32)


@triton.jit
def _q4_k_scale(w_ptr, row_bytes, offs_n, offs_k, mask):
    """(d * sc[s], dmin * m[s]) for sub-block s = w/32, 6-bit sc/m as get_scale_min_k4."""
    blk = _block_off(row_bytes, offs_n, offs_k, Q4_K_LOG2, Q4_K_BYTES)
    return _scale_min_k4(w_ptr, blk, (offs_k & 255) >> 5, mask)


@triton.jit
def _q4_k_code(w_ptr, row_bytes, offs_n, offs_k, mask):
    w = offs_k & 255
    s = w >> 5
    blk = _block_off(row_bytes, offs_n, offs_k, Q4_K_LOG2, Q4_K_BYTES)
    byte = _ld_u8(w_ptr, blk + 16 + ((s >> 1) * 32 + (w & 31))[None, :], mask)
    return ((byte >> ((s & 1) * 4)[None, :]) & 15).to(tl.float32)


@triton.jit
def _q4_k_value(dsc, dm, q):
    return dsc * q - dm


@triton.jit
def decode_q4_k(w_ptr, row_bytes, offs_n, offs_k, mask):
    """Q4_K (144 B): fp16 d, dmin; scales[12]; qs[128]. Sub-block s = w/32 takes nibble s%2 of
    qs[32*(s/2) + w%32] and 6-bit (sc, m) from get_scale_min_k4. w = (d*sc)*q - dmin*m."""
    dsc, dm = _q4_k_scale(w_ptr, row_bytes, offs_n, offs_k, mask)
    return _q4_k_value(dsc, dm, _q4_k_code(w_ptr, row_bytes, offs_n, offs_k, mask))


@triton.jit
def _q6_k_scale(w_ptr, row_bytes, offs_n, offs_k, mask):
    """d * scale[w/16] (int8 scales, one per 16 weights)."""
    blk = _block_off(row_bytes, offs_n, offs_k, Q6_K_LOG2, Q6_K_BYTES)
    d = _ld_f16(w_ptr, blk + 208, mask)
    sc = tl.load(w_ptr + blk + 192 + ((offs_k & 255) >> 4)[None, :], mask=mask, other=0)
    return d * sc.to(tl.int8, bitcast=True).to(tl.float32)


@triton.jit
def _q6_k_code(w_ptr, row_bytes, offs_n, offs_k, mask):
    w = offs_k & 255
    h = w >> 7
    r = w & 127
    blk = _block_off(row_bytes, offs_n, offs_k, Q6_K_LOG2, Q6_K_BYTES)
    lb = _ld_u8(w_ptr, blk + (h * 64 + (r & 63))[None, :], mask)
    hb = _ld_u8(w_ptr, blk + 128 + (h * 32 + (r & 31))[None, :], mask)
    q = ((lb >> ((r >> 6) * 4)[None, :]) & 15) | (((hb >> ((r >> 5) * 2)[None, :]) & 3) << 4)
    return (q - 32).to(tl.float32)


@triton.jit
def decode_q6_k(w_ptr, row_bytes, offs_n, offs_k, mask):
    """Q6_K (210 B): ql[128]; qh[64]; int8 scales[16]; fp16 d. h = w/128, r = w%128:
    q = ql[64h + r%64] >> 4*(r/64) & 15 | (qh[32h + r%32] >> 2*(r/32) & 3) << 4.
    w = (d * scale[w/16]) * (q - 32)."""
    return _scale_first(_q6_k_scale(w_ptr, row_bytes, offs_n, offs_k, mask),
                        _q6_k_code(w_ptr, row_bytes, offs_n, offs_k, mask))


@triton.jit
def _crumb(w_ptr, blk, w, mask, QS: tl.constexpr):
    """Q2_K/Q3_K 2-bit code of weight w (0..255) from qs[64] at byte QS: byte
    32*(w/128) + w%32, bits 2*((w%128)/32)."""
    byte = _ld_u8(w_ptr, blk + QS + ((w >> 7) * 32 + (w & 31))[None, :], mask)
    return (byte >> (((w >> 5) & 3) * 2)[None, :]) & 3


@triton.jit
def _q2_k_scale(w_ptr, row_bytes, offs_n, offs_k, mask):
    """(d * sc[s], dmin * m[s]) for s = w/16: scales[s] low nibble sc, high nibble m."""
    s = (offs_k & 255) >> 4
    blk = _block_off(row_bytes, offs_n, offs_k, Q2_K_LOG2, Q2_K_BYTES)
    d = _ld_f16(w_ptr, blk + 80, mask)
    dmin = _ld_f16(w_ptr, blk + 82, mask)
    b = _ld_u8(w_ptr, blk + s[None, :], mask)
    return d * (b & 15).to(tl.float32), dmin * (b >> 4).to(tl.float32)


@triton.jit
def _q2_k_code(w_ptr, row_bytes, offs_n, offs_k, mask):
    blk = _block_off(row_bytes, offs_n, offs_k, Q2_K_LOG2, Q2_K_BYTES)
    return _crumb(w_ptr, blk, offs_k & 255, mask, 16).to(tl.float32)


@triton.jit
def decode_q2_k(w_ptr, row_bytes, offs_n, offs_k, mask):
    """Q2_K (84 B): scales[16]; qs[64] 2-bit (_crumb); fp16 d, dmin.
    w = (d * sc[w/16]) * q - (dmin * m[w/16])."""
    dl, ml = _q2_k_scale(w_ptr, row_bytes, offs_n, offs_k, mask)
    return _q4_k_value(dl, ml, _q2_k_code(w_ptr, row_bytes, offs_n, offs_k, mask))


@triton.jit
def _q3_k_scale(w_ptr, row_bytes, offs_n, offs_k, mask):
    """d * scale[s], s = w/16: 6-bit scale = nibble s/8 of scales[s%8] | (bits 2*(s/4) of
    scales[8 + s%4]) << 4, minus 32."""
    s = ((offs_k & 255) >> 4)[None, :]
    blk = _block_off(row_bytes, offs_n, offs_k, Q3_K_LOG2, Q3_K_BYTES)
    d = _ld_f16(w_ptr, blk + 108, mask)
    lo = (_ld_u8(w_ptr, blk + 96 + (s & 7), mask) >> ((s >> 3) * 4)) & 15
    hi = (_ld_u8(w_ptr, blk + 104 + (s & 3), mask) >> ((s >> 2) * 2)) & 3
    return d * ((lo | (hi << 4)) - 32).to(tl.float32)


@triton.jit
def _q3_k_code(w_ptr, row_bytes, offs_n, offs_k, mask):
    """crumb - 4 where bit w/32 of hmask[w%32] is clear."""
    w = offs_k & 255
    blk = _block_off(row_bytes, offs_n, offs_k, Q3_K_LOG2, Q3_K_BYTES)
    hb = (_ld_u8(w_ptr, blk + (w & 31)[None, :], mask) >> (w >> 5)[None, :]) & 1
    return (_crumb(w_ptr, blk, w, mask, 32) - 4 * (1 - hb)).to(tl.float32)


@triton.jit
def decode_q3_k(w_ptr, row_bytes, offs_n, offs_k, mask):
    """Q3_K (110 B): hmask[32]; qs[64] 2-bit; scales[12] 6-bit; fp16 d. w = (d * scale) * q."""
    return _scale_first(_q3_k_scale(w_ptr, row_bytes, offs_n, offs_k, mask),
                        _q3_k_code(w_ptr, row_bytes, offs_n, offs_k, mask))


@triton.jit
def _q5_k_scale(w_ptr, row_bytes, offs_n, offs_k, mask):
    """(d * sc[s], dmin * m[s]), s = w/32, the scales of Q4_K at the same offsets."""
    blk = _block_off(row_bytes, offs_n, offs_k, Q5_K_LOG2, Q5_K_BYTES)
    return _scale_min_k4(w_ptr, blk, (offs_k & 255) >> 5, mask)


@triton.jit
def _q5_k_code(w_ptr, row_bytes, offs_n, offs_k, mask):
    """nibble s%2 of qs[32*(s/2) + w%32] | (bit s of qh[w%32]) << 4, s = w/32."""
    w = offs_k & 255
    s = w >> 5
    blk = _block_off(row_bytes, offs_n, offs_k, Q5_K_LOG2, Q5_K_BYTES)
    lo = (_ld_u8(w_ptr, blk + 48 + ((s >> 1) * 32 + (w & 31))[None, :], mask)
          >> ((s & 1) * 4)[None, :]) & 15
    hi = (_ld_u8(w_ptr, blk + 16 + (w & 31)[None, :], mask) >> s[None, :]) & 1
    return (lo | (hi << 4)).to(tl.float32)


@triton.jit
def decode_q5_k(w_ptr, row_bytes, offs_n, offs_k, mask):
    """Q5_K (176 B): fp16 d, dmin; scales[12] as Q4_K; qh[32]; qs[128].
    w = (d * sc) * q - (dmin * m)."""
    dsc, dm = _q5_k_scale(w_ptr, row_bytes, offs_n, offs_k, mask)
    return _q4_k_value(dsc, dm, _q5_k_code(w_ptr, row_bytes, offs_n, offs_k, mask))
