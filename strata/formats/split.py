"""Block formats whose weights are an integer code times a run scale (plus a run minimum), split
into those parts: what an integer GEMM multiplies (strata.kernels.moe.int8).

    w[n, k] = d[n, r] * c[n, k] + m[n, r]        r = k // run (the run of k)

c is an exact small integer (|c| <= 127, stored int8), d and m fp32 (m is 0 where a format has no
minimum; Q4_K/Q5_K/Q2_K store theirs negated, so m = -dmin * min). d * c + m equals
strata.formats.dequantize bit for bit (every d * c is exact in fp32: an fp16 or power-of-two
scale times a code of at most 8 bits; tests/kernels/test_moe_int8.py checks it).

Runs are 32 weights, 16 where a scale covers 16 (Q6_K, Q2_K, Q3_K). MXFP4 codes are twice the
e2m1 values (integers, KVALUES_MXFP4) with half the e8m0 scale; IQ4_NL/IQ4_XS codes are the
int8 levels of kvalues_iq4nl.

    split_codes(raw, fmt, rows, cols) -> (c int8 [rows, cols], d fp32 [rows, cols/run],
                                          m fp32 [rows, cols/run] or None)
"""
from __future__ import annotations

import torch

from strata.formats._util import bits, f16, nibbles
from strata.formats.kquants import _crumbs, q3_k_scales, q4_k_scale_min
from strata.formats.mxfp4 import e8m0_to_fp32_half
from strata.formats.table import get_format
from strata.formats.tables import KVALUES_IQ4NL, KVALUES_MXFP4


def _q8_0(b):
    return b[:, 2:].contiguous().view(torch.int8).to(torch.int32), f16(b[:, :2]), None


def _q4_0(b):
    return nibbles(b[:, 2:]) - 8, f16(b[:, :2]), None


def _q5_0(b):
    return (nibbles(b[:, 6:]) | (bits(b[:, 2:6]) << 4)) - 16, f16(b[:, :2]), None


def _q4_1(b):
    return nibbles(b[:, 4:]), f16(b[:, 0:2]), f16(b[:, 2:4])


def _q5_1(b):
    return nibbles(b[:, 8:]) | (bits(b[:, 4:8]) << 4), f16(b[:, 0:2]), f16(b[:, 2:4])


def _k4_scales(b):
    """Q4_K/Q5_K (d * sc [n, 8], -(dmin * m) [n, 8])."""
    d, dmin = f16(b[:, 0:2]), f16(b[:, 2:4])
    sc, mn = q4_k_scale_min(b[:, 4:16])
    return d * sc.to(torch.float32), -(dmin * mn.to(torch.float32))


def _q4_k(b):
    n = b.shape[0]
    qs = b[:, 16:144].to(torch.int32).reshape(n, 4, 1, 32)
    q = (qs >> torch.tensor([0, 4], dtype=torch.int32, device=b.device)[:, None]) & 0xF
    return (q.reshape(n, 256), *_k4_scales(b))


def _q5_k(b):
    n = b.shape[0]
    qs = b[:, 48:176].to(torch.int32).reshape(n, 4, 1, 32)
    lo = (qs >> torch.tensor([0, 4], dtype=torch.int32, device=b.device)[:, None]) & 0xF
    qh = b[:, 16:48].to(torch.int32)[:, None, :]                          # [n, 1, 32]
    hi = (qh >> torch.arange(8, dtype=torch.int32, device=b.device)[:, None]) & 1
    return ((lo.reshape(n, 8, 32) | (hi << 4)).reshape(n, 256), *_k4_scales(b))


