"""Random but valid ggml blocks with a chosen weight scale, generated as raw bytes.

A synthetic 30B-weight model cannot be made by quantizing 30 B floats; instead each format's block
bytes are drawn at random (every code valid) and its scale fields set so the decoded weights have
standard deviation `sigma` and (about) zero mean. The unit standard deviation of each format's codes
is measured once by decoding a sample with gguf-py (Q2_0, which gguf-py lacks, is computed).

Per-format fix-ups, and why:
  Q4_0   nibble 0 (-8) is remapped to 8 (0): codes -7..7, symmetric, so no shared mean.
  Q2_0   crumb 3 (+2) becomes 1 (0): codes -1, 0, 0, +1, symmetric.
  Q4_K   every 6-bit scale and min = 32 and dmin = 7.5 d: w = 32 d (q - 7.5), centred.
  Q6_K   int8 sub-block scales drawn in [16, 48).
  Q4_1 / Q5_1  m = -7.5 d / -15.5 d: w = d (q - 7.5) / d (q - 15.5), centred.
  Q2_K   every scale 8, every min 12, dmin = d: w = 8 d (q - 1.5), centred.
  Q3_K   every 6-bit scale 48 (16 after the -32); code -4 (crumb 0, hmask bit 0) becomes 0 (the
         hmask bit set): codes -3..3, symmetric.
  Q5_K   as Q4_K with dmin = 15.5 d.
  IQ4_XS every 6-bit scale 48 (16): the IQ4_NL levels, as IQ4_NL's blocks.
  IQ2_*, IQ3_XXS, IQ1_*: random signs / delta signs centre them; only d is set (IQ1_M's is split
  over the top nibbles of its scale words).
"""
from __future__ import annotations

import concurrent.futures as cf
import os
from functools import lru_cache

import numpy as np

from strata.errors import StrataError
from strata.formats.table import Format, get_format

_THREADS = min(8, os.cpu_count() or 1)
_FLOAT = {"F32": np.float32, "F16": np.float16}


def random_bytes(seed, n: int) -> np.ndarray:
    """n uniform random bytes; threads fill parts from independent streams (numpy drops the GIL)."""
    out = np.empty(n, np.uint8)
    parts = max(1, min(_THREADS, n >> 24))
    seqs = np.random.SeedSequence(seed).spawn(parts)
    bounds = np.linspace(0, n, parts + 1).astype(np.int64)

    def fill(j):
        g = np.random.Generator(np.random.PCG64(seqs[j]))
        a, b = bounds[j], bounds[j + 1]
        out[a:b] = g.integers(0, 256, size=b - a, dtype=np.uint8)
    if parts == 1:
        fill(0)
    else:
        with cf.ThreadPoolExecutor(parts) as ex:
            list(ex.map(fill, range(parts)))
    return out


