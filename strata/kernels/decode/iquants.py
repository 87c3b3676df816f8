"""Triton decoders of the importance-matrix formats IQ4_NL and IQ3_S (mirrors
strata.formats.iquants).

IQ4_NL looks its 16 levels up in registers (packed constants built from strata.formats.tables);
IQ3_S reads its 512-entry grid from memory: decode_iq3_s takes one more argument, tab_ptr, the
int32 grid on the device (`strata.formats.tables.device_table("iq3s", device)`).

    _<fmt>_scale / _<fmt>_code / decode_<fmt>(w_ptr, row_bytes, offs_n, offs_k, mask[, tab_ptr])
        -> fp32 [BN, BK]   (arguments: see the package doc)
"""
import triton
import triton.language as tl

from strata.formats.tables import KVALUES_IQ4NL
from strata.kernels.decode._common import (_block_off, _ld_f16, _ld_u8, _nibble32, _scale_first,
                                           fmt_consts, pack_bytes)

GGML_IQ4_NL, IQ4_NL_LOG2, IQ4_NL_BYTES = fmt_consts("IQ4_NL")
GGML_IQ3_S, IQ3_S_LOG2, IQ3_S_BYTES = fmt_consts("IQ3_S")

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
def _iq4_nl_code(w_ptr, row_bytes, offs_n, offs_k, mask):
    blk = _block_off(row_bytes, offs_n, offs_k, IQ4_NL_LOG2, IQ4_NL_BYTES)
    return _iq4nl_level(_nibble32(w_ptr, blk, offs_k & 31, mask, 2)).to(tl.float32)

@triton.jit
def decode_iq4_nl(w_ptr, row_bytes, offs_n, offs_k, mask):
    """IQ4_NL (18 B): fp16 d; qs[16] nibbles as Q4_0 index kvalues_iq4nl. w = d * kv[q]."""
    return _scale_first(_iq4_nl_scale(w_ptr, row_bytes, offs_n, offs_k, mask),
                        _iq4_nl_code(w_ptr, row_bytes, offs_n, offs_k, mask))

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
    """(magnitude as fp32, negative?) of weight w: grid point g = w/4 has index
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
def _iq3_s_value(db, mag, neg):
    v = db * mag
    # flip the sign bit, as ggml's * -1.0f: Triton's -v is 0 - v, which turns -0 into +0
    return (v.to(tl.uint32, bitcast=True) ^ (neg.to(tl.uint32) << 31)).to(tl.float32, bitcast=True)

@triton.jit
def decode_iq3_s(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr):
    """IQ3_S (110 B): fp16 d; qs[64]; qh[8]; signs[32]; scales[4]; tab_ptr: int32 grid [512].
    w = (d * (1 + 2*sc)) * magnitude * (+-1), in that order (see _iq3_s_code)."""
    mag, neg = _iq3_s_code(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr)
    return _iq3_s_value(_iq3_s_scale(w_ptr, row_bytes, offs_n, offs_k, mask), mag, neg)

