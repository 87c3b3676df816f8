"""The plane layout of an expert blob: each Q8_0 / Q4_0 matrix's codes and scales apart.

Legend: N rows (output features), K inputs (a multiple of 32), R = K / 32 blocks per row,
cb code bytes per block (Q8_0 32, Q4_0 16), E experts.

ggml stores such a matrix as N·R blocks of (fp16 scale, cb code bytes) back to back: 34 bytes
(Q8_0) or 18 (Q4_0), so no code run starts 16-byte aligned and the scales interleave with the
codes; a kernel cannot load the codes as one plain tile. The plane layout keeps the matrix in
the same bytes of the blob (same offset, same `nbytes`), rearranged:

    [offset, offset + N·R·cb)              codes  [N, R·cb] uint8, row-major (row stride R·cb)
    [offset + N·R·cb, offset + nbytes)     scales [N, R] fp16, row-major (row stride 2·R bytes)

Q8_0's code bytes are its int8 q, in weight order. Q4_0's codes are re-paired in weight order:
code byte j of a row holds weight 2j in its low nibble and weight 2j+1 in its high nibble (ggml's
block puts weight i < 16 in the low nibble of qs[i] and i >= 16 in the high nibble of qs[i - 16]),
so a kernel unpacks a code tile into weight order with a shift and a mask, no shuffle. Since blob
matrices start
256-byte aligned (strata.blob) and K is whole blocks, every code row starts 16-byte aligned
(R·cb is a multiple of 16) and the scale plane starts 16-byte aligned (N·R·cb is). Matrices in
other formats and the bias slot are not touched, so the blob's size, and with it `max_blob` (the
ring's unit) and every count made from the BlobLayout, stay what they are.

The relayout is a permutation of bytes (of nibbles for Q4_0's codes), so it is exactly invertible
and every decoded value is the ggml decoder's bit for bit (`dequantize_planes` forms the same fp32
products as strata.formats.dequantize). `to_planes` / `to_ggml` are plain torch ops on any device
(the engine can run them on the GPU on a cache slot after its copy lands).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from strata.blob import BlobLayout, MatrixSlot
from strata.errors import StrataError
from strata.experts import ExpertSet

# formats whose block is one fp16 scale (bytes 0..1) then the code bytes: the plane layout
# separates the two; the value is the code bytes per block (cb)
PLANE_FORMATS = {"Q8_0": 32, "Q4_0": 16}
PLANE_ALIGN = 16   # what a code row and the scale plane start aligned to (cp.async / TMA)


@dataclass(frozen=True)
class MatrixPlanes:
    """Where one matrix's planes sit, in bytes from the blob's start."""
    name: str
    fmt: str             # "Q8_0" | "Q4_0"
    rows: int            # N
    cols: int            # K
    codes_offset: int    # = the MatrixSlot's offset (256-aligned)
    codes_row_bytes: int  # R·cb
    scales_offset: int   # codes_offset + N·R·cb (16-aligned)
    scales_row: int      # R: fp16 scales per row

    @property
    def nbytes(self) -> int:
        return self.rows * (self.codes_row_bytes + 2 * self.scales_row)


@dataclass(frozen=True)
class PlaneLayout:
    """The planes of one blob layout's plane-format matrices (None for the others)."""
    blob: BlobLayout
    gate: MatrixPlanes | None
    up: MatrixPlanes | None
    down: MatrixPlanes | None

    @property
    def matrices(self) -> tuple[MatrixPlanes | None, ...]:
        return (self.gate, self.up, self.down)


def matrix_planes(m: MatrixSlot) -> MatrixPlanes | None:
    """The planes of matrix slot `m`, None when its format has no plane layout."""
    cb = PLANE_FORMATS.get(m.fmt.name)
    if cb is None:
        return None
    r = m.cols // 32
    p = MatrixPlanes(m.name, m.fmt.name, m.rows, m.cols, m.offset, r * cb,
                     m.offset + m.rows * r * cb, r)
    assert p.nbytes == m.nbytes and p.codes_offset % PLANE_ALIGN == 0
    assert p.codes_row_bytes % PLANE_ALIGN == 0 and p.scales_offset % PLANE_ALIGN == 0
    return p


@lru_cache(maxsize=64)
def plane_layout(layout: BlobLayout) -> PlaneLayout:
    """Where each matrix's planes sit in a blob of `layout` (offsets and size unchanged)."""
    return PlaneLayout(layout, *(matrix_planes(m) for m in layout.matrices))


