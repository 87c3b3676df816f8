"""Triton decoder of MXFP4 (OCP microscaling; mirrors strata.formats.mxfp4): e8m0 scale, 32 e2m1
nibbles whose 8 magnitudes sit in one packed register constant.

    _mxfp4_scale(w_ptr, row_bytes, offs_n, offs_k, mask) / _mxfp4_code(..., mask, tab_ptr=None)
        -> fp32 [BN, BK]
    _mxfp4_stream_block(p32, base, mask_b, MAGIC) -> (lo, hi) fp32 [BN, 16]: whole blocks from
        aligned words (strata.kernels.decode.streams)
    the MXFP4 bundle at the end (see strata.kernels.decode.bundle)
"""
import triton
import triton.language as tl

from strata.formats.tables import KVALUES_MXFP4
from strata.kernels.decode._common import (_block_off, _f32_of, _ld_u8, _nibble32, _scale_first,
                                           fmt_consts, signed32)
from strata.kernels.decode.bundle import traits
from strata.kernels.decode.streams import stream_byte, stream_words
from strata.kernels.decode.superblocks import _planes

MXFP4_LOG2, MXFP4_BYTES = fmt_consts("MXFP4")

# MXFP4 codes: bit 3 is the sign, bits 0-2 index 8 magnitudes (packed 4 bits each, < 16).
assert all(KVALUES_MXFP4[8 + i] == -KVALUES_MXFP4[i] for i in range(8))
assert all(0 <= v < 16 for v in KVALUES_MXFP4[:8])
MXFP4_MAGS = tl.constexpr(signed32(sum(v << (4 * i) for i, v in enumerate(KVALUES_MXFP4[:8]))))
MXFP4_MAX = tl.constexpr(max(KVALUES_MXFP4))   # codes + this are >= 0 (the MAGIC conversion)


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
def _mxfp4_stream_block(p32, base, mask_b, MAGIC: tl.constexpr):
    """(lo, hi) fp32 [BN, 16]: the blocks at byte base [BN] (e8m0 at 0, qs[16] at 1: the code
    words hold weights 0..15 in their low nibbles, byte b of word j weight 4 j + b, and 16..31
    in their high nibbles), d * kv[q] as _mxfp4_scale * _mxfp4_code. MAGIC: codes to float by
    a float add (_f32_of) instead of int->float conversions."""
    d = _e8m0_half(stream_byte(p32, base, mask_b))[:, None]             # [BN, 1]
    w = stream_words(p32, base + 1, tl.arange(0, 4), mask_b)            # [BN, 4]
    lo = _mxfp4_int(_planes(w, 0, 4))
    hi = _mxfp4_int(_planes(w, 4, 4))
    if MAGIC:
        c_lo = _f32_of(lo + MXFP4_MAX, MXFP4_MAX)
        c_hi = _f32_of(hi + MXFP4_MAX, MXFP4_MAX)
    else:
        c_lo = lo.to(tl.float32)
        c_hi = hi.to(tl.float32)
    return _scale_first(d, c_lo), _scale_first(d, c_hi)


MXFP4 = traits("MXFP4", _mxfp4_code, _mxfp4_scale, _scale_first,
               stream_block=_mxfp4_stream_block)
