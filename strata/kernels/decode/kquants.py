"""Triton decoders of the 256-weight k-quants Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (mirrors
strata.formats.kquants).

Split as the legacy family's (_<fmt>_scale, _<fmt>_code, one combining expression); the scale of
Q4_K is a pair (d * sc, dmin * m) per 32-weight sub-block, Q6_K's one factor per 16 weights.
Each bundle (at the end) also names its super-block word layout (_<fmt>_sb_head / _sb_words /
_sb_run, strata.kernels.decode.superblocks), and Q4_K its plane layout.

    _<fmt>_scale(w_ptr, row_bytes, offs_n, offs_k, mask) / _<fmt>_code(..., mask, tab_ptr=None)
        -> fp32 [BN, BK]   (arguments: see the package doc and strata.kernels.decode.bundle)
"""
import triton
import triton.language as tl

from strata.kernels.decode._common import (_block_off, _f32_of, _ld_f16, _ld_u8, _minus_min,
                                           _scale_first, fmt_consts)
from strata.kernels.decode.bundle import traits
from strata.kernels.decode.plane_codes import nibble_codes
from strata.kernels.decode.superblocks import (_byte, _halves, _half_word, _pick, _pick8, _planes,
                                               _spread4, _word, _words)
from strata.kernels.decode.words import _half_f32

Q4_K_LOG2, Q4_K_BYTES = fmt_consts("Q4_K")
Q6_K_LOG2, Q6_K_BYTES = fmt_consts("Q6_K")
Q2_K_LOG2, Q2_K_BYTES = fmt_consts("Q2_K")
Q3_K_LOG2, Q3_K_BYTES = fmt_consts("Q3_K")
Q5_K_LOG2, Q5_K_BYTES = fmt_consts("Q5_K")


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
def _q4_k_code(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr=None):
    """Q4_K (144 B): fp16 d, dmin; scales[12]; qs[128]. Sub-block s = w/32 takes nibble s%2 of
    qs[32*(s/2) + w%32] and 6-bit (sc, m) from get_scale_min_k4. w = (d*sc)*q - dmin*m."""
    w = offs_k & 255
    s = w >> 5
    blk = _block_off(row_bytes, offs_n, offs_k, Q4_K_LOG2, Q4_K_BYTES)
    byte = _ld_u8(w_ptr, blk + 16 + ((s >> 1) * 32 + (w & 31))[None, :], mask)
    return ((byte >> ((s & 1) * 4)[None, :]) & 15).to(tl.float32)


@triton.jit
def _q6_k_scale(w_ptr, row_bytes, offs_n, offs_k, mask):
    """d * scale[w/16] (int8 scales, one per 16 weights)."""
    blk = _block_off(row_bytes, offs_n, offs_k, Q6_K_LOG2, Q6_K_BYTES)
    d = _ld_f16(w_ptr, blk + 208, mask)
    sc = tl.load(w_ptr + blk + 192 + ((offs_k & 255) >> 4)[None, :], mask=mask, other=0)
    return d * sc.to(tl.int8, bitcast=True).to(tl.float32)


@triton.jit
def _q6_k_code(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr=None):
    """Q6_K (210 B): ql[128]; qh[64]; int8 scales[16]; fp16 d. h = w/128, r = w%128:
    q = ql[64h + r%64] >> 4*(r/64) & 15 | (qh[32h + r%32] >> 2*(r/32) & 3) << 4.
    w = (d * scale[w/16]) * (q - 32)."""
    w = offs_k & 255
    h = w >> 7
    r = w & 127
    blk = _block_off(row_bytes, offs_n, offs_k, Q6_K_LOG2, Q6_K_BYTES)
    lb = _ld_u8(w_ptr, blk + (h * 64 + (r & 63))[None, :], mask)
    hb = _ld_u8(w_ptr, blk + 128 + (h * 32 + (r & 31))[None, :], mask)
    q = ((lb >> ((r >> 6) * 4)[None, :]) & 15) | (((hb >> ((r >> 5) * 2)[None, :]) & 3) << 4)
    return (q - 32).to(tl.float32)


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
def _q2_k_code(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr=None):
    """Q2_K (84 B): scales[16]; qs[64] 2-bit (_crumb); fp16 d, dmin.
    w = (d * sc[w/16]) * q - (dmin * m[w/16])."""
    blk = _block_off(row_bytes, offs_n, offs_k, Q2_K_LOG2, Q2_K_BYTES)
    return _crumb(w_ptr, blk, offs_k & 255, mask, 16).to(tl.float32)


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
def _q3_k_code(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr=None):
    """Q3_K (110 B): hmask[32]; qs[64] 2-bit; scales[12] 6-bit; fp16 d. w = (d * scale) * q.
    crumb - 4 where bit w/32 of hmask[w%32] is clear."""
    w = offs_k & 255
    blk = _block_off(row_bytes, offs_n, offs_k, Q3_K_LOG2, Q3_K_BYTES)
    hb = (_ld_u8(w_ptr, blk + (w & 31)[None, :], mask) >> (w >> 5)[None, :]) & 1
    return (_crumb(w_ptr, blk, w, mask, 32) - 4 * (1 - hb)).to(tl.float32)


