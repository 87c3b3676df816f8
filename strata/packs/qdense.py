"""A dense matrix kept as its GGUF blocks: what `strata pack` keeps of a GGUF's quantized
attention, embedding and head tensors, and `synth --pack` of a mix's. The pack holds the blocks
(the GGUF's bytes, not 4x as many of fp32), a reader decodes them when asked (fp32, bit-exact:
strata.formats), a CUDA load decodes them on the GPU into the dtype it computes in
(strata.engine.load.blocks_on_device).

    q = QuantDense("Q4_K", (R, C), raw)    # raw uint8 [R, C / block * block_bytes]
    w = q.decode()                          # fp32 [R, C]

Legend: R rows (output features), C columns (input features; whole blocks).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from strata.errors import StrataError


@dataclass(frozen=True)
class QuantDense:
    fmt: str                  # a strata.formats name (Q4_K, Q6_K, Q8_0, ...)
    shape: tuple[int, int]    # (R, C)
    raw: torch.Tensor         # uint8 [R, row_bytes]

    def __post_init__(self):
        from strata.formats import get_format
        f = get_format(self.fmt)
        R, C = self.shape
        if C % f.block or self.raw.dtype != torch.uint8 or \
                tuple(self.raw.shape) != (R, C // f.block * f.block_bytes):
            raise StrataError(f"{self.fmt} blocks of a [{R}, {C}] matrix are uint8 "
                              f"[{R}, {C // f.block * f.block_bytes}] (whole blocks a row), got "
                              f"{self.raw.dtype} {list(self.raw.shape)}")

    @property
    def nbytes(self) -> int:
        return self.raw.numel()

    def decode(self) -> torch.Tensor:
        """fp32 [R, C] (strata.formats' decoder: bit-exact against gguf-py)."""
        from strata.formats.codec import dequantize
        return dequantize(self.raw, self.fmt).reshape(self.shape)


def as_float(x) -> torch.Tensor:
    """A dense tensor's values: a QuantDense decoded (fp32), anything else as it is."""
    return x.decode() if isinstance(x, QuantDense) else x


def row_permutation(transform, rows: int) -> torch.Tensor | None:
    """The row order `transform` (an architecture's gguf_dense for one tensor, x -> x') gives an
    [R, C] matrix when it only reorders rows: the index of the source row of each output row,
    found by transforming a column of row numbers (from 1: a sign change of row 0 shows); None
    when it does anything else (then the blocks are decoded and the transform runs on the
    values)."""
    if rows >= 1 << 24:          # row numbers past fp32's exact integers
        return None
    probe = torch.arange(1, rows + 1, dtype=torch.float32).view(rows, 1)
    try:
        out = transform(probe.clone())
    except (RuntimeError, ValueError, IndexError):
        return None
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (rows, 1):
        return None
    perm = out.view(-1).to(torch.int64)
    if not torch.equal(perm.to(torch.float32), out.view(-1)) or \
            not torch.equal(torch.sort(perm).values, torch.arange(1, rows + 1)):
        return None
    return perm - 1


def block_format(fmt: str, shape):
    """The strata.formats Format a matrix of GGUF type `fmt` and torch `shape` [R, C] is kept
    in as its blocks, or None where it is not (a plain type, a format strata does not decode,
    not 2-D, rows that are not whole blocks); kept_rows adds the transform's condition."""
    from strata.formats import get_format
    from strata.formats.codec import DEQUANTIZERS
    try:
        f = get_format(fmt)
    except StrataError:
        return None
    if f.block == 1 or f.name not in DEQUANTIZERS or len(shape) != 2 or int(shape[1]) % f.block:
        return None
    return f


def kept_rows(fmt: str, shape, transform):
    """(Format, row order) of a GGUF tensor of type `fmt` and torch `shape` [R, C] a reader
    keeps as its blocks: block_format says yes and `transform` (the architecture's gguf_dense
    for it) only reorders rows (row_permutation); None where it is decoded instead. The reader
    (keep_blocks) and `strata plan`'s count of a stock mix both ask it."""
    f = block_format(fmt, shape)
    if f is None:
        return None
    perm = row_permutation(transform, int(shape[0]))
    return None if perm is None else (f, perm)


def keep_blocks(fmt: str, raw: torch.Tensor, shape, transform) -> QuantDense | None:
    """The QuantDense a reader keeps of a block-format 2-D tensor (raw uint8 [R, row_bytes], its
    torch `shape` [R, C]) whose `transform` only reorders rows (applied to the block rows); None
    where it cannot (kept_rows says no, the bytes are not that matrix's): the caller decodes."""
    kept = kept_rows(fmt, shape, transform)
    if kept is None:
        return None
    f, perm = kept
    R, C = (int(v) for v in shape)
    if raw.numel() != f.nbytes(R, C):
        return None
    raw = raw.reshape(R, -1)
    if not torch.equal(perm, torch.arange(R)):
        raw = raw[perm]
    return QuantDense(f.name, (R, C), raw)


def raw_rows(data) -> torch.Tensor:
    """A GGUF tensor's bytes (gguf-py's numpy view of the map) as a flat uint8 torch tensor,
    without a copy where numpy allows."""
    import warnings
    a = np.ascontiguousarray(np.asarray(data)).reshape(-1).view(np.uint8)
    with warnings.catch_warnings():     # a read-only map: nothing writes a source's bytes
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(a)
