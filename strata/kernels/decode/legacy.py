"""Triton decoders of the 32-weight one-fp16-scale blocks Q8_0, Q4_0, Q5_0 and Q2_0's 64-weight
block, and the scale-and-offset blocks Q4_1, Q5_1 (mirrors strata.formats.legacy).

Each format is split in two: _<fmt>_scale gives the per-block fp32 factor and _<fmt>_code the
per-weight code as fp32; its traits bundle (at the end) names them with the format's one
combining expression (`apply`), so decode_tile (scale per weight) and decode_tile_runs (scale per
run) form identical products. Q8_0 and Q4_0 also carry their raw-word and plane-layout functions.

    _<fmt>_scale(w_ptr, row_bytes, offs_n, offs_k, mask) / _<fmt>_code(..., mask, tab_ptr=None)
        -> fp32 [BN, BK]   (arguments: see the package doc and strata.kernels.decode.bundle)
"""
import triton
import triton.language as tl

from strata.kernels.decode._common import (_block_off, _code_first, _f32_of, _ld_f16, _ld_u8,
                                           _nibble32, _pairs, _plus_min, _scale_first, fmt_consts)
from strata.kernels.decode.bundle import traits
from strata.kernels.decode.plane_codes import (CODE_BIAS, CODE_BIAS_BITS, from_group_order,
                                               load_scales, nibble_codes)
from strata.kernels.decode.words import _interleave4

Q8_0_LOG2, Q8_0_BYTES = fmt_consts("Q8_0")
Q4_0_LOG2, Q4_0_BYTES = fmt_consts("Q4_0")
Q5_0_LOG2, Q5_0_BYTES = fmt_consts("Q5_0")
Q2_0_LOG2, Q2_0_BYTES = fmt_consts("Q2_0")
Q4_1_LOG2, Q4_1_BYTES = fmt_consts("Q4_1")
Q5_1_LOG2, Q5_1_BYTES = fmt_consts("Q5_1")


@triton.jit
def _q8_0_scale(w_ptr, row_bytes, offs_n, offs_k, mask):
    return _ld_f16(w_ptr, _block_off(row_bytes, offs_n, offs_k, Q8_0_LOG2, Q8_0_BYTES), mask)


@triton.jit
def _q8_0_code(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr=None):
    """Q8_0 (34 B): fp16 d; int8 qs[32]. w = q * d."""
    blk = _block_off(row_bytes, offs_n, offs_k, Q8_0_LOG2, Q8_0_BYTES)   # [BN, BK]
    q = tl.load(w_ptr + blk + 2 + (offs_k & 31)[None, :], mask=mask, other=0)
    return q.to(tl.int8, bitcast=True).to(tl.float32)


@triton.jit
def _q4_0_scale(w_ptr, row_bytes, offs_n, offs_k, mask):
    return _ld_f16(w_ptr, _block_off(row_bytes, offs_n, offs_k, Q4_0_LOG2, Q4_0_BYTES), mask)


@triton.jit
def _q4_0_code(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr=None):
    """Q4_0 (18 B): fp16 d; qs[16], weight j in qs[j % 16] (low nibble j < 16). w = d * (q - 8)."""
    blk = _block_off(row_bytes, offs_n, offs_k, Q4_0_LOG2, Q4_0_BYTES)
    return (_nibble32(w_ptr, blk, offs_k & 31, mask, 2) - 8).to(tl.float32)


@triton.jit
def _q5_0_scale(w_ptr, row_bytes, offs_n, offs_k, mask):
    return _ld_f16(w_ptr, _block_off(row_bytes, offs_n, offs_k, Q5_0_LOG2, Q5_0_BYTES), mask)


@triton.jit
def _q5_0_code(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr=None):
    """Q5_0 (22 B): fp16 d; qh[4] (bit j = 5th bit of weight j); qs[16] as Q4_0. w = d*(q - 16)."""
    j = offs_k & 31
    blk = _block_off(row_bytes, offs_n, offs_k, Q5_0_LOG2, Q5_0_BYTES)
    hb = _ld_u8(w_ptr, blk + 2 + (j >> 3)[None, :], mask)
    q = _nibble32(w_ptr, blk, j, mask, 6) | (((hb >> (j & 7)[None, :]) & 1) << 4)
    return (q - 16).to(tl.float32)