@triton.jit
def _q5_k_scale(w_ptr, row_bytes, offs_n, offs_k, mask):
    """(d * sc[s], dmin * m[s]), s = w/32, the scales of Q4_K at the same offsets."""
    blk = _block_off(row_bytes, offs_n, offs_k, Q5_K_LOG2, Q5_K_BYTES)
    return _scale_min_k4(w_ptr, blk, (offs_k & 255) >> 5, mask)


@triton.jit
def _q5_k_code(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr=None):
    """Q5_K (176 B): fp16 d, dmin; scales[12] as Q4_K; qh[32]; qs[128].
    w = (d * sc) * q - (dmin * m).
    nibble s%2 of qs[32*(s/2) + w%32] | (bit s of qh[w%32]) << 4, s = w/32."""
    w = offs_k & 255
    s = w >> 5
    blk = _block_off(row_bytes, offs_n, offs_k, Q5_K_LOG2, Q5_K_BYTES)
    lo = (_ld_u8(w_ptr, blk + 48 + ((s >> 1) * 32 + (w & 31))[None, :], mask)
          >> ((s & 1) * 4)[None, :]) & 15
    hi = (_ld_u8(w_ptr, blk + 16 + (w & 31)[None, :], mask) >> s[None, :]) & 1
    return (lo | (hi << 4)).to(tl.float32)


# ---------------------------------------------------------------- super-block words
#
# The header and code words of one super-block a row (strata.kernels.decode.superblocks), and a
# 32-weight run of it decoded from them; the field offsets are the layouts above.


@triton.jit
def _q4_k_sb_head(p32, base, mask_n, ALIGNED: tl.constexpr):
    """Q4_K / Q5_K: (d | dmin << 16, scales[0:4], scales[4:8], scales[8:12], 0)."""
    return (_word(p32, base, 0, mask_n, ALIGNED), _word(p32, base, 4, mask_n, ALIGNED),
            _word(p32, base, 8, mask_n, ALIGNED), _word(p32, base, 12, mask_n, ALIGNED),
            tl.zeros(base.shape, tl.int32))


@triton.jit
def _q6_k_sb_head(p32, base, mask_n, ALIGNED: tl.constexpr):
    """Q6_K: (scales[0:4], [4:8], [8:12], [12:16], d)."""
    return (_word(p32, base, 192, mask_n, ALIGNED), _word(p32, base, 196, mask_n, ALIGNED),
            _word(p32, base, 200, mask_n, ALIGNED), _word(p32, base, 204, mask_n, ALIGNED),
            _half_word(p32, base, 208, mask_n, ALIGNED))


@triton.jit
def _q2_k_sb_head(p32, base, mask_n, ALIGNED: tl.constexpr):
    """Q2_K: (scales[0:4], [4:8], [8:12], [12:16], d | dmin << 16)."""
    return (_word(p32, base, 0, mask_n, ALIGNED), _word(p32, base, 4, mask_n, ALIGNED),
            _word(p32, base, 8, mask_n, ALIGNED), _word(p32, base, 12, mask_n, ALIGNED),
            _word(p32, base, 80, mask_n, ALIGNED))


@triton.jit
def _q3_k_sb_head(p32, base, mask_n, ALIGNED: tl.constexpr):
    """Q3_K: (scales[0:4], [4:8], [8:12], d, 0)."""
    return (_word(p32, base, 96, mask_n, ALIGNED), _word(p32, base, 100, mask_n, ALIGNED),
            _word(p32, base, 104, mask_n, ALIGNED), _half_word(p32, base, 108, mask_n, ALIGNED),
            tl.zeros(base.shape, tl.int32))


