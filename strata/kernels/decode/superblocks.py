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
        FMT     the format's traits bundle (strata.kernels.decode.bundle): its sb_head, sb_words
                and sb_run say where its fields sit (kquants.py, iquants.py); this module holds
                the word loads they share
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
from strata.kernels.decode.words import _interleave4

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
    tl.static_assert(FMT.BLOCK == SUPERBLOCK_K, "superblock_base: not a super-block format")
    return offs_n.to(tl.int64) * row_bytes + sb.to(tl.int64) * FMT.BYTES


@triton.jit
def superblock_head(FMT: tl.constexpr, p32, base, mask_n, ALIGNED: tl.constexpr):
    """The header words of each row's super-block (5 x int32 [BN], unused ones 0; the format's
    sb_head says which)."""
    return FMT.sb_head(p32, base, mask_n, ALIGNED)


@triton.jit
def superblock_words(FMT: tl.constexpr, p32, base, mask_n, ALIGNED: tl.constexpr):
    """Every code word of each row's super-block, 8 words a row per tensor (int32 [BN, 8] x 8;
    unused ones 0), in one round of loads issued before any is used: the runs' stores cannot
    move above later loads (the compiler cannot tell the buffers apart), so loads interleaved
    with stores would wait on memory once per run."""
    return FMT.sb_words(p32, base, mask_n, ALIGNED)


@triton.jit
def superblock_run(FMT: tl.constexpr, words, head, RUN: tl.constexpr, mask_n):
    """fp32 [BN, 32]: weights [32 RUN, 32 RUN + 32) of each row's super-block from its
    superblock_words and superblock_head (see module doc)."""
    return tl.where(mask_n[:, None], FMT.sb_run(words, head, RUN), 0.0)


# ---------------------------------------------------------------- word loads the layouts share


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
def _pick8(w, K: tl.constexpr):
    """Tensor K (a constexpr) of superblock_words' tuple."""
    w0, w1, w2, w3, w4, w5, w6, w7 = w
    if K < 4:
        return _pick(w0, w1, w2, w3, K)
    else:
        return _pick(w4, w5, w6, w7, K - 4)


@triton.jit
def _planes(x, S: tl.constexpr, BITS: tl.constexpr):
    """int32 [BN, 4W]: field (bits [S, S + BITS)) of every byte of words x [BN, W], bytes
    interleaved into weight order (byte b of word j at 4 j + b)."""
    M: tl.constexpr = (1 << BITS) - 1
    return _interleave4((x >> S) & M, (x >> (S + 8)) & M, (x >> (S + 16)) & M,
                        (x >> (S + 24)) & M)


@triton.jit
def _halves(jj8, a, b):
    """[BN, 32] of per-row values a [BN] for weights 0..15 of a run and b [BN] for 16..31, laid
    out as the run's 8 words x 4 bytes (jj8 = arange(8): word j holds weights 4j..4j+3)."""
    return tl.where((jj8 < 4)[None, :], a[:, None], b[:, None])


@triton.jit
def _spread4(x):
    """[BN, W] -> [BN, 4W]: each value over the 4 bytes of its word (as _planes lays them)."""
    return _interleave4(x, x, x, x)