def _blocks(raw: torch.Tensor, fmt: str, rows: int, cols: int) -> torch.Tensor:
    cb = PLANE_FORMATS.get(fmt)
    if cb is None:
        raise StrataError(f"{fmt} has no plane layout; it is defined for "
                          f"{', '.join(PLANE_FORMATS)}")
    if cols % 32 or raw.dtype != torch.uint8 or raw.shape[-1] != rows * cols // 32 * (cb + 2):
        raise StrataError(f"a {fmt} [{rows}, {cols}] matrix is {rows * cols // 32 * (cb + 2)} "
                          f"uint8 bytes with cols a multiple of 32; got {raw.dtype} "
                          f"{tuple(raw.shape)}")
    return raw.reshape(*raw.shape[:-1], rows, cols // 32, cb + 2)          # [..., N, R, 2+cb]


def _pairs_of_ggml(qs: torch.Tensor) -> torch.Tensor:
    """Q4_0 qs [..., 16] (ggml's nibble order) -> [..., 16] bytes in weight-pair order."""
    q = torch.cat([qs & 0xF, qs >> 4], dim=-1)                               # [..., 32] weights
    return q[..., 0::2] | (q[..., 1::2] << 4)


def _ggml_of_pairs(pairs: torch.Tensor) -> torch.Tensor:
    """The inverse of _pairs_of_ggml."""
    q = torch.stack([pairs & 0xF, pairs >> 4], dim=-1).flatten(-2)           # [..., 32] weights
    return q[..., :16] | (q[..., 16:] << 4)


def to_planes(raw: torch.Tensor, fmt: str, rows: int, cols: int) -> torch.Tensor:
    """ggml blocks -> plane layout: uint8 [..., nbytes] -> a new uint8 [..., nbytes] (leading
    dims: several matrices at once). Codes [N, R·cb], then scales [N, R] fp16."""
    b = _blocks(raw, fmt, rows, cols)
    lead = b.shape[:-3]
    qs = b[..., 2:]
    if fmt == "Q4_0":
        qs = _pairs_of_ggml(qs)
    codes = qs.reshape(*lead, -1)                                            # [..., N·R·cb]
    scales = b[..., :2].reshape(*lead, -1)                                   # [..., N·R·2]
    return torch.cat([codes, scales], dim=-1)


def to_ggml(planes: torch.Tensor, fmt: str, rows: int, cols: int) -> torch.Tensor:
    """The inverse of `to_planes`: plane layout -> ggml blocks, uint8 [..., nbytes]."""
    cb = PLANE_FORMATS.get(fmt)
    _blocks(planes, fmt, rows, cols)      # validates
    r = cols // 32
    lead = planes.shape[:-1]
    n_codes = rows * r * cb
    codes = planes[..., :n_codes].reshape(*lead, rows, r, cb)
    if fmt == "Q4_0":
        codes = _ggml_of_pairs(codes)
    scales = planes[..., n_codes:].reshape(*lead, rows, r, 2)
    return torch.cat([scales, codes], dim=-1).reshape(*lead, -1)


def split_planes(planes: torch.Tensor, fmt: str, rows: int, cols: int):
    """(codes uint8 [N, R·cb], scales fp16 [N, R]) views of one matrix in plane layout."""
    _blocks(planes, fmt, rows, cols)
    n_codes = rows * (cols // 32) * PLANE_FORMATS[fmt]
    codes = planes[:n_codes].view(rows, -1)
    scales = planes[n_codes:].view(torch.float16).view(rows, cols // 32)
    return codes, scales


def dequantize_planes(planes: torch.Tensor, fmt: str, rows: int, cols: int) -> torch.Tensor:
    """fp32 [N, K] of one matrix in plane layout, in torch: the products ggml's decoder forms
    (Q8_0 q·d, Q4_0 d·(q - 8); strata.formats.legacy), so equal to it bit for bit. Q4_0's codes
    are weight pairs (low nibble the even weight)."""
    codes, scales = split_planes(planes, fmt, rows, cols)
    d = scales.float().reshape(rows, cols // 32, 1)                           # [N, R, 1]
    if fmt == "Q8_0":
        q = codes.view(torch.int8).to(torch.float32).reshape(rows, -1, 32)
        w = q * d
    else:
        b = codes.to(torch.int32)
        q = torch.stack([b & 0xF, b >> 4], dim=-1).reshape(rows, -1, 32) - 8  # weight order
        w = d * q.to(torch.float32)
    return w.reshape(rows, cols)


def relayout_blob_(blob: torch.Tensor, layout: BlobLayout, *, to: str = "planes") -> torch.Tensor:
    """Re-lay one expert blob (uint8 [>= layout.size], e.g. a cache slot) in place: every
    plane-format matrix to the plane layout (to="planes") or back to ggml's (to="ggml"). The
    other matrices and the bias slot are left as they are. One temporary of a matrix's size;
    no host sync (a device op on the blob's stream)."""
    if to not in ("planes", "ggml"):
        raise StrataError(f"to must be 'planes' or 'ggml', got {to!r}")
    fn = to_planes if to == "planes" else to_ggml
    for m, p in zip(layout.matrices, plane_layout(layout).matrices):
        if p is not None:
            view = blob[m.offset:m.offset + m.nbytes]
            view.copy_(fn(view, p.fmt, p.rows, p.cols))
    return blob


@dataclass
class PlaneSet:
    """A layer's experts with their plane-format matrices in the plane layout: ExpertSet's
    fields (the same BlobLayout: offsets and sizes are unchanged), a different type so a kernel
    of one arrangement is never handed the other."""
    arena: torch.Tensor        # uint8 [nbytes]
    slot_offset: torch.Tensor  # int64 [E]: byte offset of expert e's blob, -1 = absent
    layout: BlobLayout

    @property
    def planes(self) -> PlaneLayout:
        return plane_layout(self.layout)

    @property
    def n_expert(self) -> int:
        return int(self.slot_offset.numel())

    @property
    def device(self) -> torch.device:
        return self.arena.device


def _resident(slot_offset: torch.Tensor) -> list[int]:
    return [o for o in slot_offset.tolist() if o >= 0]


def to_plane_set(experts: ExpertSet) -> PlaneSet:
    """A copy of `experts` with every resident blob re-laid to planes (one host read of the slot
    table: for tests, benchmarks and set-up, not the hot path)."""
    arena = experts.arena.clone()
    for off in _resident(experts.slot_offset):
        relayout_blob_(arena[off:off + experts.layout.size], experts.layout, to="planes")
    return PlaneSet(arena, experts.slot_offset.clone(), experts.layout)


def to_expert_set(planes: PlaneSet) -> ExpertSet:
    """The inverse of `to_plane_set`: a copy with every resident blob back in ggml's layout."""
    arena = planes.arena.clone()
    for off in _resident(planes.slot_offset):
        relayout_blob_(arena[off:off + planes.layout.size], planes.layout, to="ggml")
    return ExpertSet(arena, planes.slot_offset.clone(), planes.layout)


def plane_matrix(planes: PlaneSet, e: int, name: str) -> torch.Tensor:
    """Expert e's matrix `name` ("gate" | "up" | "down") as fp32 [rows, cols], decoded from its
    planes in torch (a matrix of another format decoded as strata.kernels.moe does)."""
    off = int(planes.slot_offset[e])
    if off < 0:
        raise StrataError(f"expert {e} is not resident (slot_offset = -1); load it first")
    mat = getattr(planes.layout, name)
    p = getattr(planes.planes, name)
    if p is None:
        from strata.kernels.moe import dequantize_matrix
        return dequantize_matrix(planes, e, name)
    raw = planes.arena[off + mat.offset: off + mat.offset + mat.nbytes]
    return dequantize_planes(raw, p.fmt, p.rows, p.cols)


class Landing:
    """What the engine runs on each blob that lands in a device slot when its experts run
    through the plane GEMM (EngineConfig ffn="plane"): re-lay the blob to planes, on the stream
    that copied it, after the copy (the cache's fill and refill, the ring's copy lane). `sets`
    is the type a provider hands the expert FFN for such an arena (PlaneSet)."""
    sets = PlaneSet

    def __init__(self, layouts, formats):
        """layouts: the model's BlobLayout per layer (None: a layer without routed experts);
        formats: the formats the plane GEMM reads. A StrataError names a layer it cannot run."""
        for layer, lay in enumerate(layouts):
            if lay is None:
                continue
            bad = [f"{m.name} {m.fmt.name}" for m, p in zip(lay.matrices,
                                                             plane_layout(lay).matrices)
                   if p is None or p.fmt not in formats]
            if bad:
                raise StrataError(f"the plane expert FFN reads {', '.join(formats)} experts; "
                                  f"layer {layer} has {', '.join(bad)}: choose another expert "
                                  f"FFN (kernel, auto) for this pack")
        self.layouts = list(layouts)

    def __call__(self, blob: torch.Tensor, layer: int) -> None:
        relayout_blob_(blob, self.layouts[layer])