def _q6_k(b):
    n = b.shape[0]
    ql = b[:, 0:128].to(torch.int32).reshape(n, 2, 1, 64)
    qh = b[:, 128:192].to(torch.int32).reshape(n, 2, 1, 32)
    lo = (ql >> torch.tensor([0, 4], dtype=torch.int32, device=b.device)[:, None]) & 0xF
    hi = (qh >> torch.tensor([0, 2, 4, 6], dtype=torch.int32, device=b.device)[:, None]) & 3
    q = lo.reshape(n, 256) | (hi.reshape(n, 256) << 4)
    sc = b[:, 192:208].contiguous().view(torch.int8).to(torch.float32)
    return q - 32, f16(b[:, 208:210]) * sc, None


def _q2_k(b):
    sc = b[:, 0:16].to(torch.int32)
    d, dmin = f16(b[:, 80:82]), f16(b[:, 82:84])
    return (_crumbs(b[:, 16:80]), d * (sc & 0xF).to(torch.float32),
            -(dmin * (sc >> 4).to(torch.float32)))


def _q3_k(b):
    n = b.shape[0]
    hm = b[:, 0:32].to(torch.int32)[:, None, :]                           # [n, 1, 32]
    hbit = (hm >> torch.arange(8, dtype=torch.int32, device=b.device)[:, None]) & 1
    q = _crumbs(b[:, 32:96]) - 4 * (1 - hbit.reshape(n, 256))
    return q, f16(b[:, 108:110]) * q3_k_scales(b[:, 96:108]).to(torch.float32), None


def _iq4_nl(b):
    kv = torch.tensor(KVALUES_IQ4NL, dtype=torch.int32, device=b.device)
    return kv[nibbles(b[:, 2:]).long()], f16(b[:, :2]), None


def _iq4_xs(b):
    n = b.shape[0]
    sh = b[:, 2].to(torch.int32) | (b[:, 3].to(torch.int32) << 8)         # [n]
    lo = bits(b[:, 4:8], 4)                                               # [n, 8]
    hi = (sh[:, None] >> (2 * torch.arange(8, dtype=torch.int32, device=b.device))) & 3
    kv = torch.tensor(KVALUES_IQ4NL, dtype=torch.int32, device=b.device)
    q = kv[nibbles(b[:, 8:136].reshape(n, 8, 16)).long()]                 # [n, 8, 32]
    return q.reshape(n, 256), f16(b[:, :2]) * ((lo | (hi << 4)) - 32).to(torch.float32), None


def _mxfp4(b):
    kv = torch.tensor(KVALUES_MXFP4, dtype=torch.int32, device=b.device)
    return kv[nibbles(b[:, 1:]).long()], e8m0_to_fp32_half(b[:, :1]), None


SPLITTERS = {"Q8_0": _q8_0, "Q4_0": _q4_0, "Q5_0": _q5_0, "Q4_1": _q4_1, "Q5_1": _q5_1,
             "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k, "Q2_K": _q2_k, "Q3_K": _q3_k,
             "IQ4_NL": _iq4_nl, "IQ4_XS": _iq4_xs, "MXFP4": _mxfp4}
# the formats' runs (weights per d / m); the table's tile_run says the same
RUNS = {name: get_format(name).tile_run for name in SPLITTERS}


def split_codes(raw: torch.Tensor, fmt, rows: int, cols: int):
    """(c int8 [rows, cols], d fp32 [rows, cols/run], m fp32 [rows, cols/run] or None) of a
    [rows, cols] matrix stored as `fmt` blocks in uint8 `raw` (see the module docstring)."""
    f = get_format(fmt)
    if f.name not in SPLITTERS:
        from strata.errors import StrataError
        raise StrataError(f"{f.name} has no integer split; the int8 GEMM reads "
                          f"{', '.join(SPLITTERS)}")
    run = RUNS[f.name]
    c, d, m = SPLITTERS[f.name](raw.reshape(-1, f.block_bytes))
    d = d.expand(-1, f.block // run) if d.shape[1] == 1 else d
    if m is not None:
        m = m.expand(-1, f.block // run) if m.shape[1] == 1 else m
        m = m.reshape(rows, cols // run)
    return (c.to(torch.int8).reshape(rows, cols), d.reshape(rows, cols // run), m)
