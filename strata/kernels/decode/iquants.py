"""Triton decoders of the importance-matrix formats IQ4_NL, IQ4_XS, IQ3_S, IQ3_XXS (mirrors
strata.formats.iquants).

IQ4_NL / IQ4_XS look their 16 levels up in registers (packed constants built from
strata.formats.tables); IQ3_S and IQ3_XXS read their grids from memory: their decoders take one
more argument, tab_ptr, the one int32 i-quant table on the device
(`strata.formats.tables.device_table("iq", device)`; IQ3_S's words are its first 512 entries, the
other grids sit at `iq_table_offset(name)`). _ksign / _ksign_of: the ksigns_iq2xs sign bits the
IQ2 family shares, computed in registers rather than looked up.

    _<fmt>_scale(w_ptr, row_bytes, offs_n, offs_k, mask) / _<fmt>_code(..., mask, tab_ptr)
        -> fp32 [BN, BK] (the grid formats' codes: (magnitude, sign bit)); one traits bundle a
        format at the end (arguments: see the package doc and strata.kernels.decode.bundle)
"""
import triton
import triton.language as tl

from strata.formats.tables import KVALUES_IQ4NL, iq_table_offset
from strata.kernels.decode._common import (_block_off, _ld_f16, _ld_u8, _nibble32, _scale_first,
                                           fmt_consts, pack_bytes)
from strata.kernels.decode.bundle import traits
from strata.kernels.decode.superblocks import _byte, _pick8, _word, _words
from strata.kernels.decode.words import _half_f32, _interleave4

IQ4_NL_LOG2, IQ4_NL_BYTES = fmt_consts("IQ4_NL")
IQ3_S_LOG2, IQ3_S_BYTES = fmt_consts("IQ3_S")
IQ4_XS_LOG2, IQ4_XS_BYTES = fmt_consts("IQ4_XS")
IQ3_XXS_LOG2, IQ3_XXS_BYTES = fmt_consts("IQ3_XXS")
IQ3_XXS_TAB = tl.constexpr(iq_table_offset("IQ3_XXS"))

_IQ4NL_W = pack_bytes(KVALUES_IQ4NL)
IQ4NL_W0 = tl.constexpr(_IQ4NL_W[0])
IQ4NL_W1 = tl.constexpr(_IQ4NL_W[1])
IQ4NL_W2 = tl.constexpr(_IQ4NL_W[2])
IQ4NL_W3 = tl.constexpr(_IQ4NL_W[3])


@triton.jit
def _iq4nl_level(q):
    """kvalues_iq4nl[q] for int32 q in [0, 16), from packed register constants."""
    word = tl.where(q < 8, tl.where(q < 4, IQ4NL_W0, IQ4NL_W1),
                    tl.where(q < 12, IQ4NL_W2, IQ4NL_W3))
    return (word << (24 - 8 * (q & 3))) >> 24                           # sign-extend the byte


@triton.jit
def _iq4_nl_scale(w_ptr, row_bytes, offs_n, offs_k, mask):
    return _ld_f16(w_ptr, _block_off(row_bytes, offs_n, offs_k, IQ4_NL_LOG2, IQ4_NL_BYTES), mask)


@triton.jit
def _iq4_nl_code(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr=None):
    """IQ4_NL (18 B): fp16 d; qs[16] nibbles as Q4_0 index kvalues_iq4nl. w = d * kv[q]."""
    blk = _block_off(row_bytes, offs_n, offs_k, IQ4_NL_LOG2, IQ4_NL_BYTES)
    return _iq4nl_level(_nibble32(w_ptr, blk, offs_k & 31, mask, 2)).to(tl.float32)


@triton.jit
def _iq3_s_scale(w_ptr, row_bytes, offs_n, offs_k, mask):
    """d * (1 + 2*sc), sc = nibble w/32 of scales[4] (low nibble first)."""
    w = offs_k & 255
    blk = _block_off(row_bytes, offs_n, offs_k, IQ3_S_LOG2, IQ3_S_BYTES)
    d = _ld_f16(w_ptr, blk, mask)
    scb = _ld_u8(w_ptr, blk + 106 + (w >> 6)[None, :], mask)
    sc = (scb >> (((w >> 5) & 1) * 4)[None, :]) & 15
    return d * (1 + 2 * sc).to(tl.float32)


