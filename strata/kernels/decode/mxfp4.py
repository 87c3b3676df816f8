"""Triton decoder of MXFP4 (OCP microscaling; mirrors strata.formats.mxfp4): e8m0 scale, 32 e2m1
nibbles whose 8 magnitudes sit in one packed register constant.

    _mxfp4_scale(w_ptr, row_bytes, offs_n, offs_k, mask) / _mxfp4_code(..., mask, tab_ptr=None)
        -> fp32 [BN, BK]
    _mxfp4_stream_block(p32, base, mask_b) -> (lo, hi) fp32 [BN, 16]: whole blocks from
        aligned words (strata.kernels.decode.streams)
    the MXFP4 bundle at the end (see strata.kernels.decode.bundle)
"""
import triton
import triton.language as tl

from strata.formats.tables import KVALUES_MXFP4
from strata.kernels.decode._common import (_block_off, _ld_u8, _nibble32, _scale_first, fmt_consts,
                                           signed32)
from strata.kernels.decode.bundle import traits
from strata.kernels.decode.streams import stream_byte, stream_words
from strata.kernels.decode.words import _interleave4

MXFP4_LOG2, MXFP4_BYTES = fmt_consts("MXFP4")

# MXFP4 codes: bit 3 is the sign, bits 0-2 index 8 magnitudes (packed 4 bits each, < 16).
assert all(KVALUES_MXFP4[8 + i] == -KVALUES_MXFP4[i] for i in range(8))
assert all(0 <= v < 16 for v in KVALUES_MXFP4[:8])
MXFP4_MAGS = tl.constexpr(signed32(sum(v << (4 * i) for i, v in enumerate(KVALUES_MXFP4[:8]))))


@triton.jit
def _e8m0_half(e):
    """2**(e - 128) built from bits (subnormal for e < 2), as ggml_e8m0_to_fp32_half."""
    return tl.where(e < 2, 0x00200000 << e, (e - 1) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _mxfp4_int(q):
    """int32 code kv[q] of nibbles q (0..15): code 8 is +0."""
    mag = (MXFP4_MAGS >> ((q & 7) * 4)) & 15
    return tl.where(q >= 8, -mag, mag)


@triton.jit
def _mxfp4_scale(w_ptr, row_bytes, offs_n, offs_k, mask):
    return _e8m0_half(_ld_u8(w_ptr, _block_off(row_bytes, offs_n, offs_k, MXFP4_LOG2,
                                               MXFP4_BYTES), mask))


@triton.jit
def _mxfp4_code(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr=None):
    """MXFP4 (17 B): e8m0 e; qs[16] nibbles as Q4_0 index the doubled e2m1 values.
    w = d * kv[q], d = 2**(e - 128) (half the e8m0 scale, since kv is doubled)."""
    blk = _block_off(row_bytes, offs_n, offs_k, MXFP4_LOG2, MXFP4_BYTES)
    return _mxfp4_int(_nibble32(w_ptr, blk, offs_k & 31, mask, 1)).to(tl.float32)


@triton.jit
def _e2m1_bits(w, S: tl.constexpr):
    """int32 fp32 bits of kv[q] * 2**-127 for the nibbles q at bits [S, S + 4) of words w: an
    e2m1 nibble (sign, 2-bit exponent of bias 1, 1-bit mantissa) with its sign at bit 31 and the
    rest at bits 22-24 (the top of the fp32 exponent and mantissa) is that value, subnormal
    where the exponent is 0 just as e2m1's (kv is e2m1 doubled; 127 - 1 + 1 = 127)."""
    return (((w >> S) & 7) << 22) | (((w >> (S + 3)) & 1) << 31)


@triton.jit
def _mxfp4_plane(w, H: tl.constexpr):
    """fp32 [BN, 16]: kv[q] of nibble H (0 low, 1 high) of every byte of code words w [BN, 4],
    byte b of word j at 4 j + b. Times 2**127 is exact; + 0.0 turns code 8's -0 into kv[8]'s
    +0. No int->float conversion (a quarter-rate instruction) and no table."""
    bits = _interleave4(_e2m1_bits(w, 4 * H), _e2m1_bits(w, 8 + 4 * H),
                        _e2m1_bits(w, 16 + 4 * H), _e2m1_bits(w, 24 + 4 * H))
    return tl.fma(bits.to(tl.float32, bitcast=True), 2.0 ** 127, 0.0)


@triton.jit
def _mxfp4_stream_block(p32, base, mask_b):
    """(lo, hi) fp32 [BN, 16]: the blocks at byte base [BN] (e8m0 at 0, qs[16] at 1: the code
    words hold weights 0..15 in their low nibbles, byte b of word j weight 4 j + b, and 16..31
    in their high nibbles), d * kv[q] as _mxfp4_scale * _mxfp4_code."""
    d = _e8m0_half(stream_byte(p32, base, mask_b))                     # [BN, 1]
    w = stream_words(p32, base + 1, tl.arange(0, 4), mask_b)            # [BN, 4]
    return _scale_first(d, _mxfp4_plane(w, 0)), _scale_first(d, _mxfp4_plane(w, 1))


MXFP4 = traits("MXFP4", _mxfp4_code, _mxfp4_scale, _scale_first,
               stream_block=_mxfp4_stream_block)
