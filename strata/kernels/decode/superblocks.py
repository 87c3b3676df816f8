"""The 256-weight super-block formats (Q4_K, Q5_K, Q6_K, Q2_K, Q3_K, IQ4_XS) read as int32 words:
a super-block's header and code words in one round of loads, then decoded one 32-weight run at
a time (the decode-once path's, strata.kernels.moe._expert_dequant_kernel).

decode_tile addresses every weight on its own: a byte gather per weight and the packed 6-bit
scales unpacked per weight (decode_tile_runs: per run, then broadcast). Here a program reads
whole super-blocks: the header words (fp16 d / dmin, the scale bytes) once per row, each run's
scale unpacked once per row (static shifts: RUN is a constexpr), and each run's code bytes as 8
int32 words a row. Byte b of code word j
holds weight 4 j + b of the run (every one of these layouts puts consecutive weights of a run in
consecutive bytes), so the run comes out of 4 byte planes interleaved (`_interleave4`), in
weight order, ready for one contiguous store of 32 values a row.

    superblock_head(FMT, p32, base, mask_n, ALIGNED) -> (h0, h1, h2, h3, h4) int32 [BN] each:
        the header words of the super-block at byte `base` [BN] of each row
    superblock_words(FMT, p32, base, mask_n, ALIGNED) -> 8 int32 [BN, 8]: its code words, all
        loaded in one round before any run is decoded
    superblock_run(FMT, words, head, RUN, mask_n) -> fp32 [BN, 32]: weights
        [32 RUN, 32 RUN + 32) of that super-block (RUN a constexpr 0..7), 0 where mask_n is False
        p32     int32 pointer the byte offsets `base` count from (4-byte aligned)
        base    int64 [BN] byte offset of each row's super-block from p32
        ALIGNED every base is a multiple of 4 (superblock_words_fit); else bases may sit 2 bytes
                off a word (Q6_K's 210 and Q3_K's 110-byte blocks do every other block) and each
                word is put together from two aligned ones, still with aligned loads only

Values equal decode_tile bit for bit (the same fp32 products in the same order as the torch
references; tests/test_superblocks.py); the field offsets are those of kquants.py / iquants.py.
"""
import triton
import triton.language as tl

from strata.formats.table import FORMATS
from strata.kernels.decode._common import _f32_of
from strata.kernels.decode.iquants import GGML_IQ4_XS, IQ4_XS_BYTES, _iq4nl_level
from strata.kernels.decode.kquants import (GGML_Q2_K, GGML_Q3_K, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K,
                                           Q2_K_BYTES, Q3_K_BYTES, Q4_K_BYTES, Q5_K_BYTES,
                                           Q6_K_BYTES, _q4_k_value)
from strata.kernels.decode.words import _half_f32, _interleave4

SUPERBLOCK_FORMATS = ("Q4_K", "Q5_K", "Q6_K", "Q2_K", "Q3_K", "IQ4_XS")
SUPERBLOCK = 256    # weights of a super-block
SUPERBLOCK_K = tl.constexpr(SUPERBLOCK)   # the same, for kernels
assert all(FORMATS[n].block == SUPERBLOCK and FORMATS[n].block_bytes % 2 == 0
           for n in SUPERBLOCK_FORMATS)


def superblock_words_fit(fmt_name: str, row_bytes: int, byte_offset: int) -> bool | None:
    """None where `fmt_name` has no super-block word path; else whether every super-block of the
    matrix starts on a 4-byte word (ALIGNED): rows of whole words from a word-aligned
    `byte_offset` (the matrix's first byte from an aligned base; blob slots are 256-aligned).
    Either way the path reads aligned words (unaligned blocks through two of them)."""
    if fmt_name not in SUPERBLOCK_FORMATS:
        return None
    return (FORMATS[fmt_name].block_bytes % 4 == 0 and row_bytes % 4 == 0
            and byte_offset % 4 == 0)