@triton.jit
def _iq3_s_code(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr):
    """IQ3_S (110 B): fp16 d; qs[64]; qh[8]; signs[32]; scales[4]; tab_ptr: int32 grid [512].
    w = (d * (1 + 2*sc)) * magnitude * (+-1), in that order (see _iq3_s_code).
    (magnitude as fp32, negative?) of weight w: grid point g = w/4 has index
    qs[g] | (bit g of qh) << 8; magnitude = byte w%4 of the grid word; sign = bit w of signs."""
    w = offs_k & 255
    g = w >> 2
    blk = _block_off(row_bytes, offs_n, offs_k, IQ3_S_LOG2, IQ3_S_BYTES)
    lo = _ld_u8(w_ptr, blk + 2 + g[None, :], mask)
    hb = _ld_u8(w_ptr, blk + 66 + (g >> 3)[None, :], mask)
    idx = lo | (((hb >> (g & 7)[None, :]) & 1) << 8)
    word = tl.load(tab_ptr + idx, mask=mask, other=0)
    mag = (word >> ((w & 3) * 8)[None, :]) & 255
    sb = _ld_u8(w_ptr, blk + 74 + (w >> 3)[None, :], mask)
    return mag.to(tl.float32), (sb >> (w & 7)[None, :]) & 1


@triton.jit
def _iq3_s_value(db, c):
    """w = db * magnitude, negated where the sign bit is set; c = (magnitude, sign bit) as the
    grid formats' codes return it."""
    mag, neg = c
    v = db * mag
    # flip the sign bit, as ggml's * -1.0f: Triton's -v is 0 - v, which turns -0 into +0
    return (v.to(tl.uint32, bitcast=True) ^ (neg.to(tl.uint32) << 31)).to(tl.float32, bitcast=True)


@triton.jit
def _iq4_xs_scale(w_ptr, row_bytes, offs_n, offs_k, mask):
    """d * (scale - 32), s = w/32: 6-bit scale = nibble s%2 of scales_l[s/2] | (bits 2(s%4) of
    byte s/4 of scales_h) << 4."""
    s = ((offs_k & 255) >> 5)[None, :]
    blk = _block_off(row_bytes, offs_n, offs_k, IQ4_XS_LOG2, IQ4_XS_BYTES)
    d = _ld_f16(w_ptr, blk, mask)
    hi = (_ld_u8(w_ptr, blk + 2 + (s >> 2), mask) >> ((s & 3) * 2)) & 3
    lo = (_ld_u8(w_ptr, blk + 4 + (s >> 1), mask) >> ((s & 1) * 4)) & 15
    return d * ((lo | (hi << 4)) - 32).to(tl.float32)


@triton.jit
def _iq4_xs_code(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr=None):
    """IQ4_XS (136 B): fp16 d; u16 scales_h; scales_l[4]; qs[128]. w = (d * scale) * kv[q].
    kvalues_iq4nl[nibble (w%32)/16 of qs[16 s + w%16]], s = w/32."""
    w = offs_k & 255
    blk = _block_off(row_bytes, offs_n, offs_k, IQ4_XS_LOG2, IQ4_XS_BYTES)
    byte = _ld_u8(w_ptr, blk + 8 + ((w >> 5) * 16 + (w & 15))[None, :], mask)
    return _iq4nl_level((byte >> (((w >> 4) & 1) * 4)[None, :]) & 15).to(tl.float32)


@triton.jit
def _parity7(v):
    """Parity of the 7-bit int32 v: ksigns_iq2xs's 8th sign bit."""
    v = v ^ (v >> 4)
    v = v ^ (v >> 2)
    v = v ^ (v >> 1)
    return v & 1


@triton.jit
def _ksign(w_ptr, base, grp, bit, mask):
    """1 where weight `bit` (0..7) of group `grp` (0..3) is negative: the group's 7-bit ksigns
    index sits at bits 7*grp of the little-endian word at byte `base`; the sign is bit `bit` of
    ksigns_iq2xs[index], i.e. the index's own bit for bit < 7, its parity for bit 7."""
    p = (grp * 7)[None, :]
    lo = _ld_u8(w_ptr, base + (p >> 3), mask)
    hi = _ld_u8(w_ptr, base + (p >> 3) + 1, mask)
    return _ksign_of(((lo | (hi << 8)) >> (p & 7)) & 127, bit)


@triton.jit
def _ksign_of(v, bit):
    """1 where bit `bit` [BK] (0..7) of ksigns_iq2xs[v] is set, v [BN, BK] 7-bit indices: v's own
    bit below 7, its parity for bit 7 (ksigns makes the count of minus signs even)."""
    return tl.where((bit < 7)[None, :], (v >> bit[None, :]) & 1, _parity7(v))