@triton.jit
def _q2_0_scale(w_ptr, row_bytes, offs_n, offs_k, mask):
    return _ld_f16(w_ptr, _block_off(row_bytes, offs_n, offs_k, Q2_0_LOG2, Q2_0_BYTES), mask)


@triton.jit
def _q2_0_code(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr=None):
    """Q2_0 (18 B / 64 weights): fp16 d; weight j at bits 2*(j%4) of qs[j/4]. w = (q - 1) * d."""
    j = offs_k & 63
    blk = _block_off(row_bytes, offs_n, offs_k, Q2_0_LOG2, Q2_0_BYTES)
    byte = _ld_u8(w_ptr, blk + 2 + (j >> 2)[None, :], mask)
    return (((byte >> ((j & 3) * 2)[None, :]) & 3) - 1).to(tl.float32)


@triton.jit
def _q4_1_scale(w_ptr, row_bytes, offs_n, offs_k, mask):
    """(d, m) of the block."""
    blk = _block_off(row_bytes, offs_n, offs_k, Q4_1_LOG2, Q4_1_BYTES)
    return _ld_f16(w_ptr, blk, mask), _ld_f16(w_ptr, blk + 2, mask)


@triton.jit
def _q4_1_code(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr=None):
    """Q4_1 (20 B): fp16 d, m; qs[16] nibbles as Q4_0. w = d * q + m."""
    blk = _block_off(row_bytes, offs_n, offs_k, Q4_1_LOG2, Q4_1_BYTES)
    return _nibble32(w_ptr, blk, offs_k & 31, mask, 4).to(tl.float32)


@triton.jit
def _q5_1_scale(w_ptr, row_bytes, offs_n, offs_k, mask):
    blk = _block_off(row_bytes, offs_n, offs_k, Q5_1_LOG2, Q5_1_BYTES)
    return _ld_f16(w_ptr, blk, mask), _ld_f16(w_ptr, blk + 2, mask)


@triton.jit
def _q5_1_code(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr=None):
    """Q5_1 (24 B): fp16 d, m; qh[4] (bit j = 5th bit of weight j); qs[16]. w = d * q + m."""
    j = offs_k & 31
    blk = _block_off(row_bytes, offs_n, offs_k, Q5_1_LOG2, Q5_1_BYTES)
    hb = _ld_u8(w_ptr, blk + 4 + (j >> 3)[None, :], mask)
    q = _nibble32(w_ptr, blk, j, mask, 8) | (((hb >> (j & 7)[None, :]) & 1) << 4)
    return q.to(tl.float32)


# ---------------------------------------------------------------- raw code words (Q8_0, Q4_0)
#
# strata.kernels.decode.words: a run's code bytes from `base` (its first code byte, even) as
# raw words, the codes from them, and a block pair's codes from aligned int32 words.


@triton.jit
def _q8_0_word_bytes(w_ptr, base, mask_n, WIDE: tl.constexpr):
    """(lo, hi): int8 [BN, 16] each (codes 0-15, 16-31), WIDE int16 [BN, 8]."""
    m = mask_n[:, None]
    if WIDE:
        p16 = w_ptr.to(tl.pointer_type(tl.int16))
        b16 = (base >> 1)[:, None]
        lo = tl.load(p16 + b16 + tl.arange(0, 8)[None, :], mask=m, other=0)
        hi = tl.load(p16 + b16 + 8 + tl.arange(0, 8)[None, :], mask=m, other=0)
    else:
        p8 = w_ptr.to(tl.pointer_type(tl.int8))
        lo = tl.load(p8 + base[:, None] + tl.arange(0, 16)[None, :], mask=m, other=0)
        hi = tl.load(p8 + base[:, None] + 16 + tl.arange(0, 16)[None, :], mask=m, other=0)
    return lo, hi