@triton.jit
def _q4_k_sb_words(p32, base, mask_n, ALIGNED: tl.constexpr):
    """Q4_K: k < 4: qs bytes [32 k, 32 k + 32) (at 16)."""
    jj = tl.arange(0, 8)
    z = tl.zeros((base.shape[0], 8), tl.int32)
    return (_words(p32, base, 16, jj, mask_n, ALIGNED), _words(p32, base, 48, jj, mask_n, ALIGNED),
            _words(p32, base, 80, jj, mask_n, ALIGNED),
            _words(p32, base, 112, jj, mask_n, ALIGNED), z, z, z, z)


@triton.jit
def _q5_k_sb_words(p32, base, mask_n, ALIGNED: tl.constexpr):
    """Q5_K: k < 4: qs as Q4_K's (at 48); 4: qh."""
    jj = tl.arange(0, 8)
    z = tl.zeros((base.shape[0], 8), tl.int32)
    return (_words(p32, base, 48, jj, mask_n, ALIGNED), _words(p32, base, 80, jj, mask_n, ALIGNED),
            _words(p32, base, 112, jj, mask_n, ALIGNED),
            _words(p32, base, 144, jj, mask_n, ALIGNED),
            _words(p32, base, 16, jj, mask_n, ALIGNED), z, z, z)


@triton.jit
def _q6_k_sb_words(p32, base, mask_n, ALIGNED: tl.constexpr):
    """Q6_K: k < 4: ql bytes [32 k, +32); 4, 5: qh halves."""
    jj = tl.arange(0, 8)
    z = tl.zeros((base.shape[0], 8), tl.int32)
    return (_words(p32, base, 0, jj, mask_n, ALIGNED), _words(p32, base, 32, jj, mask_n, ALIGNED),
            _words(p32, base, 64, jj, mask_n, ALIGNED), _words(p32, base, 96, jj, mask_n, ALIGNED),
            _words(p32, base, 128, jj, mask_n, ALIGNED),
            _words(p32, base, 160, jj, mask_n, ALIGNED), z, z)


@triton.jit
def _q2_k_sb_words(p32, base, mask_n, ALIGNED: tl.constexpr):
    """Q2_K: k < 2: qs halves (at 16)."""
    jj = tl.arange(0, 8)
    z = tl.zeros((base.shape[0], 8), tl.int32)
    return (_words(p32, base, 16, jj, mask_n, ALIGNED), _words(p32, base, 48, jj, mask_n, ALIGNED),
            z, z, z, z, z, z)


@triton.jit
def _q3_k_sb_words(p32, base, mask_n, ALIGNED: tl.constexpr):
    """Q3_K: k < 2: qs halves (at 32); 2: hmask."""
    jj = tl.arange(0, 8)
    z = tl.zeros((base.shape[0], 8), tl.int32)
    return (_words(p32, base, 32, jj, mask_n, ALIGNED), _words(p32, base, 64, jj, mask_n, ALIGNED),
            _words(p32, base, 0, jj, mask_n, ALIGNED), z, z, z, z, z)


@triton.jit
def _sb_scale_min(h1, h2, h3, S: tl.constexpr):
    """(sc, m) int32 [BN] of sub-block S of a Q4_K/Q5_K super-block: ggml's get_scale_min_k4
    over the 12 scale bytes in words h1, h2, h3."""
    if S < 4:
        sc = _byte(h1, S) & 63
        m = _byte(h2, S) & 63
    else:
        sc = (_byte(h3, S - 4) & 15) | ((_byte(h1, S - 4) >> 6) << 4)
        m = (_byte(h3, S - 4) >> 4) | ((_byte(h2, S - 4) >> 6) << 4)
    return sc, m


@triton.jit
def _sb_min_factors(head, RUN: tl.constexpr):
    """(d·sc, dmin·m) fp32 [BN, 1] of run RUN of a Q4_K / Q5_K super-block."""
    h0, h1, h2, h3, h4 = head
    sc, mn = _sb_scale_min(h1, h2, h3, RUN)
    dsc = _half_f32(h0) * sc.to(tl.float32)
    dm = _half_f32(h0 >> 16) * mn.to(tl.float32)
    return dsc[:, None], dm[:, None]


