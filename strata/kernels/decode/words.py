"""Q8_0 / Q4_0 (the formats whose table row says code_words) read as raw code words.

Two paths, both bit-exact against decode_tile:
- load_code_bytes / codes_from_bytes: a 32-weight run's code bytes as a load that can be issued
  ahead of its use, and the codes from them (the expert GEMM's swap_fast* variants).
- pair_tile: a pair of blocks read as aligned int32 words and decoded with their scales (the
  expert GEMM's and dequantize's word path); pair_words_fit states when a matrix allows it.

Shapes: offs_n [BN] rows; k_run / pair scalars; mask_n [BN] bool.
"""
import triton
import triton.language as tl

from strata.formats.table import FORMATS
from strata.kernels.decode._common import _pairs

# ---------------------------------------------------------------- raw code bytes, split from decode
#
# Q8_0 / Q4_0 only: a run's code bytes as a load that can be issued ahead of its use (a GEMM
# prefetches the next run while the tensor cores work on this one), and the codes from them.
# Codes come in two halves, weights [0, 16) and [16, 32) of the run: Q4_0 keeps them in the low
# and high nibbles of the same 16 bytes, so halves need no shuffle. WIDE: 16-bit loads (every
# field of a 34/18-byte block is 2-byte aligned), half the load instructions of byte loads.


@triton.jit
def load_code_bytes(FMT: tl.constexpr, w_ptr, row_bytes, offs_n, k_run, mask_n,
                    WIDE: tl.constexpr):
    """(lo, hi) raw code words of the 32-weight block holding weight k_run (a multiple of 32) in
    each row offs_n; mask_n [BN] bool (0 where False). Q8_0: int8 [BN, 16] each (codes 0-15,
    16-31), WIDE int16 [BN, 8]. Q4_0: lo = the 16 qs bytes (uint8 [BN, 16]; WIDE int16 [BN, 8]),
    hi = lo (both halves are in the same bytes)."""
    tl.static_assert(FMT.WORDS, "load_code_bytes: a code_words format (Q8_0 / Q4_0)")
    base = offs_n.to(tl.int64) * row_bytes + (k_run >> 5).to(tl.int64) * FMT.BYTES + 2  # even
    return FMT.word_bytes(w_ptr, base, mask_n, WIDE)


@triton.jit
def codes_from_bytes(FMT: tl.constexpr, lo, hi, WIDE: tl.constexpr, MAGIC: tl.constexpr = False):
    """(c_lo, c_hi) fp32 [BN, 16]: codes of weights [0, 16) and [16, 32) of the block whose
    load_code_bytes are (lo, hi); decode_tile's value is decode_run_scale * code. MAGIC: the
    same values through _f32_of (float add) instead of int->float conversions."""
    tl.static_assert(FMT.WORDS, "codes_from_bytes: a code_words format (Q8_0 / Q4_0)")
    return FMT.word_codes(lo, hi, WIDE, MAGIC)


# ---------------------------------------------------------------- aligned word loads of block pairs
#
# Q8_0 / Q4_0 blocks are 34 / 18 bytes (fp16 scale, then codes), so a block's codes start 2 bytes
# off a 4-byte boundary every other block: byte or 16-bit loads, which the software pipeliner
# cannot stage through cp.async (it needs >= 32 bits a thread). Two blocks make 68 / 36 bytes, a
# multiple of 4: when a row's byte length is too, every load below is of aligned int32 words.
# In a pair starting at word P (little-endian): block 0's code word i is the top half of word
# P+i and the bottom half of word P+1+i; block 1's codes are whole words from P+(QB+2)/4; the
# scales are the bottom half of word P and the top half of word P+(QB-2)/4. The whole pair
# decodes into one [BN, 64] tile, so a GEMM step is one dot of K = 64.

def pair_words_fit(fmt_name: str, n_in: int, row_bytes: int, byte_offset: int) -> bool:
    """Whether pair_tile can read a matrix: a code_words format (Q8_0/Q4_0), rows of whole block
    pairs (n_in % 64) and whole 4-byte words, starting 4-byte aligned (byte_offset: of the
    matrix's first row from an aligned base). The one statement of the word path's precondition."""
    fmt = FORMATS.get(fmt_name)
    return (fmt is not None and fmt.code_words and n_in % 64 == 0 and row_bytes % 4 == 0
            and byte_offset % 4 == 0)


@triton.jit
def _interleave4(b0, b1, b2, b3):
    """[BN, W] x 4 -> [BN, 4W]: b_k[:, i] at 4i + k (byte k of word i is code 4i + k)."""
    return _pairs(_pairs(b0, b2), _pairs(b1, b3))


@triton.jit
def _half_f32(bits):
    """fp32 of the fp16 whose bits are the low 16 of int32 `bits`."""
    return (bits & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def pair_tile(FMT: tl.constexpr, w_ptr, row_bytes, offs_n, pair, mask_n, MAGIC: tl.constexpr):
    """fp32 [BN, 64]: weights [64 pair, 64 pair + 64) of rows offs_n, decoded with their scales
    (0 where mask_n is False). Needs row_bytes % 4 == 0 and w_ptr 4-aligned; every load is of
    whole int32 words (see above). MAGIC: codes to float by a float add (_f32_of)."""
    tl.static_assert(FMT.WORDS, "pair_tile: a code_words format (Q8_0 / Q4_0)")
    QB: tl.constexpr = FMT.BYTES
    NW: tl.constexpr = (QB - 2) // 4                    # code words a block: 8 (Q8_0), 4 (Q4_0)
    p32 = w_ptr.to(tl.pointer_type(tl.int32))
    P = offs_n.to(tl.int64) * (row_bytes // 4) + pair * (QB // 2)      # [BN] first word
    m = mask_n[:, None]
    i = tl.arange(0, 2 * NW)[None, :]                   # code word i: block i // NW
    blk1 = i >= NW
    idx = P[:, None] + i + blk1.to(tl.int32)            # block 1's words sit one further on
    x = tl.load(p32 + idx, mask=m, other=0)
    y = tl.load(p32 + idx + 1, mask=m & ~blk1, other=0)   # (block 1's would pass the pair's end)
    # block 0's codes straddle words: top half of word i, bottom half of word i + 1
    words = tl.where(blk1, x, ((x >> 16) & 0xFFFF) | (y << 16))        # [BN, 2 NW]
    s0 = _half_f32(tl.load(p32 + P, mask=mask_n, other=0))
    s1 = _half_f32(tl.load(p32 + P + NW, mask=mask_n, other=0) >> 16)
    s = tl.where(blk1, s1[:, None], s0[:, None])                       # [BN, 2 NW]
    return tl.where(m, FMT.pair_codes(words, s, MAGIC), 0.0)
