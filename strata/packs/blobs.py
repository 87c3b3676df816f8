"""Assemble and split expert blobs: E experts' gate/up/down bytes <-> uint8 [E, blob_size].

Legend: E experts; a blob is gate [F, D], up [F, D], down [D, F] at the offsets of its BlobLayout.
"""
from __future__ import annotations

import numpy as np

from strata.blob import BlobLayout
from strata.errors import StrataError


def _as_u8(a) -> np.ndarray:
    if hasattr(a, "detach"):  # torch tensor
        a = a.detach().cpu().contiguous().view(-1).view(__import__("torch").uint8).numpy()
    a = np.ascontiguousarray(a)
    return a.reshape(-1).view(np.uint8)


def assemble_blobs(layout: BlobLayout, gate, up, down, n_expert: int, bias=None) -> np.ndarray:
    """uint8 [E, layout.size]: each matrix given as E experts' raw bytes (any shape/dtype whose
    bytes are the GGUF rows, e.g. a GGUF `ffn_gate_exps` tensor [E, F, row_bytes]). `bias`: a
    biased layout's (gate [E, F], up [E, F], down [E, D]) biases, any float dtype (kept fp32)."""
    out = np.zeros((n_expert, layout.size), np.uint8)  # padding between matrices stays zero
    if (bias is None) != (layout.bias is None):
        raise StrataError("expert biases given for a layout without a bias slot, or missing for "
                          "one with it" if bias is not None else
                          "this blob layout has a bias slot; give the experts' biases")
    if bias is not None:
        for name, b in zip(("gate", "up", "down"), bias):
            off, n = layout.bias.part(name)
            b = np.asarray(b.detach().cpu().float() if hasattr(b, "detach") else b, np.float32)
            if b.size != n_expert * n:
                raise StrataError(f"{name} biases hold {b.size} values, expected {n_expert} "
                                  f"experts x {n}")
            out[:, off:off + 4 * n] = np.ascontiguousarray(b).reshape(n_expert, n).view(np.uint8)
    for slot, src in zip(layout.matrices, (gate, up, down)):
        b = _as_u8(src)
        if b.size != n_expert * slot.nbytes:
            raise StrataError(f"{slot.name} matrices hold {b.size} bytes, expected {n_expert} experts x "
                              f"{slot.nbytes} B ({slot.fmt.name} [{slot.rows}, {slot.cols}])")
        out[:, slot.offset:slot.offset + slot.nbytes] = b.reshape(n_expert, slot.nbytes)
    return out


def split_blobs(layout: BlobLayout, blobs) -> dict[str, np.ndarray]:
    """The inverse: {'gate','up','down'} -> uint8 [E, rows, row_bytes] views of `blobs` [E, size]."""
    b = _as_u8(blobs).reshape(-1, layout.size)
    return {m.name: b[:, m.offset:m.offset + m.nbytes].reshape(-1, m.rows, m.row_bytes)
            for m in layout.matrices}
