"""Round-to-nearest encoders for the formats strata otherwise only decodes: Q2_K, Q3_K, Q4_K,
Q5_K, Q6_K (256 weights), IQ4_XS (256) and IQ4_NL (32), so an experiment can quantize one set of
float weights into every stock mix (experiments/quant_quality.py).

These are NOT llama.cpp's quantizers: llama.cpp searches each sub-block's scale and minimum
(make_qkx2_quants, make_qx_quants, an importance matrix when given), which lowers the error;
here each sub-block's scale is the smallest that covers its range with no code clamped, rounded
UP to the format's scale grid, and each weight takes the nearest code. So every weight decodes
to within half a step of the sub-block (for the IQ4 tables, half the widest gap between two
table values, times the scale) of its float value: `rtn_bound` says how far, and the tests hold
each encoder to it through strata's own decoders (strata.formats.kquants / iquants).

Every function maps fp32 [n, block] to uint8 [n, block_bytes] in the layout the decoder reads.

Legend: n blocks, S sub-blocks a block, B weights a sub-block, d / dmin the block's fp16 super
scales, sc / m a sub-block's integer scale / minimum, q a weight's code.
"""
from __future__ import annotations

import torch

from strata.formats._util import f16_bytes
from strata.formats.tables import KVALUES_IQ4NL


def _f16_up(x: torch.Tensor) -> torch.Tensor:
    """fp32 >= 0 rounded UP to fp16 (as the block stores it, never below x: a scale rounded
    down, in fp16's subnormal range above all, would clamp codes)."""
    h = x.to(torch.float16)
    up = (h.to(torch.float32) < x) & torch.isfinite(h)
    h = torch.where(up, (h.view(torch.int16) + 1).view(torch.float16), h)
    return h.to(torch.float32)


def _super(need: torch.Tensor, top: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp16 super scale d [n, 1], integer scales [n, S] in 0..top) with d * sc >= need: d is
    the largest need over `top - 0.5` rounded up to fp16, sc the ceiling of need / d."""
    d = _f16_up(need.amax(dim=1, keepdim=True) / (top - 0.5))
    sc = torch.where(d > 0, torch.ceil(need / torch.where(d > 0, d, 1)), 0).clamp(0, top)
    return d, sc


def _affine(x: torch.Tensor, S: int, levels: int, top: int):
    """Scale and minimum per sub-block for w = d*sc*q - dmin*m (q in 0..levels): the minimum
    covers the sub-block's negative part, the scale the rest. Returns d, dmin [n, 1], sc, m
    [n, S] (ints as fp32) and q [n, S, B]."""
    n = x.shape[0]
    xs = x.reshape(n, S, -1)
    low = (-xs.amin(dim=2)).clamp(min=0)                    # the minimum, as ggml keeps it <= 0
    dmin, m = _super(low, top)
    off = dmin * m                                          # >= low
    d, sc = _super((xs.amax(dim=2) + off).clamp(min=0) / levels, top)
    step = (d * sc)[:, :, None]
    q = torch.where(step > 0, torch.round((xs + off[:, :, None]) / torch.where(step > 0, step, 1)),
                    0).clamp(0, levels)
    return d, dmin, sc, m, q


def _pack_k4_scales(sc: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """8 six-bit scales and minimums [n, 8] -> Q4_K's 12 bytes (strata.formats.kquants.
    q4_k_scale_min's inverse)."""
    sc, m = sc.to(torch.int32), m.to(torch.int32)
    b0 = (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6)
    b1 = (m[:, :4] & 63) | ((m[:, 4:] >> 4) << 6)
    b2 = (sc[:, 4:] & 0xF) | ((m[:, 4:] & 0xF) << 4)
    return torch.cat([b0, b1, b2], dim=1).to(torch.uint8)


def _bytes(d: torch.Tensor) -> torch.Tensor:
    return f16_bytes(d)


def quantize_q4_k(x: torch.Tensor) -> torch.Tensor:
    """Q4_K [n, 144]: d, dmin, scales[12], qs[128] (sub-block 2j the low nibbles of
    qs[32j:32j+32], 2j+1 the high ones)."""
    d, dmin, sc, m, q = _affine(x, 8, 15, 63)
    q = q.to(torch.int32).reshape(-1, 4, 2, 32)
    qs = q[:, :, 0] | (q[:, :, 1] << 4)
    return torch.cat([_bytes(d), _bytes(dmin), _pack_k4_scales(sc, m),
                      qs.reshape(-1, 128).to(torch.uint8)], dim=1)


