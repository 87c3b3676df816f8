"""Triton decoders of the 1.5-bit i-quants IQ1_S and IQ1_M (mirrors strata.formats.iq1).

The grid (8 values from {-1, 0, 1} per point) is read from the one i-quant table, tab_ptr =
`strata.formats.tables.device_table("iq", device)`, at `iq_table_offset("IQ1_S")` (IQ1_M shares
it). The scale part is dl = d * (2 * scale + 1), the code part grid + delta (delta = +-0.125, exact),
and w = dl * code, as gguf-py and ggml.

    _<fmt>_scale(w_ptr, row_bytes, offs_n, offs_k, mask) / _<fmt>_code(..., mask, tab_ptr)
        -> fp32 [BN, BK] (the grid formats' codes: (magnitude, sign bit)); one traits bundle a
        format at the end (arguments: see the package doc and strata.kernels.decode.bundle)
"""
import triton
import triton.language as tl

from strata.formats.iq1 import DELTA
from strata.formats.tables import iq_table_offset
from strata.kernels.decode._common import _block_off, _ld_f16, _ld_u8, _scale_first, fmt_consts
from strata.kernels.decode.bundle import traits

IQ1_S_LOG2, IQ1_S_BYTES = fmt_consts("IQ1_S")
IQ1_M_LOG2, IQ1_M_BYTES = fmt_consts("IQ1_M")
IQ1_TAB = tl.constexpr(iq_table_offset("IQ1_S"))
IQ1_DELTA = tl.constexpr(DELTA)


@triton.jit
def _iq1_s_scale(w_ptr, row_bytes, offs_n, offs_k, mask):
    """d * (2 * sc + 1), sc = bits 12..14 of qh[s] (s = w/32): bits 4..6 of its high byte."""
    s = ((offs_k & 255) >> 5)[None, :]
    blk = _block_off(row_bytes, offs_n, offs_k, IQ1_S_LOG2, IQ1_S_BYTES)
    sc = (_ld_u8(w_ptr, blk + 35 + s * 2, mask) >> 4) & 7
    return _ld_f16(w_ptr, blk, mask) * (2 * sc + 1).to(tl.float32)


@triton.jit
def _iq1_grid(tab_ptr, idx, w, mask):
    return tl.load(tab_ptr + IQ1_TAB + idx * 8 + (w & 7)[None, :], mask=mask, other=0)


@triton.jit
def _iq1_s_code(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr):
    """IQ1_S (50 B): fp16 d; qs[32]; u16 qh[8] (4 x 3 index bits | 3-bit scale | delta sign).
    grid + delta: point g = w/8 has index qs[g] | (bits 3(g%4) of qh[g/4]) << 8; delta's sign
    is bit 15 of qh[g/4]."""
    w = offs_k & 255
    g = (w >> 3)[None, :]
    blk = _block_off(row_bytes, offs_n, offs_k, IQ1_S_LOG2, IQ1_S_BYTES)
    at = blk + 34 + (g >> 2) * 2
    qh = _ld_u8(w_ptr, at, mask) | (_ld_u8(w_ptr, at + 1, mask) << 8)
    idx = _ld_u8(w_ptr, blk + 2 + g, mask) | (((qh >> ((g & 3) * 3)) & 7) << 8)
    delta = tl.where((qh & 0x8000) == 0, IQ1_DELTA, -IQ1_DELTA)
    return _iq1_grid(tab_ptr, idx, w, mask).to(tl.float32) + delta


@triton.jit
def _iq1_m_scale(w_ptr, row_bytes, offs_n, offs_k, mask):
    """d * (2 * sc + 1): sc = bits 3(s%4) of scale word s/4 (s = w/16); d is the fp16 made of
    the top nibbles of the 4 scale words at bytes 48..55 (word 0 lowest)."""
    s = ((offs_k & 255) >> 4)[None, :]
    blk = _block_off(row_bytes, offs_n, offs_k, IQ1_M_LOG2, IQ1_M_BYTES)
    u = ((_ld_u8(w_ptr, blk + 49, mask) >> 4) | ((_ld_u8(w_ptr, blk + 51, mask) >> 4) << 4)
         | ((_ld_u8(w_ptr, blk + 53, mask) >> 4) << 8) | ((_ld_u8(w_ptr, blk + 55, mask) >> 4) << 12))
    d = u.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    at = blk + 48 + (s >> 2) * 2
    word = _ld_u8(w_ptr, at, mask) | (_ld_u8(w_ptr, at + 1, mask) << 8)
    sc = (word >> ((s & 3) * 3)) & 7
    return d * (2 * sc + 1).to(tl.float32)


@triton.jit
def _iq1_m_code(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr):
    """IQ1_M (56 B): qs[32]; qh[16]; 4 u16 scale words (4 x 3-bit scales | fp16 d nibble).
    grid + delta: point g = w/8, nibble g%2 of qh[g/2]: bits 0..2 index bits 8..10, bit 3 the
    delta's sign; index low byte qs[g]."""
    w = offs_k & 255
    g = (w >> 3)[None, :]
    blk = _block_off(row_bytes, offs_n, offs_k, IQ1_M_LOG2, IQ1_M_BYTES)
    nib = (_ld_u8(w_ptr, blk + 32 + (g >> 1), mask) >> ((g & 1) * 4)) & 15
    idx = _ld_u8(w_ptr, blk + g, mask) | ((nib & 7) << 8)
    delta = tl.where((nib & 8) == 0, IQ1_DELTA, -IQ1_DELTA)
    return _iq1_grid(tab_ptr, idx, w, mask).to(tl.float32) + delta


IQ1_S = traits("IQ1_S", _iq1_s_code, _iq1_s_scale, _scale_first, GRID=True)
IQ1_M = traits("IQ1_M", _iq1_m_code, _iq1_m_scale, _scale_first, GRID=True)