@triton.jit
def superblock_base(FMT: tl.constexpr, row_bytes, offs_n, sb):
    """int64 [BN]: byte offset of super-block sb (a scalar) of rows offs_n [BN] from the
    matrix's first byte."""
    if FMT == GGML_Q4_K:
        QB: tl.constexpr = Q4_K_BYTES
    elif FMT == GGML_Q5_K:
        QB: tl.constexpr = Q5_K_BYTES
    elif FMT == GGML_Q6_K:
        QB: tl.constexpr = Q6_K_BYTES
    elif FMT == GGML_Q2_K:
        QB: tl.constexpr = Q2_K_BYTES
    elif FMT == GGML_Q3_K:
        QB: tl.constexpr = Q3_K_BYTES
    else:
        tl.static_assert(FMT == GGML_IQ4_XS, "superblock_base: not a SUPERBLOCK_FORMATS type")
        QB: tl.constexpr = IQ4_XS_BYTES
    return offs_n.to(tl.int64) * row_bytes + sb.to(tl.int64) * QB


@triton.jit
def _words(p32, base, F: tl.constexpr, idx, mask_n, ALIGNED: tl.constexpr):
    """int32 [BN, W]: the little-endian words at bytes base + F + 4 idx (idx [W] int32) of each
    row; 0 where mask_n is False. base + F must be even."""
    a = base + F                                                         # [BN] int64
    m = mask_n[:, None]
    w = (a >> 2)[:, None] + idx[None, :]
    x = tl.load(p32 + w, mask=m, other=0)
    if not ALIGNED:
        # 2 bytes off a word: the top half of this word, the bottom half of the next
        odd = ((a & 2) != 0)[:, None]
        y = tl.load(p32 + w + 1, mask=m & odd, other=0)
        x = tl.where(odd, ((x >> 16) & 0xFFFF) | (y << 16), x)
    return x


@triton.jit
def _word(p32, base, F: tl.constexpr, mask_n, ALIGNED: tl.constexpr):
    """int32 [BN]: the word at byte base + F of each row (as _words)."""
    BN: tl.constexpr = base.shape[0]
    return tl.reshape(_words(p32, base, F, tl.arange(0, 1), mask_n, ALIGNED), (BN,))


@triton.jit
def _byte(w, B: tl.constexpr):
    """Byte B (0..3) of int32 words w, as 0..255."""
    return (w >> (8 * B)) & 255


@triton.jit
def _pick(h0, h1, h2, h3, I: tl.constexpr):
    if I == 0:
        return h0
    elif I == 1:
        return h1
    elif I == 2:
        return h2
    else:
        return h3


@triton.jit
def superblock_head(FMT: tl.constexpr, p32, base, mask_n, ALIGNED: tl.constexpr):
    """The header words of each row's super-block (unused ones 0):
    Q4_K / Q5_K: (d | dmin << 16, scales[0:4], scales[4:8], scales[8:12], 0)
    Q6_K:        (scales[0:4], [4:8], [8:12], [12:16], d)
    Q2_K:        (scales[0:4], [4:8], [8:12], [12:16], d | dmin << 16)
    Q3_K:        (scales[0:4], [4:8], [8:12], d, 0)
    IQ4_XS:      (d | scales_h << 16, scales_l[0:4], 0, 0, 0)"""
    z = tl.zeros(base.shape, tl.int32)
    if (FMT == GGML_Q4_K) | (FMT == GGML_Q5_K):
        h = (_word(p32, base, 0, mask_n, ALIGNED), _word(p32, base, 4, mask_n, ALIGNED),
             _word(p32, base, 8, mask_n, ALIGNED), _word(p32, base, 12, mask_n, ALIGNED), z)
    elif FMT == GGML_Q6_K:
        h = (_word(p32, base, 192, mask_n, ALIGNED), _word(p32, base, 196, mask_n, ALIGNED),
             _word(p32, base, 200, mask_n, ALIGNED), _word(p32, base, 204, mask_n, ALIGNED),
             _half_word(p32, base, 208, mask_n, ALIGNED))
    elif FMT == GGML_Q2_K:
        h = (_word(p32, base, 0, mask_n, ALIGNED), _word(p32, base, 4, mask_n, ALIGNED),
             _word(p32, base, 8, mask_n, ALIGNED), _word(p32, base, 12, mask_n, ALIGNED),
             _word(p32, base, 80, mask_n, ALIGNED))
    elif FMT == GGML_Q3_K:
        h = (_word(p32, base, 96, mask_n, ALIGNED), _word(p32, base, 100, mask_n, ALIGNED),
             _word(p32, base, 104, mask_n, ALIGNED), _half_word(p32, base, 108, mask_n, ALIGNED),
             z)
    else:
        tl.static_assert(FMT == GGML_IQ4_XS, "superblock_head: not a SUPERBLOCK_FORMATS type")
        h = (_word(p32, base, 0, mask_n, ALIGNED), _word(p32, base, 4, mask_n, ALIGNED), z, z, z)
    return h