def quantize_q5_k(x: torch.Tensor) -> torch.Tensor:
    """Q5_K [n, 176]: d, dmin, scales[12] (as Q4_K), qh[32] (bit s of qh[i]: the 5th bit of
    weight i of sub-block s), qs[128] (the low 4 bits, as Q4_K)."""
    d, dmin, sc, m, q = _affine(x, 8, 31, 63)
    q = q.to(torch.int32)                                           # [n, 8, 32]
    sh = torch.arange(8, dtype=torch.int32, device=x.device)[None, :, None]
    qh = (((q >> 4) & 1) << sh).sum(dim=1)                          # [n, 32]
    lo = (q & 0xF).reshape(-1, 4, 2, 32)
    qs = lo[:, :, 0] | (lo[:, :, 1] << 4)
    return torch.cat([_bytes(d), _bytes(dmin), _pack_k4_scales(sc, m), qh.to(torch.uint8),
                      qs.reshape(-1, 128).to(torch.uint8)], dim=1)


def quantize_q2_k(x: torch.Tensor) -> torch.Tensor:
    """Q2_K [n, 84]: scales[16] (low nibble scale, high nibble minimum), qs[64] 2-bit codes
    (weight w: byte 32*(w//128) + w%32, bits 2*((w%128)//32)), d, dmin."""
    d, dmin, sc, m, q = _affine(x, 16, 3, 15)
    scales = (sc.to(torch.int32) | (m.to(torch.int32) << 4)).to(torch.uint8)
    return torch.cat([scales, _crumbs(q.reshape(-1, 256)), _bytes(d), _bytes(dmin)], dim=1)


def _crumbs(q: torch.Tensor) -> torch.Tensor:
    """2-bit codes [n, 256] -> 64 bytes (strata.formats.kquants._crumbs' inverse)."""
    c = q.to(torch.int32).reshape(-1, 2, 4, 32)
    sh = (2 * torch.arange(4, dtype=torch.int32, device=q.device))[None, None, :, None]
    return (c << sh).sum(dim=2).reshape(-1, 64).to(torch.uint8)


def _symmetric(x: torch.Tensor, S: int, lo: int, hi: int, top: int):
    """Scale per sub-block for w = d*sc*q, q in lo..hi (lo < 0 < hi), no code clamped: the
    scale covers max/hi and min/lo. Returns d [n, 1], sc [n, S], q [n, S, B] (fp32)."""
    n = x.shape[0]
    xs = x.reshape(n, S, -1)
    need = torch.maximum(xs.amax(dim=2).clamp(min=0) / hi, xs.amin(dim=2).clamp(max=0) / lo)
    d, sc = _super(need, top)
    step = (d * sc)[:, :, None]
    q = torch.where(step > 0, torch.round(xs / torch.where(step > 0, step, 1)), 0).clamp(lo, hi)
    return d, sc, q


def quantize_q6_k(x: torch.Tensor) -> torch.Tensor:
    """Q6_K [n, 210]: ql[128] (weight w = 128h + r: low 4 bits in ql[64h + r%64] at 4*(r//64)),
    qh[64] (top 2 bits in qh[32h + r%32] at 2*(r//32)), int8 scales[16], d."""
    d, sc, q = _symmetric(x, 16, -32, 31, 127)
    q = (q.to(torch.int32) + 32).reshape(-1, 2, 2, 64)
    low = q & 0xF
    ql = low[:, :, 0] | (low[:, :, 1] << 4)                         # [n, 2, 64]
    hi = (q >> 4).reshape(-1, 2, 4, 32)
    sh = (2 * torch.arange(4, dtype=torch.int32, device=x.device))[None, None, :, None]
    qh = (hi << sh).sum(dim=2)                                      # [n, 2, 32]
    scales = sc.to(torch.int8).view(torch.uint8)
    return torch.cat([ql.reshape(-1, 128).to(torch.uint8), qh.reshape(-1, 64).to(torch.uint8),
                      scales, _bytes(d)], dim=1)


