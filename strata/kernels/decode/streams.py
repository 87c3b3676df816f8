"""32-weight block formats whose blocks are not whole words (MXFP4's 17 bytes) read as aligned
int32 words, the matrix as one stream of blocks (the decode-once path's,
strata.kernels.moe._expert_dequant_kernel).

A GGUF matrix's rows are contiguous, and so are the bf16 rows the decode-once path writes, so
block g of the matrix (row g // nb, nb blocks a row) sits at byte QB g of the input and its 32
weights at weight 32 g of the output, wherever rows begin and end: the launch views an [R, C]
matrix as [R C / 32, 32], one block a row, and a program reads BN consecutive blocks. Rows
whose byte length is not whole words (gpt-oss's 2880 weights: 90 blocks, 1530 bytes) and rows
of a block count that is not a multiple of 4 then cost nothing: only the matrix's first byte
must sit on a word (stream_words_fit), and only the stream's last program is partly masked.

MXFP4 blocks are 17 bytes: four make 68 bytes, 17 words, so from a word-aligned matrix block g
starts g mod 4 bytes past a word. Each field of a block is put together from the aligned words
that hold it: a word at byte offset a is the top 32 - 8 (a mod 4) bits of word a // 4 joined to
the bottom bits of the next (a funnel shift); a byte is one aligned word shifted. Every load is
of an aligned int32 word, none reaches past the word holding the block's last byte (so none
past a 256-aligned blob slot), and a block's fields come in a constant number of loads where
the byte path loads its scale byte and a code byte once per weight.

    stream_words_fit(fmt_name, byte_offset) -> bool: whether a matrix takes the path
    stream_block(FMT, p32, base, mask_b) -> (lo, hi) fp32 [BN, 16] each: weights 0..15
        and 16..31 of the blocks at byte `base` [BN] (int64, from the int32 pointer p32),
        decoded with their scales; 0 where mask_b [BN] is False. The format's bundle says how
        (its stream_block; mxfp4.py), from the word loads below.
    stream_words(p32, a, idx, mask_b) -> int32 [BN, W]: the little-endian words at bytes
        a + 4 idx (a [BN] int64 any byte offset, idx [W] int32)
    stream_byte(p32, a, mask_b) -> int32 [BN, 1]: the byte at a (0..255), 2-D as the tile it
        scales

Values equal decode_tile bit for bit (the same fp32 products as the byte path and the torch
reference; tests/test_streams.py).
"""
import triton
import triton.language as tl

from strata.formats.table import FORMATS

STREAM_FORMATS = ("MXFP4",)
STREAM_BLOCK = 32   # weights a block: the launch's view is [R C / 32, 32]
assert all(FORMATS[n].block == STREAM_BLOCK for n in STREAM_FORMATS)


def stream_words_fit(fmt_name: str, byte_offset: int) -> bool:
    """Whether the decode-once path reads a matrix as a stream of aligned words: a format with a
    stream decoder (STREAM_FORMATS) whose first byte sits on a 4-byte word (byte_offset: from
    an aligned base; blob slots are 256-aligned). Any row length: rows are contiguous, so the
    stream is the whole matrix. The one statement of the path's precondition."""
    return fmt_name in STREAM_FORMATS and byte_offset % 4 == 0


@triton.jit
def stream_block(FMT: tl.constexpr, p32, base, mask_b):
    """(lo, hi) fp32 [BN, 16]: weights [0, 16) and [16, 32) of the block at byte base [BN] of
    p32, 0 where mask_b is False (see module doc): masked loads read 0, which the format's
    stream_block decodes to +0 (MXFP4: code 0 under any scale), so no select is spent on it."""
    tl.static_assert(FMT.stream_block is not None, "stream_block: not a STREAM_FORMATS format")
    return FMT.stream_block(p32, base, mask_b)


@triton.jit
def stream_words(p32, a, idx, mask_b):
    """int32 [BN, W]: the little-endian words at bytes a + 4 idx of each block; 0 where mask_b
    is False. Off a word by s = a mod 4 bytes, a word is the top 4 - s bytes of one aligned word
    and the bottom s of the next; the next is loaded only then (it holds the field's last byte,
    so no load passes it)."""
    m = mask_b[:, None]
    w = (a >> 2)[:, None] + idx[None, :]
    sh = ((a & 3) * 8).to(tl.uint32)[:, None]                            # [BN, 1] bits
    x = tl.load(p32 + w, mask=m, other=0).to(tl.uint32, bitcast=True)
    y = tl.load(p32 + w + 1, mask=m & (sh != 0), other=0).to(tl.uint32, bitcast=True)
    # (y << 1) << (31 - sh) is y << (32 - sh) with both shifts below 32 (0 when sh = 0)
    return ((x >> sh) | ((y << 1) << (31 - sh))).to(tl.int32, bitcast=True)


@triton.jit
def stream_byte(p32, a, mask_b):
    """int32 [BN, 1]: the byte at a of each block (0..255), from the aligned word holding it; 0
    where mask_b is False."""
    x = tl.load(p32 + (a >> 2)[:, None], mask=mask_b[:, None], other=0)
    return (x >> ((a & 3) * 8).to(tl.int32)[:, None]) & 255