def random_normal(seed, n: int, sigma: float, dtype) -> np.ndarray:
    """n normal floats N(0, sigma^2) as bf16/f16/f32 bytes view-able as `dtype` ('BF16'|'F16'|'F32')."""
    import torch
    g = torch.Generator().manual_seed(int(np.random.SeedSequence(seed).generate_state(1)[0]))
    t = torch.randn(n, generator=g) * sigma
    t = t.to({"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}[dtype])
    return t.view(torch.uint8).numpy()


def _fixup(fmt: Format, blk: np.ndarray, d: float) -> None:
    """Set scale fields of blocks [n, block_bytes] in place for unit scale `d`."""
    d16 = np.array([d], np.float16).view(np.uint8)
    name = fmt.name
    if name in ("Q8_0", "Q5_0", "IQ4_NL", "IQ3_S", "Q4_0", "Q2_0"):
        blk[:, 0:2] = d16
        if name == "Q4_0":
            q = blk[:, 2:]
            q |= np.where((q & 0x0F) == 0, 0x08, 0).astype(np.uint8)
            q |= np.where((q & 0xF0) == 0, 0x80, 0).astype(np.uint8)
        elif name == "Q2_0":
            q = blk[:, 2:]
            both = (q & 0xAA) & ((q & 0x55) << 1)   # high bit of crumbs that read 3
            q &= ~both
    elif name == "Q4_K":
        blk[:, 0:2] = d16
        blk[:, 2:4] = np.array([d * 7.5], np.float16).view(np.uint8)
        blk[:, 4:12] = 160   # 6-bit scale/min 32 in the low bits, their high bits (2) for j+4
        blk[:, 12:16] = 0
    elif name == "Q6_K":
        blk[:, 192:208] = (blk[:, 192:208] % 32 + 16)
        blk[:, 208:210] = d16
    elif name in ("Q4_1", "Q5_1"):
        blk[:, 0:2] = d16
        blk[:, 2:4] = np.array([-d * (7.5 if name == "Q4_1" else 15.5)], np.float16).view(np.uint8)
    elif name == "Q2_K":
        blk[:, 0:16] = 8 | (12 << 4)
        blk[:, 80:82] = d16
        blk[:, 82:84] = d16
    elif name == "Q3_K":
        blk[:, 96:104] = 0       # low 4 bits of every scale: 0; high 2 bits: 3 -> 48
        blk[:, 104:108] = 0xFF
        blk[:, 108:110] = d16
        qs, hm = blk[:, 32:96], blk[:, 0:32]
        for h in range(2):       # weight 128h + 32j + l: crumb in qs[32h + l], bit 4h + j of hm[l]
            for j in range(4):
                zero = ((qs[:, 32 * h:32 * h + 32] >> (2 * j)) & 3) == 0
                hm |= (zero.astype(np.uint8) << (4 * h + j))
    elif name == "Q5_K":
        blk[:, 0:2] = d16
        blk[:, 2:4] = np.array([d * 15.5], np.float16).view(np.uint8)
        blk[:, 4:12] = 160
        blk[:, 12:16] = 0
    elif name == "IQ4_XS":
        blk[:, 0:2] = d16
        blk[:, 2:4] = 0xFF       # high 2 bits of every scale 3, low 4 bits 0: 48
        blk[:, 4:8] = 0
    elif name in ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ1_S"):
        blk[:, 0:2] = d16
    elif name == "IQ1_M":
        u = int(d16.view(np.uint16)[0])
        for j in range(4):       # nibble j of d in the top nibble of scale word j (byte 49 + 2j)
            blk[:, 49 + 2 * j] = (blk[:, 49 + 2 * j] & 0x0F) | (((u >> (4 * j)) & 0xF) << 4)
    elif name == "MXFP4":
        blk[:, 0] = np.uint8(d)  # here `d` is the e8m0 exponent byte
    else:
        raise StrataError(f"strata synth cannot draw random {name} blocks yet")


@lru_cache(maxsize=None)
def unit_std(fmt_name: str) -> float:
    """Standard deviation of decoded weights at unit scale (d = 1; MXFP4: exponent byte 128)."""
    fmt = get_format(fmt_name)
    if fmt.name == "Q2_0":
        return float(np.sqrt(0.5))  # codes -1, 0, 0, +1
    import gguf
    from gguf.quants import dequantize
    blk = random_bytes(12345, 512 * fmt.block_bytes).reshape(512, fmt.block_bytes)
    _fixup(fmt, blk, 128 if fmt.name == "MXFP4" else 1.0)
    w = dequantize(blk, gguf.GGMLQuantizationType(fmt.ggml_type)).astype(np.float64)
    return float(w.std())


def random_matrix(fmt, rows: int, cols: int, sigma: float, seed) -> np.ndarray:
    """uint8 [rows, row_bytes]: a random [rows, cols] matrix in `fmt` with weight std ~ sigma."""
    fmt = get_format(fmt)
    if fmt.block == 1:  # plain floats
        if fmt.name == "BF16":
            return random_normal(seed, rows * cols, sigma, "BF16").reshape(rows, -1)
        return random_normal(seed, rows * cols, sigma, fmt.name).reshape(rows, -1)
    nb = fmt.nbytes(rows, cols) // fmt.block_bytes
    blk = random_bytes(seed, nb * fmt.block_bytes).reshape(nb, fmt.block_bytes)
    u = unit_std(fmt.name)
    if fmt.name == "MXFP4":
        _fixup(fmt, blk, int(np.clip(128 + np.round(np.log2(sigma / u)), 1, 254)))
    else:
        _fixup(fmt, blk, sigma / u)
    return blk.reshape(rows, -1)
