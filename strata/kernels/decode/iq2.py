"""Triton decoders of the 2-bit i-quants IQ2_XXS, IQ2_XS, IQ2_S (mirrors strata.formats.iq2).

Each reads its grid (8 magnitudes per point, one int32 each) from the one i-quant table,
tab_ptr = `strata.formats.tables.device_table("iq", device)`, at the constexpr offset
`iq_table_offset(name)`. Signs are ksigns_iq2xs bits computed in registers (_ksign) or stored
bits (IQ2_S). w = ((d * (0.5 + scale)) * 0.25) * magnitude * (+-1), the sign flipped as a bit.

    _<fmt>_scale(w_ptr, row_bytes, offs_n, offs_k, mask) / _<fmt>_code(..., mask, tab_ptr)
        -> fp32 [BN, BK] (the grid formats' codes: (magnitude, sign bit)); one traits bundle a
        format at the end (arguments: see the package doc and strata.kernels.decode.bundle)
"""
import triton
import triton.language as tl

from strata.formats.tables import iq_table_offset
from strata.kernels.decode._common import _block_off, _ld_f16, _ld_u8, fmt_consts
from strata.kernels.decode.bundle import traits
from strata.kernels.decode.iquants import _iq3_s_value, _ksign, _ksign_of

IQ2_XXS_LOG2, IQ2_XXS_BYTES = fmt_consts("IQ2_XXS")
IQ2_XS_LOG2, IQ2_XS_BYTES = fmt_consts("IQ2_XS")
IQ2_S_LOG2, IQ2_S_BYTES = fmt_consts("IQ2_S")
IQ2_XXS_TAB = tl.constexpr(iq_table_offset("IQ2_XXS"))
IQ2_XS_TAB = tl.constexpr(iq_table_offset("IQ2_XS"))
IQ2_S_TAB = tl.constexpr(iq_table_offset("IQ2_S"))


@triton.jit
def _db(d, sc):
    return d * (0.5 + sc.to(tl.float32)) * 0.25


@triton.jit
def _iq2_xxs_scale(w_ptr, row_bytes, offs_n, offs_k, mask):
    """Sub-block s = w/32: scale = top nibble of the second u32 of pair s (byte 2 + 8s + 7)."""
    s = ((offs_k & 255) >> 5)[None, :]
    blk = _block_off(row_bytes, offs_n, offs_k, IQ2_XXS_LOG2, IQ2_XXS_BYTES)
    return _db(_ld_f16(w_ptr, blk, mask), _ld_u8(w_ptr, blk + 9 + s * 8, mask) >> 4)


@triton.jit
def _iq2_xxs_code(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr):
    """IQ2_XXS (66 B): fp16 d; 8 x (u32 4 grid indices, u32 4 x 7 sign bits | scale).
    (magnitude, negative?): group (w%32)/8 of pair s: grid index = byte group of the first
    u32, ksigns index = bits 7*group of the second."""
    w = offs_k & 255
    blk = _block_off(row_bytes, offs_n, offs_k, IQ2_XXS_LOG2, IQ2_XXS_BYTES)
    pair = blk + 2 + ((w >> 5) * 8)[None, :]
    grp = (w >> 3) & 3
    idx = _ld_u8(w_ptr, pair + grp[None, :], mask)
    mag = tl.load(tab_ptr + IQ2_XXS_TAB + idx * 8 + (w & 7)[None, :], mask=mask, other=0)
    return mag.to(tl.float32), _ksign(w_ptr, pair + 4, grp, w & 7, mask)


@triton.jit
def _nibble_scale(w_ptr, blk, offs_k, mask, AT: tl.constexpr):
    """IQ2_XS / IQ2_S: nibble s%2 of scales[s/2] at byte AT, s = w/16."""
    s = ((offs_k & 255) >> 4)[None, :]
    return (_ld_u8(w_ptr, blk + AT + (s >> 1), mask) >> ((s & 1) * 4)) & 15


@triton.jit
def _iq2_xs_scale(w_ptr, row_bytes, offs_n, offs_k, mask):
    blk = _block_off(row_bytes, offs_n, offs_k, IQ2_XS_LOG2, IQ2_XS_BYTES)
    return _db(_ld_f16(w_ptr, blk, mask), _nibble_scale(w_ptr, blk, offs_k, mask, 66))


@triton.jit
def _iq2_xs_code(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr):
    """IQ2_XS (74 B): fp16 d; u16 qs[32] (9-bit grid index | 7-bit signs); scales[8] nibbles.
    (magnitude, negative?): u16 qs[w/8]: bits 0..8 grid index, 9..15 ksigns index."""
    w = offs_k & 255
    blk = _block_off(row_bytes, offs_n, offs_k, IQ2_XS_LOG2, IQ2_XS_BYTES)
    at = blk + 2 + ((w >> 3) * 2)[None, :]
    q = _ld_u8(w_ptr, at, mask) | (_ld_u8(w_ptr, at + 1, mask) << 8)
    mag = tl.load(tab_ptr + IQ2_XS_TAB + (q & 511) * 8 + (w & 7)[None, :], mask=mask, other=0)
    return mag.to(tl.float32), _ksign_of(q >> 9, w & 7)


@triton.jit
def _iq2_s_scale(w_ptr, row_bytes, offs_n, offs_k, mask):
    blk = _block_off(row_bytes, offs_n, offs_k, IQ2_S_LOG2, IQ2_S_BYTES)
    return _db(_ld_f16(w_ptr, blk, mask), _nibble_scale(w_ptr, blk, offs_k, mask, 74))


@triton.jit
def _iq2_s_code(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr):
    """IQ2_S (82 B): fp16 d; qs[32]; signs[32]; qh[8]; scales[8] nibbles.
    (magnitude, negative?): point g = w/8, index = qs[g] | (bits 2(g%4) of qh[g/4]) << 8;
    sign = bit w%8 of signs[g]."""
    w = offs_k & 255
    g = (w >> 3)[None, :]
    blk = _block_off(row_bytes, offs_n, offs_k, IQ2_S_LOG2, IQ2_S_BYTES)
    hi = (_ld_u8(w_ptr, blk + 66 + (g >> 2), mask) >> ((g & 3) * 2)) & 3
    idx = _ld_u8(w_ptr, blk + 2 + g, mask) | (hi << 8)
    mag = tl.load(tab_ptr + IQ2_S_TAB + idx * 8 + (w & 7)[None, :], mask=mask, other=0)
    neg = (_ld_u8(w_ptr, blk + 34 + g, mask) >> (w & 7)[None, :]) & 1
    return mag.to(tl.float32), neg


IQ2_XXS = traits("IQ2_XXS", _iq2_xxs_code, _iq2_xxs_scale, _iq3_s_value, GRID=True)
IQ2_XS = traits("IQ2_XS", _iq2_xs_code, _iq2_xs_scale, _iq3_s_value, GRID=True)
IQ2_S = traits("IQ2_S", _iq2_s_code, _iq2_s_scale, _iq3_s_value, GRID=True)