@triton.jit
def _half_word(p32, base, F: tl.constexpr, mask_n, ALIGNED: tl.constexpr):
    """int32 [BN]: the 16-bit field at byte base + F (its block's last 2 bytes: one aligned
    word holds it, and no load reaches past the block)."""
    a = base + F
    x = tl.load(p32 + (a >> 2), mask=mask_n, other=0)
    if ALIGNED:
        v = x & 0xFFFF
    else:
        v = (x >> ((a & 2) * 8).to(tl.int32)) & 0xFFFF
    return v


@triton.jit
def _planes(x, S: tl.constexpr, BITS: tl.constexpr):
    """int32 [BN, 4W]: field (bits [S, S + BITS)) of every byte of words x [BN, W], bytes
    interleaved into weight order (byte b of word j at 4 j + b)."""
    M: tl.constexpr = (1 << BITS) - 1
    return _interleave4((x >> S) & M, (x >> (S + 8)) & M, (x >> (S + 16)) & M,
                        (x >> (S + 24)) & M)


@triton.jit
def _scale_min(h1, h2, h3, S: tl.constexpr):
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
def _halves(jj8, a, b):
    """[BN, 32] of per-row values a [BN] for weights 0..15 of a run and b [BN] for 16..31, laid
    out as the run's 8 words x 4 bytes (jj8 = arange(8): word j holds weights 4j..4j+3)."""
    return tl.where((jj8 < 4)[None, :], a[:, None], b[:, None])