@triton.jit
def _iq3_xxs_scale(w_ptr, row_bytes, offs_n, offs_k, mask):
    """(d * (0.5 + sc)) * 0.5, sc = top nibble of sub-block s's u32 (s = w/32)."""
    s = ((offs_k & 255) >> 5)[None, :]
    blk = _block_off(row_bytes, offs_n, offs_k, IQ3_XXS_LOG2, IQ3_XXS_BYTES)
    d = _ld_f16(w_ptr, blk, mask)
    sc = _ld_u8(w_ptr, blk + 66 + s * 4 + 3, mask) >> 4
    return d * (0.5 + sc.to(tl.float32)) * 0.5


@triton.jit
def _iq3_xxs_code(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr):
    """IQ3_XXS (98 B): fp16 d; qs[64]; 8 u32 (4 x 7-bit ksigns | 4-bit scale); tab_ptr: the
    i-quant table. w = ((d * (0.5 + sc)) * 0.5) * magnitude * (+-1).
    (magnitude, negative?): grid point w/4 indexes the 256 x 4 grid (qs[w/4]); signs from
    sub-block s's u32 at byte 66 + 4s, group (w%32)/8."""
    w = offs_k & 255
    blk = _block_off(row_bytes, offs_n, offs_k, IQ3_XXS_LOG2, IQ3_XXS_BYTES)
    idx = _ld_u8(w_ptr, blk + 2 + (w >> 2)[None, :], mask)
    mag = tl.load(tab_ptr + IQ3_XXS_TAB + idx * 4 + (w & 3)[None, :], mask=mask, other=0)
    neg = _ksign(w_ptr, blk + 66 + ((w >> 5) * 4)[None, :], (w >> 3) & 3, w & 7, mask)
    return mag.to(tl.float32), neg


@triton.jit
def _iq4_xs_sb_head(p32, base, mask_n, ALIGNED: tl.constexpr):
    """IQ4_XS super-block header words: (d | scales_h << 16, scales_l[0:4], 0, 0, 0)."""
    z = tl.zeros(base.shape, tl.int32)
    return (_word(p32, base, 0, mask_n, ALIGNED), _word(p32, base, 4, mask_n, ALIGNED), z, z, z)


@triton.jit
def _iq4_xs_sb_words(p32, base, mask_n, ALIGNED: tl.constexpr):
    """IQ4_XS code words: tensor k holds run k's 16 qs bytes twice (words j % 4)."""
    q = tl.arange(0, 8) & 3
    return (_words(p32, base, 8, q, mask_n, ALIGNED), _words(p32, base, 24, q, mask_n, ALIGNED),
            _words(p32, base, 40, q, mask_n, ALIGNED), _words(p32, base, 56, q, mask_n, ALIGNED),
            _words(p32, base, 72, q, mask_n, ALIGNED), _words(p32, base, 88, q, mask_n, ALIGNED),
            _words(p32, base, 104, q, mask_n, ALIGNED),
            _words(p32, base, 120, q, mask_n, ALIGNED))


@triton.jit
def _iq4_xs_sb_run(words, head, RUN: tl.constexpr):
    """qs[128] at 8: 16 bytes a run, weight l < 16 the low nibble of byte l, l >= 16 the high
    nibble of byte l - 16: 8 virtual words, word j = bytes of word j % 4, nibble j // 4."""
    h0, h1, h2, h3, h4 = head
    x = _pick8(words, RUN)
    sh = (tl.arange(0, 8) >> 2)[None, :] * 4
    q = _interleave4((x >> sh) & 15, (x >> (sh + 8)) & 15, (x >> (sh + 16)) & 15,
                     (x >> (sh + 24)) & 15)
    lo = _byte(h1, RUN // 2) >> (4 * (RUN % 2)) & 15
    hi = (h0 >> (16 + 2 * RUN)) & 3
    ds = _half_f32(h0) * ((lo | (hi << 4)) - 32).to(tl.float32)
    return ds[:, None] * _iq4nl_level(q).to(tl.float32)


IQ4_NL = traits("IQ4_NL", _iq4_nl_code, _iq4_nl_scale, _scale_first)
IQ3_S = traits("IQ3_S", _iq3_s_code, _iq3_s_scale, _iq3_s_value, GRID=True)
IQ3_XXS = traits("IQ3_XXS", _iq3_xxs_code, _iq3_xxs_scale, _iq3_s_value, GRID=True)
IQ4_XS = traits("IQ4_XS", _iq4_xs_code, _iq4_xs_scale, _scale_first, sb_head=_iq4_xs_sb_head,
                sb_words=_iq4_xs_sb_words, sb_run=_iq4_xs_sb_run)