@triton.jit
def _q4_0_word_bytes(w_ptr, base, mask_n, WIDE: tl.constexpr):
    """(lo, lo): the 16 qs bytes (uint8 [BN, 16]; WIDE int16 [BN, 8]) hold both halves."""
    m = mask_n[:, None]
    if WIDE:
        p16 = w_ptr.to(tl.pointer_type(tl.int16))
        lo = tl.load(p16 + (base >> 1)[:, None] + tl.arange(0, 8)[None, :], mask=m, other=0)
    else:
        lo = tl.load(w_ptr + base[:, None] + tl.arange(0, 16)[None, :], mask=m, other=0)
    return lo, lo


@triton.jit
def _q8_0_word_codes(lo, hi, WIDE: tl.constexpr, MAGIC: tl.constexpr):
    """(c_lo, c_hi) fp32 [BN, 16] of _q8_0_word_bytes' words."""
    if WIDE:   # little-endian: code 2i in the low byte of word i, 2i + 1 in the high byte
        wl = lo.to(tl.int32)
        wh = hi.to(tl.int32)
        if MAGIC:   # q + 128 = the byte with its top bit flipped
            c_lo = _f32_of(_pairs((wl & 255) ^ 128, ((wl >> 8) & 255) ^ 128), 128.0)
            c_hi = _f32_of(_pairs((wh & 255) ^ 128, ((wh >> 8) & 255) ^ 128), 128.0)
        else:
            c_lo = _pairs((wl << 24) >> 24, wl >> 8).to(tl.float32)
            c_hi = _pairs((wh << 24) >> 24, wh >> 8).to(tl.float32)
    else:
        if MAGIC:
            c_lo = _f32_of((lo.to(tl.int32) & 255) ^ 128, 128.0)
            c_hi = _f32_of((hi.to(tl.int32) & 255) ^ 128, 128.0)
        else:
            c_lo = lo.to(tl.float32)
            c_hi = hi.to(tl.float32)
    return c_lo, c_hi


@triton.jit
def _q4_0_word_codes(lo, hi, WIDE: tl.constexpr, MAGIC: tl.constexpr):
    """(c_lo, c_hi) fp32 [BN, 16] of _q4_0_word_bytes' words: low nibbles, then high."""
    if WIDE:
        u = lo.to(tl.int32) & 0xFFFF
        n_lo = _pairs(u & 15, (u >> 8) & 15)
        n_hi = _pairs((u >> 4) & 15, u >> 12)
    else:
        u = lo.to(tl.int32)
        n_lo = u & 15
        n_hi = u >> 4
    if MAGIC:
        c_lo = _f32_of(n_lo, 8.0)
        c_hi = _f32_of(n_hi, 8.0)
    else:
        c_lo = (n_lo - 8).to(tl.float32)
        c_hi = (n_hi - 8).to(tl.float32)
    return c_lo, c_hi


@triton.jit
def _q8_0_pair_codes(words, s, MAGIC: tl.constexpr):
    """fp32 [BN, 64]: a Q8_0 block pair's weights from its code words [BN, 16] and their scales
    s [BN, 16]; byte j of code word i is weight 4 i + j."""
    if MAGIC:
        c = _interleave4(_f32_of((words & 255) ^ 128, 128.0) * s,
                         _f32_of(((words >> 8) & 255) ^ 128, 128.0) * s,
                         _f32_of(((words >> 16) & 255) ^ 128, 128.0) * s,
                         _f32_of(((words >> 24) & 255) ^ 128, 128.0) * s)
    else:
        c = _interleave4(((words << 24) >> 24).to(tl.float32) * s,
                         ((words << 16) >> 24).to(tl.float32) * s,
                         ((words << 8) >> 24).to(tl.float32) * s,
                         (words >> 24).to(tl.float32) * s)
    return c