@triton.jit
def superblock_words(FMT: tl.constexpr, p32, base, mask_n, ALIGNED: tl.constexpr):
    """Every code word of each row's super-block, 8 words a row per tensor (int32 [BN, 8] x 8;
    unused ones 0), in one round of loads issued before any is used: the runs' stores cannot
    move above later loads (the compiler cannot tell the buffers apart), so loads interleaved
    with stores would wait on memory once per run. Tensor k holds:
    Q4_K   k < 4: qs bytes [32 k, 32 k + 32) (at 16)       Q5_K  k < 4: qs as Q4_K's (at 48); 4: qh
    Q6_K   k < 4: ql bytes [32 k, +32); 4, 5: qh halves    Q2_K  k < 2: qs halves (at 16)
    Q3_K   k < 2: qs halves (at 32); 2: hmask              IQ4_XS k: run k's 16 qs bytes twice
                                                                  (words j % 4, see superblock_run)"""
    jj = tl.arange(0, 8)
    z = tl.zeros((base.shape[0], 8), tl.int32)
    if FMT == GGML_Q4_K:
        w = (_words(p32, base, 16, jj, mask_n, ALIGNED), _words(p32, base, 48, jj, mask_n, ALIGNED),
             _words(p32, base, 80, jj, mask_n, ALIGNED),
             _words(p32, base, 112, jj, mask_n, ALIGNED), z, z, z, z)
    elif FMT == GGML_Q5_K:
        w = (_words(p32, base, 48, jj, mask_n, ALIGNED), _words(p32, base, 80, jj, mask_n, ALIGNED),
             _words(p32, base, 112, jj, mask_n, ALIGNED),
             _words(p32, base, 144, jj, mask_n, ALIGNED),
             _words(p32, base, 16, jj, mask_n, ALIGNED), z, z, z)
    elif FMT == GGML_Q6_K:
        w = (_words(p32, base, 0, jj, mask_n, ALIGNED), _words(p32, base, 32, jj, mask_n, ALIGNED),
             _words(p32, base, 64, jj, mask_n, ALIGNED), _words(p32, base, 96, jj, mask_n, ALIGNED),
             _words(p32, base, 128, jj, mask_n, ALIGNED),
             _words(p32, base, 160, jj, mask_n, ALIGNED), z, z)
    elif FMT == GGML_Q2_K:
        w = (_words(p32, base, 16, jj, mask_n, ALIGNED), _words(p32, base, 48, jj, mask_n, ALIGNED),
             z, z, z, z, z, z)
    elif FMT == GGML_Q3_K:
        w = (_words(p32, base, 32, jj, mask_n, ALIGNED), _words(p32, base, 64, jj, mask_n, ALIGNED),
             _words(p32, base, 0, jj, mask_n, ALIGNED), z, z, z, z, z)
    else:
        tl.static_assert(FMT == GGML_IQ4_XS, "superblock_words: not a SUPERBLOCK_FORMATS type")
        q = jj & 3
        w = (_words(p32, base, 8, q, mask_n, ALIGNED), _words(p32, base, 24, q, mask_n, ALIGNED),
             _words(p32, base, 40, q, mask_n, ALIGNED), _words(p32, base, 56, q, mask_n, ALIGNED),
             _words(p32, base, 72, q, mask_n, ALIGNED), _words(p32, base, 88, q, mask_n, ALIGNED),
             _words(p32, base, 104, q, mask_n, ALIGNED),
             _words(p32, base, 120, q, mask_n, ALIGNED))
    return w


@triton.jit
def _pick8(w, K: tl.constexpr):
    """Tensor K (a constexpr) of superblock_words' tuple."""
    w0, w1, w2, w3, w4, w5, w6, w7 = w
    if K < 4:
        return _pick(w0, w1, w2, w3, K)
    else:
        return _pick(w4, w5, w6, w7, K - 4)


