"""Pieces every block decoder shares: format constants from the table, block offsets, byte and
fp16 loads, the nibble order of 32-weight blocks, and the bit tricks of the code-word paths.

Shapes: offs_n [BN] row indices, offs_k [BK] weight indices along a row, mask [BN, BK] bool.
"""
import triton
import triton.language as tl

from strata.formats.table import FORMATS


def signed32(v: int) -> int:
    """The int32 whose bits are the unsigned 32-bit `v` (Triton constants are signed)."""
    return v - (1 << 32) if v >= (1 << 31) else v


def pack_bytes(values) -> list[int]:
    """Signed bytes, 4 per int32 word, lowest byte first."""
    words = []
    for i in range(0, len(values), 4):
        words.append(signed32(sum((v & 0xFF) << (8 * j) for j, v in enumerate(values[i:i + 4]))))
    return words


def fmt_consts(name: str):
    """(log2 weights per block, bytes per block) of `name` as constexprs, from the format table:
    the decoders' only source of block geometry."""
    f = FORMATS[name]
    assert f.block & (f.block - 1) == 0, f"{name}: block size must be a power of two"
    return tl.constexpr(f.block.bit_length() - 1), tl.constexpr(f.block_bytes)


@triton.jit
def _block_off(row_bytes, offs_n, offs_k, LOG2_QK: tl.constexpr, QB: tl.constexpr):
    """[BN, BK] int64 byte offset of each element's block (blocks of 2**LOG2_QK weights, QB B)."""
    kb = (offs_k >> LOG2_QK).to(tl.int64) * QB                            # [BK]
    return offs_n.to(tl.int64)[:, None] * row_bytes + kb[None, :]


@triton.jit
def _ld_u8(w_ptr, off, mask):
    return tl.load(w_ptr + off, mask=mask, other=0).to(tl.int32)


@triton.jit
def _ld_f16(w_ptr, off, mask):
    """fp32 value of the fp16 at even byte offset `off`; 0 where masked. The scalar base is cast,
    not a tensor of pointers (triton 3.6's coalesce pass can assert on the latter)."""
    p = w_ptr.to(tl.pointer_type(tl.float16))
    return tl.load(p + (off >> 1), mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _nibble32(w_ptr, blk, j, mask, QS: tl.constexpr):
    """Weight j (0..31) of a 32-weight block whose qs[16] start at byte QS: low nibble of
    qs[j] for j < 16, high nibble of qs[j - 16] otherwise (ggml's order)."""
    byte = _ld_u8(w_ptr, blk + QS + (j & 15)[None, :], mask)
    return (byte >> ((j >> 4) * 4)[None, :]) & 15


@triton.jit
def _scale_first(d, q):
    """w = d * q (a format's `apply` where the reference multiplies scale by code)."""
    return d * q


@triton.jit
def _code_first(d, q):
    """w = q * d (Q8_0's and Q2_0's order in the reference)."""
    return q * d


@triton.jit
def _plus_min(s, q):
    """w = d * q + m from s = (d, m) (Q4_1, Q5_1)."""
    d, m = s
    return d * q + m


@triton.jit
def _minus_min(s, q):
    """w = (d * sc) * q - (dmin * m) from s = (d * sc, dmin * m) (Q4_K, Q5_K, Q2_K)."""
    dsc, dm = s
    return dsc * q - dm


@triton.jit
def _pairs(a, b):
    """[BN, H] x 2 -> [BN, 2H] interleaved: a[:, i] at 2i, b[:, i] at 2i + 1."""
    return tl.reshape(tl.join(a, b), (a.shape[0], 2 * a.shape[1]))


@triton.jit
def _f32_of(u, bias: tl.constexpr):
    """u - bias as fp32 for int32 0 <= u < 2**23 without an int->float conversion (quarter rate
    on the GPU): the bits 0x4B000000 | u are the float 2**23 + u, and subtracting 2**23 + bias
    is exact."""
    return (u | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + bias)
