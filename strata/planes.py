"""The plane layout of an expert blob: each Q8_0 / Q4_0 / Q4_K matrix's codes and scales apart.

Legend: N rows (output features), K inputs (a multiple of the format's block: 32, Q4_K 256),
B = K / block blocks per row, cb code bytes per block (Q8_0 32, Q4_0 16, Q4_K 128), sb scale
bytes per block (Q8_0 / Q4_0 2: the fp16 d; Q4_K 16: d, dmin and the 6-bit scales and mins), E
experts.

ggml stores such a matrix as N·B blocks of (sb scale bytes, cb code bytes) back to back: 34 bytes
(Q8_0), 18 (Q4_0) or 144 (Q4_K), so the scales interleave with the codes and (but for Q4_K) no
code run starts 16-byte aligned; a kernel cannot load the codes as one plain tile. The plane
layout keeps the matrix in the same bytes of the blob (same offset, same `nbytes`), rearranged:

    [offset, offset + N·B·cb)              codes  [N, B·cb] uint8, row-major (row stride B·cb)
    [offset + N·B·cb, offset + nbytes)     scales [N, B·sb] uint8, row-major (row stride B·sb):
                                           Q8_0 / Q4_0 one fp16 d a block, Q4_K 16 bytes a
                                           super-block (below)

Q8_0's code bytes are its int8 q, each 16-weight group's in the order the GEMM's tensor cores take
them (Q8_ORDER): byte 4i + 2h + p of a group holds weight 8h + 2i + p (i = 0..3, h, p = 0..1). A
Hopper wgmma's register operand gives lane i of each quad the weights 2i, 2i+1, 2i+8, 2i+9 of every
16-wide k slice; in weight order those are two 2-byte runs (16-bit shared loads, 32 a 64x64 step of
a 128-thread program), in this order one 4-byte run (ldmatrix: 4). Q4_0's and Q4_K's codes are
re-paired: weight pair p (weights 2p, 2p+1) is one byte, the even weight in its low nibble (ggml's
Q4_0 block puts weight i < 16 in the low nibble of qs[i] and i >= 16 in the high nibble of
qs[i - 16]; Q4_K's super-block puts weight 64g + i, i < 32, in the low nibble of qs[32g + i] and
64g + 32 + i in its high nibble), so a kernel unpacks a code into two weights with a mask and a
shift, no shuffle. The pairs of each 16-byte group (32 weights) sit in Q4_ORDER: byte 4i + 2s + h
holds pair 8s + 4h + i (i = 0..3, s, h = 0..1). The wgmma register operand gives lane i of a quad
the pairs i and i+4 of every 16-wide k slice (pairs 8s + i, 8s + 4 + i of a group): in this order
its four are one 4-byte run (one 32-bit shared load, and the nibbles of four pairs formed by word
operations), where pair order took a byte load a pair.

A Q4_K super-block's 16 scale bytes, re-packed so that sub-block s (weights 32s .. 32s+31 of the
super-block) reads its 6-bit scale sc[s] and min m[s] from two fixed bytes with no select:

    bytes 0-1   d (fp16), bytes 2-3 dmin (fp16)        ggml's own
    byte 4 + s  sc[s] in bits 0-5, bits 4-5 of m[s] in bits 6-7          (s = 0..7)
    byte 12 + j the low 4 bits of m[2j] in bits 0-3, of m[2j+1] in bits 4-7   (j = 0..3)

(ggml's 12 bytes, get_scale_min_k4: bytes 0-3 sc[s] for s < 4 with the top 2 bits of sc[s+4],
bytes 4-7 the same for the mins, bytes 8-11 the low nibbles of sc[s+4] and m[s+4].) Both
packings use all 96 bits of the 12 bytes, so the re-pack is a bijection on any bytes. A 64-weight
reduction step (sub-blocks 2j, 2j+1) reads bytes 4+2j, 5+2j and 12+j.

Since blob matrices start 256-byte aligned (strata.blob) and K is whole blocks, every code row
starts 16-byte aligned (B·cb is a multiple of 16) and the scale plane starts 16-byte aligned
(N·B·cb is); Q4_K's scale rows (16 bytes a super-block) are 16-byte aligned too. Matrices in other
formats and the bias slot are not touched, so the blob's size, and with it `max_blob` (the ring's
unit) and every count made from the BlobLayout, stay what they are.

The relayout is a permutation of bytes (of nibbles for the 4-bit codes, of bit fields for Q4_K's
scales), so it is exactly invertible and every decoded value is the ggml decoder's bit for bit
(`dequantize_planes` forms the same fp32 products as strata.formats.dequantize). `to_planes` /
`to_ggml` are plain torch ops on any device (the engine can run them on the GPU on a cache slot
after its copy lands).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from strata.blob import BlobLayout, MatrixSlot
from strata.errors import StrataError
from strata.experts import ExpertSet
from strata.formats.kquants import q4_k_scale_min

@dataclass(frozen=True)
class PlaneFormat:
    """A format's block as the plane layout splits it: `scale_bytes` of scales first (ggml's
    order in each of these formats), then `code_bytes` of codes, for `block` weights."""
    block: int
    code_bytes: int
    scale_bytes: int

    @property
    def block_bytes(self) -> int:
        return self.code_bytes + self.scale_bytes


# the formats with a plane layout (module docstring)
PLANE_FORMATS = {"Q8_0": PlaneFormat(32, 32, 2), "Q4_0": PlaneFormat(32, 16, 2),
                 "Q4_K": PlaneFormat(256, 128, 16)}
PLANE_ALIGN = 16   # what a code row and the scale plane start aligned to (cp.async / TMA)


@dataclass(frozen=True)
class MatrixPlanes:
    """Where one matrix's planes sit, in bytes from the blob's start."""
    name: str
    fmt: str             # "Q8_0" | "Q4_0" | "Q4_K"
    rows: int            # N
    cols: int            # K
    codes_offset: int    # = the MatrixSlot's offset (256-aligned)
    codes_row_bytes: int  # B·cb
    scales_offset: int   # codes_offset + N·B·cb (16-aligned)
    scales_row_bytes: int  # B·sb: a row's scale bytes (Q8_0 / Q4_0 B fp16, Q4_K 16 a block)

    @property
    def nbytes(self) -> int:
        return self.rows * (self.codes_row_bytes + self.scales_row_bytes)


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
    pf = PLANE_FORMATS.get(m.fmt.name)
    if pf is None:
        return None
    b = m.cols // pf.block
    p = MatrixPlanes(m.name, m.fmt.name, m.rows, m.cols, m.offset, b * pf.code_bytes,
                     m.offset + m.rows * b * pf.code_bytes, b * pf.scale_bytes)
    assert p.nbytes == m.nbytes and p.codes_offset % PLANE_ALIGN == 0
    assert p.codes_row_bytes % PLANE_ALIGN == 0 and p.scales_offset % PLANE_ALIGN == 0
    return p


@lru_cache(maxsize=64)
def plane_layout(layout: BlobLayout) -> PlaneLayout:
    """Where each matrix's planes sit in a blob of `layout` (offsets and size unchanged)."""
    return PlaneLayout(layout, *(matrix_planes(m) for m in layout.matrices))