@triton.jit
def superblock_run(FMT: tl.constexpr, words, head, RUN: tl.constexpr, mask_n):
    """fp32 [BN, 32]: weights [32 RUN, 32 RUN + 32) of each row's super-block from its
    superblock_words and superblock_head (see module doc)."""
    h0, h1, h2, h3, h4 = head
    jj = tl.arange(0, 8)
    C: tl.constexpr = RUN // 2          # Q4_K/Q5_K: 64-weight chunk of the run, nibble RUN % 2
    H: tl.constexpr = RUN // 4          # Q6_K/Q2_K/Q3_K: 128-weight half, 2-bit group RUN % 4
    G: tl.constexpr = RUN % 4
    if (FMT == GGML_Q4_K) | (FMT == GGML_Q5_K):
        sc, mn = _scale_min(h1, h2, h3, RUN)
        dsc = _half_f32(h0) * sc.to(tl.float32)
        dm = _half_f32(h0 >> 16) * mn.to(tl.float32)
        if FMT == GGML_Q4_K:   # qs[128] at 16: byte 32 C + l, nibble RUN % 2
            q = _planes(_pick8(words, C), 4 * (RUN % 2), 4)
        else:                  # qh[32] at 16 (bit RUN of byte l), qs[128] at 48 as Q4_K's
            lo = _planes(_pick8(words, C), 4 * (RUN % 2), 4)
            hi = _planes(_pick8(words, 4), RUN, 1)
            q = lo | (hi << 4)
        v = _q4_k_value(dsc[:, None], dm[:, None], _f32_of(q, 0.0))
    elif FMT == GGML_Q6_K:
        # ql[128] at 0: byte 64 H + 32 (G % 2) + l, nibble G // 2; qh[64] at 128: byte 32 H + l,
        # bits 2 G; int8 scales[16] at 192: one per 16 weights, 8 H + 2 G + l // 16
        lo = _planes(_pick8(words, 2 * H + G % 2), 4 * (G // 2), 4)
        hi = _planes(_pick8(words, 4 + H), 2 * G, 2)
        T6: tl.constexpr = 8 * H + 2 * G
        sw = _pick(h0, h1, h2, h3, T6 // 4)
        s_a = ((sw << (24 - 8 * (T6 % 4))) >> 24).to(tl.float32)       # sign-extended int8
        s_b = ((sw << (16 - 8 * (T6 % 4))) >> 24).to(tl.float32)
        d = _half_f32(h4)
        ds = _spread4(_halves(jj, d * s_a, d * s_b))
        v = ds * _f32_of(lo | (hi << 4), 32.0)
    elif FMT == GGML_Q2_K:
        # qs[64] at 16: byte 32 H + l, bits 2 G; scales[16] at 0: sc | m << 4 per 16 weights
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
        v = _q4_k_value(dl, ml, _f32_of(q, 0.0))
    elif FMT == GGML_Q3_K:
        # hmask[32] at 0 (bit RUN of byte l: 0 subtracts 4), qs[64] at 32 as Q2_K's; 6-bit
        # scales per 16 weights s = 2 RUN + l // 16 from scales[12] at 96
        crumb = _planes(_pick8(words, H), 2 * G, 2)
        hb = _planes(_pick8(words, 2), RUN, 1)
        d = _half_f32(h3)
        s_a = _q3_k_sub_scale(h0, h1, h2, 2 * RUN)
        s_b = _q3_k_sub_scale(h0, h1, h2, 2 * RUN + 1)
        ds = _spread4(_halves(jj, d * (s_a - 32).to(tl.float32), d * (s_b - 32).to(tl.float32)))
        v = ds * _f32_of(crumb + 4 * hb, 4.0)
    else:
        tl.static_assert(FMT == GGML_IQ4_XS, "superblock_run: not a SUPERBLOCK_FORMATS type")
        # qs[128] at 8: 16 bytes a run, weight l < 16 the low nibble of byte l, l >= 16 the high
        # nibble of byte l - 16: 8 virtual words, word j = bytes of word j % 4, nibble j // 4
        x = _pick8(words, RUN)
        sh = (jj >> 2)[None, :] * 4
        q = _interleave4((x >> sh) & 15, (x >> (sh + 8)) & 15, (x >> (sh + 16)) & 15,
                         (x >> (sh + 24)) & 15)
        lo = _byte(h1, RUN // 2) >> (4 * (RUN % 2)) & 15
        hi = (h0 >> (16 + 2 * RUN)) & 3
        ds = _half_f32(h0) * ((lo | (hi << 4)) - 32).to(tl.float32)
        v = ds[:, None] * _iq4nl_level(q).to(tl.float32)
    return tl.where(mask_n[:, None], v, 0.0)


@triton.jit
def _spread4(x):
    """[BN, W] -> [BN, 4W]: each value over the 4 bytes of its word (as _planes lays them)."""
    return _interleave4(x, x, x, x)


@triton.jit
def _q3_k_sub_scale(h0, h1, h2, S: tl.constexpr):
    """6-bit scale (0..63, before the - 32) of Q3_K's 16-weight sub-block S: nibble S // 8 of
    scales[S % 8] | bits 2 (S // 4) of scales[8 + S % 4] << 4."""
    lo = (_byte(_pick(h0, h1, h0, h1, (S % 8) // 4), S % 4) >> (4 * (S // 8))) & 15
    hi = (_byte(h2, S % 4) >> (2 * (S // 4))) & 3
    return lo | (hi << 4)