@triton.jit
def _q4_k_sb_run(words, head, RUN: tl.constexpr):
    """qs[128] at 16: byte 32 (RUN // 2) + l, nibble RUN % 2."""
    s = _sb_min_factors(head, RUN)
    q = _planes(_pick8(words, RUN // 2), 4 * (RUN % 2), 4)
    return _minus_min(s, _f32_of(q, 0.0))


@triton.jit
def _q5_k_sb_run(words, head, RUN: tl.constexpr):
    """qh[32] at 16 (bit RUN of byte l), qs[128] at 48 as Q4_K's."""
    s = _sb_min_factors(head, RUN)
    lo = _planes(_pick8(words, RUN // 2), 4 * (RUN % 2), 4)
    hi = _planes(_pick8(words, 4), RUN, 1)
    return _minus_min(s, _f32_of(lo | (hi << 4), 0.0))


@triton.jit
def _q6_k_sb_run(words, head, RUN: tl.constexpr):
    """ql[128] at 0: byte 64 H + 32 (G % 2) + l, nibble G // 2; qh[64] at 128: byte 32 H + l,
    bits 2 G; int8 scales[16] at 192: one per 16 weights, 8 H + 2 G + l // 16 (H = RUN // 4, the
    128-weight half; G = RUN % 4, the 2-bit group)."""
    h0, h1, h2, h3, h4 = head
    H: tl.constexpr = RUN // 4
    G: tl.constexpr = RUN % 4
    lo = _planes(_pick8(words, 2 * H + G % 2), 4 * (G // 2), 4)
    hi = _planes(_pick8(words, 4 + H), 2 * G, 2)
    T6: tl.constexpr = 8 * H + 2 * G
    sw = _pick(h0, h1, h2, h3, T6 // 4)
    s_a = ((sw << (24 - 8 * (T6 % 4))) >> 24).to(tl.float32)       # sign-extended int8
    s_b = ((sw << (16 - 8 * (T6 % 4))) >> 24).to(tl.float32)
    d = _half_f32(h4)
    ds = _spread4(_halves(tl.arange(0, 8), d * s_a, d * s_b))
    return ds * _f32_of(lo | (hi << 4), 32.0)


@triton.jit
def _q2_k_sb_run(words, head, RUN: tl.constexpr):
    """qs[64] at 16: byte 32 H + l, bits 2 G; scales[16] at 0: sc | m << 4 per 16 weights."""
    h0, h1, h2, h3, h4 = head
    H: tl.constexpr = RUN // 4
    G: tl.constexpr = RUN % 4
    jj = tl.arange(0, 8)
    q = _planes(_pick8(words, H), 2 * G, 2)
    T2: tl.constexpr = 8 * H + 2 * G
    sw = _pick(h0, h1, h2, h3, T2 // 4)
    b_a = _byte(sw, T2 % 4)
    b_b = _byte(sw, T2 % 4 + 1)
    d = _half_f32(h4)
    dmin = _half_f32(h4 >> 16)
    dl = _spread4(_halves(jj, d * (b_a & 15).to(tl.float32), d * (b_b & 15).to(tl.float32)))
    ml = _spread4(_halves(jj, dmin * (b_a >> 4).to(tl.float32),
                          dmin * (b_b >> 4).to(tl.float32)))
    return _minus_min((dl, ml), _f32_of(q, 0.0))


@triton.jit
def _q3_k_sb_run(words, head, RUN: tl.constexpr):
    """hmask[32] at 0 (bit RUN of byte l: 0 subtracts 4), qs[64] at 32 as Q2_K's; 6-bit scales
    per 16 weights s = 2 RUN + l // 16 from scales[12] at 96."""
    h0, h1, h2, h3, h4 = head
    H: tl.constexpr = RUN // 4
    G: tl.constexpr = RUN % 4
    crumb = _planes(_pick8(words, H), 2 * G, 2)
    hb = _planes(_pick8(words, 2), RUN, 1)
    d = _half_f32(h3)
    s_a = _q3_k_sub_scale(h0, h1, h2, 2 * RUN)
    s_b = _q3_k_sub_scale(h0, h1, h2, 2 * RUN + 1)
    ds = _spread4(_halves(tl.arange(0, 8), d * (s_a - 32).to(tl.float32),
                          d * (s_b - 32).to(tl.float32)))
    return ds * _f32_of(crumb + 4 * hb, 4.0)


@triton.jit
def _q3_k_sub_scale(h0, h1, h2, S: tl.constexpr):
    """6-bit scale (0..63, before the - 32) of Q3_K's 16-weight sub-block S: nibble S // 8 of
    scales[S % 8] | bits 2 (S // 4) of scales[8 + S % 4] << 4."""
    lo = (_byte(_pick(h0, h1, h0, h1, (S % 8) // 4), S % 4) >> (4 * (S // 8))) & 15
    hi = (_byte(h2, S % 4) >> (2 * (S // 4))) & 3
    return lo | (hi << 4)


# ---------------------------------------------------------------- plane layout (Q4_K)


@triton.jit
def _q4_k_plane_codes(b, MAGIC: tl.constexpr, BIASED: tl.constexpr, INTERP: tl.constexpr):
    """fp32 [BN, 2 BB]: q of each nibble of code pairs b [BN, BB] (strata.planes.Q4_ORDER)."""
    return nibble_codes(b, 0, MAGIC, INTERP)


@triton.jit
def _q4_k_plane_scales(s_ptr, n_in, offs_n, n_mask, k0, BK: tl.constexpr):
    """(d·sc, dmin·m) fp32 [BN, BK // 32] each: the factors of the 32-weight sub-blocks k0 ..
    k0+BK of rows offs_n of a Q4_K scale plane (a 16-byte entry a super-block, read as four int32
    words: word 0 the fp16 d and dmin; byte 4 + s = sc[s] | (m[s] >> 4) << 6; word 3's nibble s
    the low nibble of m[s]; strata.planes), 0 where masked. Each sub-block's entry is one 16-byte
    load (a step inside one super-block reads the same entry for each of its sub-blocks: L1
    hits), where byte and fp16 gathers took four. The products are exact in fp32.
    The entries load as one [BN, R·4] word tile: Triton lays that out with warps along the rows
    only, so the factors reach the decode's layout inside each warp (loaded as [BN, R, 4], R is
    split across warps and each of a step's four factor tensors crosses warps through shared
    memory: 9 barriers a step of 32x64x64/w4s4/r2's gate/up on sm_90 against 5; Q4_0 has 3)."""
    R: tl.constexpr = BK // 32
    r = k0 // 32 + tl.arange(0, R)                                   # sub-block along the row
    wrd = s_ptr.to(tl.pointer_type(tl.int32), bitcast=True)
    row = offs_n.to(tl.int64) * (n_in // 64)                         # entry words a row: K/256 * 4
    c = tl.arange(0, R * 4)                                          # (sub-block, word)
    rc = k0 // 32 + c // 4
    at = row[:, None] + ((rc >> 3) * 4 + c % 4)[None, :]
    at = tl.max_contiguous(tl.multiple_of(at, [1, 4]), [1, 4])        # 16-byte entries
    mc = n_mask[:, None] & (rc < n_in // 32)[None, :]
    e = tl.reshape(tl.load(wrd + at, mask=mc, other=0), (at.shape[0], R, 4))
    w01, w23 = tl.split(tl.reshape(e, (e.shape[0], R, 2, 2)))       # [BN, R, 2]: (w0, w2), (w1, w3)
    w0, w2 = tl.split(w01)
    w1, w3 = tl.split(w23)
    sub = (r & 7)[None, :]
    b = (tl.where(sub < 4, w1, w2) >> ((sub & 3) * 8)) & 255
    sc = b & 63
    mn = ((b >> 6) << 4) | ((w3 >> (sub * 4)) & 15)
    d = (w0 & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    dmin = ((w0 >> 16) & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return d * sc.to(tl.float32), dmin * mn.to(tl.float32)


Q4_K = traits("Q4_K", _q4_k_code, _q4_k_scale, _minus_min, PAIR=True,
              sb_head=_q4_k_sb_head, sb_words=_q4_k_sb_words, sb_run=_q4_k_sb_run, PLANE_PACK=2,
              plane_codes=_q4_k_plane_codes, plane_scales=_q4_k_plane_scales)
Q5_K = traits("Q5_K", _q5_k_code, _q5_k_scale, _minus_min, PAIR=True,
              sb_head=_q4_k_sb_head, sb_words=_q5_k_sb_words, sb_run=_q5_k_sb_run)
Q6_K = traits("Q6_K", _q6_k_code, _q6_k_scale, _scale_first,
              sb_head=_q6_k_sb_head, sb_words=_q6_k_sb_words, sb_run=_q6_k_sb_run)
Q2_K = traits("Q2_K", _q2_k_code, _q2_k_scale, _minus_min, PAIR=True,
              sb_head=_q2_k_sb_head, sb_words=_q2_k_sb_words, sb_run=_q2_k_sb_run)
Q3_K = traits("Q3_K", _q3_k_code, _q3_k_scale, _scale_first,
              sb_head=_q3_k_sb_head, sb_words=_q3_k_sb_words, sb_run=_q3_k_sb_run)
