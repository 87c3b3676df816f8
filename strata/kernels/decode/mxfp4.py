"""Triton decoder of MXFP4 (OCP microscaling; mirrors strata.formats.mxfp4): e8m0 scale, 32 e2m1
nibbles whose 8 magnitudes sit in one packed register constant.

    _mxfp4_scale(w_ptr, row_bytes, offs_n, offs_k, mask) / _mxfp4_code(..., mask, tab_ptr=None)
        -> fp32 [BN, BK]; the MXFP4 bundle at the end (see strata.kernels.decode.bundle)
"""
import triton
import triton.language as tl

from strata.formats.tables import KVALUES_MXFP4
from strata.kernels.decode._common import (_block_off, _ld_u8, _nibble32, _scale_first, fmt_consts,
                                           signed32)
from strata.kernels.decode.bundle import traits

MXFP4_LOG2, MXFP4_BYTES = fmt_consts("MXFP4")

# MXFP4 codes: bit 3 is the sign, bits 0-2 index 8 magnitudes (packed 4 bits each, < 16).
assert all(KVALUES_MXFP4[8 + i] == -KVALUES_MXFP4[i] for i in range(8))
assert all(0 <= v < 16 for v in KVALUES_MXFP4[:8])
MXFP4_MAGS = tl.constexpr(signed32(sum(v << (4 * i) for i, v in enumerate(KVALUES_MXFP4[:8]))))


@triton.jit
def _mxfp4_scale(w_ptr, row_bytes, offs_n, offs_k, mask):
    """2**(e - 128) built from bits (subnormal for e < 2), as ggml_e8m0_to_fp32_half."""
    e = _ld_u8(w_ptr, _block_off(row_bytes, offs_n, offs_k, MXFP4_LOG2, MXFP4_BYTES), mask)
    return tl.where(e < 2, 0x00200000 << e, (e - 1) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _mxfp4_code(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr=None):
    """MXFP4 (17 B): e8m0 e; qs[16] nibbles as Q4_0 index the doubled e2m1 values.
    w = d * kv[q], d = 2**(e - 128) (half the e8m0 scale, since kv is doubled)."""
    blk = _block_off(row_bytes, offs_n, offs_k, MXFP4_LOG2, MXFP4_BYTES)
    q = _nibble32(w_ptr, blk, offs_k & 31, mask, 1)
    mag = (MXFP4_MAGS >> ((q & 7) * 4)) & 15
    return tl.where(q >= 8, -mag, mag).to(tl.float32)                  # int: code 8 is +0


MXFP4 = traits("MXFP4", _mxfp4_code, _mxfp4_scale, _scale_first)