@triton.jit
def _q4_0_pair_codes(words, s, MAGIC: tl.constexpr):
    """fp32 [BN, 64]: a Q4_0 block pair's weights from its code words [BN, 8] and scales; byte j
    of a block's code word i' holds weight 4 i' + j (low nibble) and 16 + 4 i' + j (high):
    [BN, 2, 16] per nibble half, joined and ordered (block, half, 16)."""
    lo = _interleave4(_nib(words, 0, MAGIC) * s, _nib(words, 8, MAGIC) * s,
                      _nib(words, 16, MAGIC) * s, _nib(words, 24, MAGIC) * s)
    hi = _interleave4(_nib(words, 4, MAGIC) * s, _nib(words, 12, MAGIC) * s,
                      _nib(words, 20, MAGIC) * s, _nib(words, 28, MAGIC) * s)
    BN: tl.constexpr = lo.shape[0]
    c = tl.join(tl.reshape(lo, (BN, 2, 16)), tl.reshape(hi, (BN, 2, 16)))   # [BN, 2, 16, 2]
    return tl.reshape(tl.permute(c, (0, 1, 3, 2)), (BN, 64))


@triton.jit
def _nib(words, SH: tl.constexpr, MAGIC: tl.constexpr):
    """fp32 Q4_0 code (nibble at bit SH, minus 8) of every word."""
    n = (words >> SH) & 15
    if MAGIC:
        v = _f32_of(n, 8.0)
    else:
        v = (n - 8).to(tl.float32)
    return v


# ---------------------------------------------------------------- plane layout (Q8_0, Q4_0)


@triton.jit
def _q8_0_plane_codes(b, MAGIC: tl.constexpr, BIASED: tl.constexpr, INTERP: tl.constexpr):
    """fp32 [BN, BK]: the int8 q of code bytes b [BN, BK] (the bytes in strata.planes.Q8_ORDER:
    byte 4i + 2h + p of each 16 holds weight 8h + 2i + p). MAGIC: the sign-extended q added to
    CODE_BIAS's bits (one PRMT and one add a code in sm_90's SASS, where flipping the top bit to
    q + 128 and masking cost four), then a float subtract; BIASED: CODE_BIAS + q, the
    subtraction left to the caller."""
    b = from_group_order(b, (0, 1, 3, 2, 4))
    q = b.to(tl.int8, bitcast=True).to(tl.int32)                      # sign-extended
    if MAGIC:
        f = (q + CODE_BIAS_BITS).to(tl.float32, bitcast=True)         # CODE_BIAS + q
        if not BIASED:
            f = f - CODE_BIAS
    else:
        f = q.to(tl.float32)
    return f


@triton.jit
def _q4_0_plane_codes(b, MAGIC: tl.constexpr, BIASED: tl.constexpr, INTERP: tl.constexpr):
    """fp32 [BN, 2 BB]: q - 8 of each nibble of code pairs b [BN, BB] (strata.planes.Q4_ORDER)."""
    return nibble_codes(b, 8, MAGIC, INTERP)


Q8_0 = traits("Q8_0", _q8_0_code, _q8_0_scale, _code_first, word_bytes=_q8_0_word_bytes,
              word_codes=_q8_0_word_codes, pair_codes=_q8_0_pair_codes, PLANE_PACK=1,
              PLANE_FMA=True, plane_codes=_q8_0_plane_codes, plane_scales=load_scales)
Q4_0 = traits("Q4_0", _q4_0_code, _q4_0_scale, _scale_first, word_bytes=_q4_0_word_bytes,
              word_codes=_q4_0_word_codes, pair_codes=_q4_0_pair_codes, PLANE_PACK=2,
              plane_codes=_q4_0_plane_codes, plane_scales=load_scales)
Q5_0 = traits("Q5_0", _q5_0_code, _q5_0_scale, _scale_first)
Q2_0 = traits("Q2_0", _q2_0_code, _q2_0_scale, _code_first)
Q4_1 = traits("Q4_1", _q4_1_code, _q4_1_scale, _plus_min, PAIR=True)
Q5_1 = traits("Q5_1", _q5_1_code, _q5_1_scale, _plus_min, PAIR=True)