def quantize_q3_k(x: torch.Tensor) -> torch.Tensor:
    """Q3_K [n, 110]: hmask[32] (bit w//32 of hmask[w%32]: code >= 0), qs[64] (the code's
    low 2 bits, + 4 when negative, as Q2_K's crumbs), scales[12] (16 six-bit scales + 32), d."""
    d, sc, q = _symmetric(x, 16, -4, 3, 31)
    q = q.to(torch.int32).reshape(-1, 256)
    hbit = (q >= 0).to(torch.int32)
    crumb = torch.where(q >= 0, q, q + 4)
    hb = hbit.reshape(-1, 8, 32)
    sh = torch.arange(8, dtype=torch.int32, device=x.device)[None, :, None]
    hmask = (hb << sh).sum(dim=1)                                   # [n, 32]
    raw = sc.to(torch.int32) + 32                                   # [n, 16], 32..63
    low = (raw[:, :8] & 0xF) | ((raw[:, 8:] & 0xF) << 4)
    top = (raw >> 4) & 3
    high = sum(top[:, 4 * g:4 * g + 4] << (2 * g) for g in range(4))
    return torch.cat([hmask.to(torch.uint8), _crumbs(crumb), low.to(torch.uint8),
                      high.to(torch.uint8), _bytes(d)], dim=1)


def _nearest_kv(y: torch.Tensor) -> torch.Tensor:
    """Index of the IQ4 table value nearest each of y (in table units)."""
    kv = torch.tensor(KVALUES_IQ4NL, dtype=torch.float32, device=y.device)
    return (y[..., None] - kv).abs().argmin(dim=-1).to(torch.int32)


def quantize_iq4_xs(x: torch.Tensor) -> torch.Tensor:
    """IQ4_XS [n, 136]: d, u16 scales_h (bits 2s: sub-block s's top 2), scales_l[4] (nibble
    s%2 of byte s//2), qs[128] (sub-block s: nibbles of qs[16s:16s+16], lows first)."""
    n = x.shape[0]
    kmax, kmin = max(KVALUES_IQ4NL), min(KVALUES_IQ4NL)
    xs = x.reshape(n, 8, 32)
    need = torch.maximum(xs.amax(dim=2).clamp(min=0) / kmax, xs.amin(dim=2).clamp(max=0) / kmin)
    d, sc = _super(need, 31)
    step = (d * sc)[:, :, None]
    q = _nearest_kv(torch.where(step > 0, xs / torch.where(step > 0, step, 1), 0))
    raw = sc.to(torch.int32) + 32
    lo = (raw & 0xF).reshape(n, 4, 2)
    scales_l = lo[:, :, 0] | (lo[:, :, 1] << 4)
    sh = (2 * torch.arange(8, dtype=torch.int32, device=x.device))
    scales_h = ((raw >> 4) << sh).sum(dim=1, keepdim=True)          # [n, 1], 16 bits
    qs = q[:, :, :16] | (q[:, :, 16:] << 4)                         # [n, 8, 16]
    return torch.cat([_bytes(d), (scales_h & 0xFF).to(torch.uint8),
                      (scales_h >> 8).to(torch.uint8), scales_l.to(torch.uint8),
                      qs.reshape(n, 128).to(torch.uint8)], dim=1)


def quantize_iq4_nl(x: torch.Tensor) -> torch.Tensor:
    """IQ4_NL [n, 18]: d, qs[16] (weight j < 16 the low nibble of byte j, else the high one of
    byte j - 16): d covers the block's range in the table's units."""
    kmax, kmin = max(KVALUES_IQ4NL), min(KVALUES_IQ4NL)
    need = torch.maximum(x.amax(dim=1, keepdim=True).clamp(min=0) / kmax,
                         x.amin(dim=1, keepdim=True).clamp(max=0) / kmin)
    d = _f16_up(need)
    q = _nearest_kv(torch.where(d > 0, x / torch.where(d > 0, d, 1), 0))
    qs = q[:, :16] | (q[:, 16:] << 4)
    return torch.cat([_bytes(d), qs.to(torch.uint8)], dim=1)


RTN_QUANTIZERS = {"Q2_K": quantize_q2_k, "Q3_K": quantize_q3_k, "Q4_K": quantize_q4_k,
                  "Q5_K": quantize_q5_k, "Q6_K": quantize_q6_k, "IQ4_XS": quantize_iq4_xs,
                  "IQ4_NL": quantize_iq4_nl}

_WIDEST_GAP = max(b - a for a, b in zip(KVALUES_IQ4NL, KVALUES_IQ4NL[1:]))


def rtn_bound(fmt: str, step: torch.Tensor) -> torch.Tensor:
    """The most a weight's decode may miss its float value, given its sub-block's step (d*sc;
    IQ4_NL: d): half a step, or half the IQ4 table's widest gap times the scale."""
    return step * (_WIDEST_GAP / 2 if fmt.startswith("IQ4") else 0.5)