def _format(fmt: str) -> PlaneFormat:
    pf = PLANE_FORMATS.get(fmt)
    if pf is None:
        raise StrataError(f"{fmt} has no plane layout; it is defined for "
                          f"{', '.join(PLANE_FORMATS)}")
    return pf


def _blocks(raw: torch.Tensor, fmt: str, rows: int, cols: int) -> torch.Tensor:
    pf = _format(fmt)
    n = rows * cols // pf.block * pf.block_bytes
    if cols % pf.block or raw.dtype != torch.uint8 or raw.shape[-1] != n:
        raise StrataError(f"a {fmt} [{rows}, {cols}] matrix is {n} uint8 bytes with cols a "
                          f"multiple of {pf.block}; got {raw.dtype} {tuple(raw.shape)}")
    return raw.reshape(*raw.shape[:-1], rows, cols // pf.block, pf.block_bytes)  # [..., N, B, bb]


# Q8_0: byte j of a 16-weight group holds weight Q8_ORDER[j]; Q8_WEIGHTS inverts it
Q8_ORDER = tuple(8 * h + 2 * i + p for i in range(4) for h in range(2) for p in range(2))
Q8_WEIGHTS = tuple(sorted(range(16), key=Q8_ORDER.__getitem__))
# Q4_0 / Q4_K: byte j of a 16-byte group (32 weights) holds weight pair Q4_ORDER[j] (the pair p:
# weights 2p, 2p + 1)
Q4_ORDER = tuple(8 * s + 4 * h + i for i in range(4) for s in range(2) for h in range(2))


def _q8_order(q: torch.Tensor, back: bool = False) -> torch.Tensor:
    """Q8_0 codes [..., 16n], each 16-byte group from weight order to Q8_ORDER (back: from
    Q8_ORDER to weight order, i.e. gathered by Q8_WEIGHTS). Either is a swap of two axes of
    [2, 4, 2] (h, i, p <-> i, h, p): a view and a copy, no index tensor (whose upload would sync
    the engine's stream)."""
    g = q.reshape(*q.shape[:-1], -1, *((4, 2, 2) if back else (2, 4, 2)))
    return g.transpose(-3, -2).reshape(q.shape)


def _q4_order(pairs: torch.Tensor, back: bool = False) -> torch.Tensor:
    """4-bit code bytes [..., 16n], each 16-byte group from pair order (byte p the weights 2p,
    2p + 1) to Q4_ORDER (back: the inverse). Pair 8s + 4h + i moves to byte 4i + 2s + h: an axis
    move of [2, 2, 4] (s, h, i <-> i, s, h), no index tensor."""
    g = pairs.reshape(*pairs.shape[:-1], -1, *((4, 2, 2) if back else (2, 2, 4)))
    return (g.movedim(-3, -1) if back else g.movedim(-1, -3)).reshape(pairs.shape)


def _q4_act_order(q: torch.Tensor, back: bool = False) -> torch.Tensor:
    """q8_1 codes [..., 32n] to the order a plane-layout 4-bit block's codes unpack in (back: to
    weight order), 32-block by 32-block. A kernel puts nibble t (0 low, 1 high) of code byte j
    of a block (Q4_ORDER) at place 16t + j, so the four bytes 4i .. 4i + 3 give places 4i ..
    4i + 3 and 16 + 4i .. 16 + 4i + 3 (the k of lane i of a quad in an int8 wgmma's register
    operand): place 16t + 4i + 2s + h holds weight 16s + 8h + 2i + t (pair Q4_ORDER[j] =
    8s + 4h + i): an axis permutation of [2, 2, 4, 2] (s, h, i, t <-> t, i, s, h), no index
    tensor."""
    lead = q.dim()
    g = q.reshape(*q.shape[:-1], -1, *((2, 4, 2, 2) if back else (2, 2, 4, 2)))
    axes = (2, 3, 1, 0) if back else (3, 2, 0, 1)
    return g.permute(*range(lead), *(lead + a for a in axes)).reshape(q.shape)


def act_order(q: torch.Tensor, fmt: str, back: bool = False) -> torch.Tensor:
    """Activation codes [..., 32n] from weight order to the order of `fmt`'s plane codes (Q8_0:
    Q8_ORDER, Q4_0 and Q4_K: _q4_act_order), so an integer dot of the two is the dot in weight
    order (back: the inverse)."""
    return _q8_order(q, back) if fmt == "Q8_0" else _q4_act_order(q, back)


def _pairs_of_weights(q: torch.Tensor) -> torch.Tensor:
    """4-bit codes [..., 2n] in weight order -> [..., n] bytes (low nibble the even weight)."""
    return q[..., 0::2] | (q[..., 1::2] << 4)


def _weights_of_pairs(pairs: torch.Tensor) -> torch.Tensor:
    """The inverse of _pairs_of_weights."""
    return torch.stack([pairs & 0xF, pairs >> 4], dim=-1).flatten(-2)


def _weights_of_ggml(qs: torch.Tensor, fmt: str) -> torch.Tensor:
    """A 4-bit block's qs [..., cb] (ggml's nibble order) -> its codes [..., 2·cb] in weight
    order: Q4_0 the low nibbles of qs[0..15] then the high; Q4_K the same within each 64-weight
    group of 32 bytes."""
    if fmt == "Q4_0":
        return torch.cat([qs & 0xF, qs >> 4], dim=-1)
    g = qs.reshape(*qs.shape[:-1], 4, 32)
    return torch.cat([g & 0xF, g >> 4], dim=-1).flatten(-2)


def _ggml_of_weights(q: torch.Tensor, fmt: str) -> torch.Tensor:
    """The inverse of _weights_of_ggml."""
    if fmt == "Q4_0":
        return q[..., :16] | (q[..., 16:] << 4)
    g = q.reshape(*q.shape[:-1], 4, 64)
    return (g[..., :32] | (g[..., 32:] << 4)).flatten(-2)


def _k_scales_of_ggml(s: torch.Tensor) -> torch.Tensor:
    """Q4_K's 12 scale bytes [..., 12], ggml's packing -> the plane's (module docstring)."""
    sc, mn = q4_k_scale_min(s.reshape(-1, 12))                        # [n, 8] each, 6-bit
    by = sc | ((mn >> 4) << 6)                                         # [n, 8]
    lo = mn & 0xF
    nib = lo[:, 0::2] | (lo[:, 1::2] << 4)                             # [n, 4]
    return torch.cat([by, nib], dim=-1).to(torch.uint8).reshape(s.shape)


def _k_sc_min(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The plane's 12 Q4_K scale bytes [..., 12] -> int32 (sc, m) [..., 8] each."""
    s = s.to(torch.int32)
    by, nib = s[..., :8], s[..., 8:]
    lo = torch.stack([nib & 0xF, nib >> 4], dim=-1).flatten(-2)        # [..., 8]
    return by & 63, ((by >> 6) << 4) | lo


def _ggml_of_k_scales(s: torch.Tensor) -> torch.Tensor:
    """The inverse of _k_scales_of_ggml."""
    sc, mn = _k_sc_min(s)
    lo4, hi4 = slice(0, 4), slice(4, 8)
    b0 = (sc[..., lo4] & 63) | ((sc[..., hi4] >> 4) << 6)
    b1 = (mn[..., lo4] & 63) | ((mn[..., hi4] >> 4) << 6)
    b2 = (sc[..., hi4] & 0xF) | ((mn[..., hi4] & 0xF) << 4)
    return torch.cat([b0, b1, b2], dim=-1).to(torch.uint8)


def to_planes(raw: torch.Tensor, fmt: str, rows: int, cols: int) -> torch.Tensor:
    """ggml blocks -> plane layout: uint8 [..., nbytes] -> a new uint8 [..., nbytes] (leading
    dims: several matrices at once). Codes [N, B·cb], then scales [N, B·sb]."""
    b = _blocks(raw, fmt, rows, cols)
    lead = b.shape[:-3]
    sb = PLANE_FORMATS[fmt].scale_bytes
    qs, sc = b[..., sb:], b[..., :sb]
    if fmt == "Q8_0":
        qs = _q8_order(qs)
    else:
        qs = _q4_order(_pairs_of_weights(_weights_of_ggml(qs, fmt)))
    if fmt == "Q4_K":
        sc = torch.cat([sc[..., :4], _k_scales_of_ggml(sc[..., 4:])], dim=-1)
    return torch.cat([qs.reshape(*lead, -1), sc.reshape(*lead, -1)], dim=-1)


def to_ggml(planes: torch.Tensor, fmt: str, rows: int, cols: int) -> torch.Tensor:
    """The inverse of `to_planes`: plane layout -> ggml blocks, uint8 [..., nbytes]."""
    _blocks(planes, fmt, rows, cols)      # validates
    pf = PLANE_FORMATS[fmt]
    nb = cols // pf.block
    lead = planes.shape[:-1]
    n_codes = rows * nb * pf.code_bytes
    codes = planes[..., :n_codes].reshape(*lead, rows, nb, pf.code_bytes)
    if fmt == "Q8_0":
        codes = _q8_order(codes, back=True)
    else:
        codes = _ggml_of_weights(_weights_of_pairs(_q4_order(codes, back=True)), fmt)
    scales = planes[..., n_codes:].reshape(*lead, rows, nb, pf.scale_bytes)
    if fmt == "Q4_K":
        scales = torch.cat([scales[..., :4], _ggml_of_k_scales(scales[..., 4:])], dim=-1)
    return torch.cat([scales, codes], dim=-1).reshape(*lead, -1)


def split_planes(planes: torch.Tensor, fmt: str, rows: int, cols: int):
    """(codes uint8 [N, B·cb], scales) views of one matrix in plane layout: scales fp16 [N, B]
    (Q8_0 / Q4_0) or uint8 [N, B, 16] (Q4_K's super-block entries)."""
    _blocks(planes, fmt, rows, cols)
    pf = PLANE_FORMATS[fmt]
    nb = cols // pf.block
    n_codes = rows * nb * pf.code_bytes
    codes = planes[:n_codes].view(rows, -1)
    if fmt == "Q4_K":
        return codes, planes[n_codes:].view(rows, nb, pf.scale_bytes)
    return codes, planes[n_codes:].view(torch.float16).view(rows, nb)


def dequantize_planes(planes: torch.Tensor, fmt: str, rows: int, cols: int) -> torch.Tensor:
    """fp32 [N, K] of one matrix in plane layout, in torch: the products ggml's decoder forms
    (Q8_0 q·d, Q4_0 d·(q - 8), Q4_K (d·sc)·q - dmin·m; strata.formats.legacy / kquants), so
    equal to it bit for bit. Q8_0's codes are in Q8_ORDER, 4-bit codes weight pairs (low nibble
    the even weight) in Q4_ORDER."""
    codes, scales = split_planes(planes, fmt, rows, cols)
    if fmt == "Q8_0":
        d = scales.float().reshape(rows, cols // 32, 1)                       # [N, R, 1]
        q = _q8_order(codes, back=True).view(torch.int8).to(torch.float32).reshape(rows, -1, 32)
        return (q * d).reshape(rows, cols)
    q = _weights_of_pairs(_q4_order(codes, back=True).to(torch.int32)).reshape(rows, -1, 32)
    if fmt == "Q4_0":
        d = scales.float().reshape(rows, cols // 32, 1)
        return (d * (q - 8).to(torch.float32)).reshape(rows, cols)
    nb = cols // 256
    d = scales[..., 0:2].contiguous().view(torch.float16).float()             # [N, nb, 1]
    dmin = scales[..., 2:4].contiguous().view(torch.float16).float()
    sc, mn = _k_sc_min(scales[..., 4:])                                        # [N, nb, 8]
    dsc = (d * sc.to(torch.float32)).reshape(rows, nb * 8, 1)                  # [N, R, 1]
    dm = (dmin * mn.to(torch.float32)).reshape(rows, nb * 8, 1)
    return (dsc * q.to(torch.float32) - dm).reshape(rows, cols)


def relayout_blob_(blob: torch.Tensor, layout: BlobLayout, *, to: str = "planes") -> torch.Tensor:
    """Re-lay one expert blob (uint8 [>= layout.size], e.g. a cache slot) in place: every
    plane-format matrix to the plane layout (to="planes") or back to ggml's (to="ggml"). The
    other matrices and the bias slot are left as they are. Temporaries of up to about twice a
    matrix's size (4-bit codes pass through weight order, a byte each); no host sync (device
    ops on the blob's stream)."""
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


class Landing:
    """What the engine runs on each blob that lands in a device slot when its experts run
    through the plane GEMM (EngineConfig ffn="plane"): re-lay the blob to planes, on the stream
    that copied it, after the copy (the cache's fill and refill, the ring's copy lane). `sets`
    is the type a provider hands the expert FFN for such an arena (PlaneSet)."""
    sets = PlaneSet

    def __init__(self, layouts, formats, keep=None):
        """layouts: the model's BlobLayout per layer (None: a layer without routed experts);
        formats: the formats the plane GEMM reads; keep: {matrix name: formats} it reads in
        ggml's layout (left as they are). A StrataError names a layer it cannot run."""
        for layer, lay in enumerate(layouts):
            if lay is None:
                continue
            bad = _unread(lay, formats, keep)
            if bad:
                raise StrataError(f"the plane expert FFN reads {', '.join(formats)} experts"
                                  f"{_kept(keep)}; layer {layer} has {', '.join(bad)}: choose "
                                  f"another expert FFN (kernel, auto) for this pack")
        self.layouts = list(layouts)

    def __call__(self, blob: torch.Tensor, layer: int) -> None:
        relayout_blob_(blob, self.layouts[layer])


def _unread(layout: BlobLayout, formats, keep=None) -> list[str]:
    """'name FMT' of each matrix of `layout` a reader of `formats` planes (and of `keep`'s
    {name: formats} in ggml's layout) cannot read."""
    keep = keep or {}
    return [f"{m.name} {m.fmt.name}" for m, p in zip(layout.matrices,
                                                     plane_layout(layout).matrices)
            if not (p is not None and p.fmt in formats
                    or p is None and m.fmt.name in keep.get(m.name, ()))]


def _kept(keep) -> str:
    """' (down also Q6_K in ggml's layout)' for keep = {"down": ("Q6_K",)}; '' for none."""
    said = [f"{name} also {', '.join(f)}" for name, f in (keep or {}).items()]
    return f" ({'; '.join(said)} in ggml's layout)" if said else ""


def check_plane_set(experts, formats, what: str, otherwise: str, keep=None) -> None:
    """One line when `experts` is not a PlaneSet whose every matrix is in `formats` (its
    plane layout) or, by `keep` ({matrix name: formats}), in one the reader takes in ggml's
    layout: `what` names the reader, `otherwise` the path that reads the others."""
    if not isinstance(experts, PlaneSet):
        raise StrataError(f"{what} reads a PlaneSet (blobs in the plane layout), got "
                          f"{type(experts).__name__}; re-lay it with strata.planes.to_plane_set")
    bad = _unread(experts.layout, formats, keep)
    if bad:
        raise StrataError(f"{what} reads {', '.join(formats)} matrices{_kept(keep)}; this "
                          f"layout has {', '.join(bad)}: run it through {otherwise}")
