"""The pack file: one safetensors container, memory-mapped on open, never pickle (written by
strata.packs.writer).

Layout (a valid safetensors file; `safetensors.safe_open` reads it too):
    8-byte little-endian header length N | JSON header (space-padded) | tensor data
Every tensor starts on a 4096-byte boundary of the file (filler tensors `__pad.<n>` close the gaps),
so a layer's experts can be copied/pinned page-aligned and bf16/fp32 views need no copy.

Tensors:
    blk.<i>.experts   uint8 [E, blob_size]  blob e at byte e*blob_size: gate, up, down (BlobLayout)
    <dense names>     bf16/f16/f32, names and shapes from strata.archs.names (llama.cpp's names);
                      or uint8 [R, row_bytes]: a matrix kept as its GGUF blocks (dense_blocks)
Metadata (`__metadata__["strata.pack"]`, JSON): pack_version, strata_version, shape
(ModelShape.to_dict()), layers [{layout: BlobLayout.to_dict(), blob_size}], max_blob, native,
tied (LM head = token_embd), source, crc32 {tensor: hex} (checked by Pack.verify()); version 3:
dense_blocks {name: {fmt, shape [R, C]}} for the matrices kept as blocks (strata.packs.qdense:
read decoded, fp32, by `dense`; as blocks by `dense_stored`).
`__metadata__["strata.tokenizer"]` (optional, JSON): the source's tokenizer as strata.tokenize
stores it ({json: tokenizer.json text, add_bos, source}); covered by the header checksum.
`__metadata__["strata.header_crc32"]`: CRC32 of the whole header (every tensor entry and the
metadata above) in canonical JSON without this key; checked on every open.

Checks and their cost: opening a pack always checks the header checksum (one CRC32 over a few KB
of JSON: microseconds) and the tensor table; it also checks every tensor's CRC32 when the pack's
data is at most VERIFY_ON_OPEN bytes. Measured on the 2-core CI machine (shared, loaded): zlib's
CRC32 runs at 1.8 GB/s on one large buffer, a whole 9.5 MB pack verifies in ~35 ms against
~5 ms for the open without it (~0.3 GB/s with the per-tensor overhead and the load), so 64 MiB
costs 0.04-0.2 s. Larger packs are checked in full by `strata verify PACK` or
`strata prefill --verify` (a 32 GB pack: ~18 s at 1.8 GB/s), or `Pack.open(path, verify=True)`.
Version 1 packs (no header checksum) are refused with the advice to re-pack.
"""
from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from strata import filekind
from strata.blob import BlobLayout
from strata.errors import StrataError
from strata.experts import ExpertSet
from strata.archs.names import check_dense, experts_name
from strata.packs.qdense import QuantDense, as_float
from strata.shapes import ModelShape

PACK_VERSION = 3       # 3: dense matrices may be kept as GGUF blocks (dense_blocks)
PACK_READS = (2, 3)    # 2: the header checksum, every dense tensor a float; 1 is refused (re-pack)
META_KEY = "strata.pack"
DENSE_BLOCKS_KEY = "dense_blocks"
TOKENIZER_KEY = "strata.tokenizer"
HEADER_CRC_KEY = "strata.header_crc32"
VERIFY_ON_OPEN = 64 << 20    # packs with at most this many data bytes are fully checked on open
FILE_ALIGN = 4096
MAX_HEADER = filekind.MAX_HEADER  # a header beyond this is corruption (the read-ahead's too)

_DTYPES = {"U8": (torch.uint8, 1), "BF16": (torch.bfloat16, 2), "F16": (torch.float16, 2),
           "F32": (torch.float32, 4)}
_TORCH_TO_ST = {v[0]: k for k, v in _DTYPES.items()}
_NP_TO_ST = {np.dtype(np.uint8): "U8", np.dtype(np.float16): "F16", np.dtype(np.float32): "F32"}


@dataclass(frozen=True)
class PackLayer:
    layout: BlobLayout | None   # None: a layer without routed experts (a leading dense layer)
    blob_size: int  # == layout.size (0 without experts); a layer's cache slot size

    @classmethod
    def dense(cls) -> "PackLayer":
        return cls(None, 0)


def check_shape(s: ModelShape, where) -> None:
    """A shape a model can have (positive sizes, K <= E, whole GQA groups); one line naming the
    field otherwise. Readers call it on what a file's metadata says."""
    ints = ("n_layer", "d_model", "n_expert", "top_k", "d_expert", "n_head", "n_kv_head",
            "head_dim", "vocab", "max_pos")
    for k in ints:
        v = getattr(s, k)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise StrataError(f"{where}: {k} is {v!r}; it must be a whole number >= 1")
    if s.top_k > s.n_expert:
        raise StrataError(f"{where}: top_k {s.top_k} is more than the {s.n_expert} experts")
    if s.n_head % s.n_kv_head:
        raise StrataError(f"{where}: {s.n_head} query heads are not whole groups of "
                          f"{s.n_kv_head} kv heads")
    for k in ("rope_theta", "rms_eps"):
        v = getattr(s, k)
        if not isinstance(v, (int, float)) or not 0 < v < float("inf"):
            raise StrataError(f"{where}: {k} is {v!r}; it must be a positive number")
    check_family(s, where)


def check_family(s: ModelShape, where) -> None:
    """The option groups (strata.shapes): at least one MoE layer, a dense width for the dense
    ones, whole expert groups, an MLA head wider than its rope part, a partial RoPE inside the
    head. The header's names (ModelShape.to_dict) name the field."""
    d, r, m = s.dense, s.router, s.mla
    if not 0 <= d.lead < s.n_layer:
        raise StrataError(f"{where}: n_dense_lead {d.lead} must leave at least one of "
                          f"the {s.n_layer} layers routed")
    if d.lead and d.d_ff < 1:
        raise StrataError(f"{where}: {d.lead} dense layers need d_ff >= 1")
    if r.kind not in ("softmax", "sigmoid"):
        raise StrataError(f"{where}: router {r.kind!r}; strata routes softmax or sigmoid")
    if r.n_group < 1 or s.n_expert % r.n_group or not 1 <= r.topk_group <= r.n_group:
        raise StrataError(f"{where}: {s.n_expert} experts in {r.n_group} groups, "
                          f"{r.topk_group} kept: groups must be whole and 1 <= kept <= groups")
    if r.n_group > 1 and s.top_k > r.topk_group * (s.n_expert // r.n_group):
        raise StrataError(f"{where}: top_k {s.top_k} is more than the {r.topk_group} kept "
                          f"groups hold")
    if m and not (m.kv_lora > 0 and 0 < m.qk_rope < s.head_dim and m.v_head_dim > 0
                  and s.n_kv_head == s.n_head and m.qk_rope % 2 == 0):
        raise StrataError(f"{where}: MLA needs kv_lora > 0, 0 < qk_rope (even) < head_dim, "
                          f"v_head_dim > 0 and n_kv_head == n_head")
    rd = s.attn.rope_dim
    if rd and (rd > s.head_dim or rd % 2):
        raise StrataError(f"{where}: rope_dim {rd} must be even and at most head_dim")


def header_crc(header: dict) -> str:
    """CRC32 (8 hex digits) of a header in canonical JSON, its own checksum key left out."""
    h = dict(header)
    md = dict(h.get("__metadata__") or {})
    md.pop(HEADER_CRC_KEY, None)
    h["__metadata__"] = md
    canon = json.dumps(h, sort_keys=True, separators=(",", ":")).encode()
    return f"{zlib.crc32(canon) & 0xFFFFFFFF:08x}"


def sign_header(header: dict) -> dict:
    """The header with its checksum set (`__metadata__[HEADER_CRC_KEY]`)."""
    h = dict(header)
    h["__metadata__"] = dict(h.get("__metadata__") or {})
    h["__metadata__"][HEADER_CRC_KEY] = header_crc(h)
    return h


class Pack:
    """A pack opened by memory-mapping. Tensors are zero-copy CPU views of the map.

    .shape ModelShape · .layers[i].layout / .blob_size · .max_blob · .native · .tied · .source
    .experts(i) -> uint8 [E, blob_size] · .expert_set(i) -> ExpertSet · .dense(name) · .dense_names()
    .dense_stored(name): as stored (a matrix kept as GGUF blocks: a QuantDense)
    .tokenizer: the source's tokenizer entry (strata.tokenize) or None
    """

    def __init__(self, path: Path, header: dict, meta: dict, buf: torch.Tensor, data_start: int):
        self.path = path
        self._header = header
        self.meta = meta
        self._buf = buf
        self._data_start = data_start
        self.shape = ModelShape.from_dict(meta["shape"])
        self.layers = [PackLayer(BlobLayout.from_dict(l["layout"]) if l["layout"] is not None
                                 else None, int(l["blob_size"]))
                       for l in meta["layers"]]
        self.max_blob = int(meta["max_blob"])
        self.native = bool(meta["native"])
        self.tied = bool(meta["tied"])
        self.source = meta.get("source", "")

    # -- opening and validation ------------------------------------------------------------
    @classmethod
    def open(cls, path, verify: bool | None = None) -> "Pack":
        """Open and validate a pack (the header checksum always). `verify`: True checks every
        tensor's CRC32 (reads it all), False none, None (default) every one when the pack's data
        is at most VERIFY_ON_OPEN bytes."""
        path = Path(path)
        if path.is_dir():
            raise StrataError(filekind.not_a(path, filekind.PACK))
        if not path.is_file():
            raise StrataError(f"no pack at {path}")
        other = filekind.not_a(path, filekind.PACK)
        if other:
            raise StrataError(other)
        size = path.stat().st_size
        bad = f"{path} is not a readable strata pack"
        if size < 8:
            raise StrataError(f"{bad}: {size} bytes is shorter than a safetensors header")
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > MAX_HEADER or 8 + n > size:
                raise StrataError(f"{bad}: header length {n} does not fit a {size}-byte file "
                                  f"(truncated or corrupted); re-create it with strata pack")
            raw = f.read(n)
        try:
            header = json.loads(raw)
            meta = json.loads(header.get("__metadata__", {}).get(META_KEY, "null"))
        except (ValueError, UnicodeDecodeError, AttributeError) as e:
            raise StrataError(f"{bad}: its header is not valid JSON ({e}); the file is corrupted") from None
        if not isinstance(header, dict) or not isinstance(meta, dict):
            raise StrataError(f"{bad}: a safetensors file without strata pack metadata "
                              f"(make one with `strata pack`)")
        written = header["__metadata__"].get(HEADER_CRC_KEY)
        if written is None and meta.get("pack_version") == 1:
            raise StrataError(f"{bad}: pack version 1 has no header checksum, this strata reads "
                              f"version {PACK_VERSION}; re-create it with `strata pack SOURCE -o "
                              f"{path.name}` (or `strata synth ... --pack`)")
        got = header_crc(header)
        if written != got:
            raise StrataError(f"{bad}: its header fails its checksum (crc32 {got}, written "
                              f"{written}): the metadata was edited or corrupted; re-create it "
                              f"with strata pack")
        header = dict(header)
        header["__metadata__"] = {k: v for k, v in header["__metadata__"].items()
                                  if k != HEADER_CRC_KEY}
        if meta.get("pack_version") not in PACK_READS:
            raise StrataError(f"{bad}: pack version {meta.get('pack_version')!r}, this strata reads "
                              f"versions {', '.join(map(str, PACK_READS))}; re-create it with this "
                              f"strata's `strata pack`")
        data_start = 8 + n
        cls._check_tensors(path, header, size - data_start)
        buf = torch.from_file(str(path), shared=False, size=size, dtype=torch.uint8)
        try:
            pack = cls(path, header, meta, buf, data_start)
        except (KeyError, TypeError, ValueError) as e:
            raise StrataError(f"{bad}: its metadata is incomplete or malformed ({e!r})") from None
        check_shape(pack.shape, path)
        pack._check_meta()
        if verify or (verify is None and size - data_start <= VERIFY_ON_OPEN):
            pack.verify()
        return pack

    @staticmethod
    def _check_tensors(path: Path, header: dict, data_len: int) -> None:
        spans = []
        for name, e in header.items():
            if name == "__metadata__":
                continue
            try:
                dt, shape, (a, b) = e["dtype"], e["shape"], e["data_offsets"]
                item = _DTYPES[dt][1]
            except (KeyError, TypeError, ValueError):
                raise StrataError(f"{path}: tensor {name} has a malformed header entry {e!r}") from None
            want = int(np.prod(shape, dtype=np.int64)) * item
            if b - a != want or a < 0:
                raise StrataError(f"{path}: tensor {name} spans {b - a} bytes but {dt} {shape} needs "
                                  f"{want}; the header is corrupted")
            spans.append((a, b, name))
        spans.sort()
        end = 0
        for a, b, name in spans:
            if a != end:
                raise StrataError(f"{path}: tensor {name} starts at {a}, expected {end} "
                                  f"(overlapping or missing data); the header is corrupted")
            end = b
        if end > data_len:
            raise StrataError(f"{path} is truncated: its tensors need {end} data bytes, the file "
                              f"has {data_len}; re-create it with strata pack")
        if end < data_len:
            raise StrataError(f"{path} has {data_len - end} bytes after its last tensor; corrupted")

    def _check_meta(self) -> None:
        s, where = self.shape, str(self.path)
        if len(self.layers) != s.n_layer:
            raise StrataError(f"{where}: metadata lists {len(self.layers)} layers, the shape has "
                              f"{s.n_layer}")
        for i, pl in enumerate(self.layers):
            if (pl.layout is None) == s.is_moe_layer(i):
                raise StrataError(f"{where}: layer {i} {'lacks' if pl.layout is None else 'has'} "
                                  f"expert blobs but the shape says it is "
                                  f"{'a MoE' if s.is_moe_layer(i) else 'a dense'} layer")
            if pl.layout is None:
                if experts_name(i) in self._header or pl.blob_size:
                    raise StrataError(f"{where}: dense layer {i} holds expert blobs")
                continue
            if pl.blob_size != pl.layout.size:
                raise StrataError(f"{where}: layer {i} blob size {pl.blob_size} disagrees with its "
                                  f"layout's {pl.layout.size}")
            if (pl.layout.d_model, pl.layout.d_expert) != (s.d_model, s.d_expert):
                raise StrataError(f"{where}: layer {i} layout is D={pl.layout.d_model}, "
                                  f"F={pl.layout.d_expert}; the shape says D={s.d_model}, F={s.d_expert}")
            e = self._header.get(experts_name(i))
            if e is None:
                raise StrataError(f"{where}: tensor {experts_name(i)} is missing")
            if e["dtype"] != "U8" or list(e["shape"]) != [s.n_expert, pl.blob_size]:
                raise StrataError(f"{where}: {experts_name(i)} is {e['dtype']} {e['shape']}, metadata "
                                  f"says U8 [{s.n_expert}, {pl.blob_size}]")
        mb = max(pl.blob_size for pl in self.layers if pl.layout is not None)
        if self.max_blob != mb:
            raise StrataError(f"{where}: max_blob {self.max_blob} disagrees with the largest layer "
                              f"blob {mb}")
        shapes = {n: tuple(e["shape"]) for n, e in self._header.items()
                  if n != "__metadata__" and not n.startswith("__pad.") and not n.endswith(".experts")}
        shapes.update(self._block_shapes(shapes))
        extra_exp = [n for n in self._header if n.endswith(".experts")
                     and n not in {experts_name(i) for i in s.moe_layers}]
        if extra_exp:
            raise StrataError(f"{where}: unexpected expert tensors {extra_exp[:3]}")
        check_dense(s, shapes, where)
        if self.tied != ("output.weight" not in shapes):
            raise StrataError(f"{where}: metadata says tied={self.tied} but output.weight is "
                              f"{'present' if 'output.weight' in shapes else 'absent'}")

    def _block_shapes(self, stored: dict) -> dict:
        """name -> [R, C] of each matrix kept as blocks (dense_blocks), each checked against its
        stored uint8 [R, row_bytes]: one line naming the tensor otherwise."""
        from strata.formats import get_format
        blocks, out = self.meta.get(DENSE_BLOCKS_KEY, {}), {}
        if not isinstance(blocks, dict):
            raise StrataError(f"{self.path}: its dense_blocks table is malformed; re-create it "
                              f"with strata pack")
        for name, b in blocks.items():
            try:
                f, (R, C) = get_format(b["fmt"]), (int(v) for v in b["shape"])
            except (StrataError, KeyError, TypeError, ValueError):
                raise StrataError(f"{self.path}: dense_blocks entry {name} is malformed ({b!r}); "
                                  f"re-create the pack with strata pack") from None
            e = self._header.get(name, {})
            if e.get("dtype") != "U8" or C % f.block or \
                    tuple(stored.get(name, ())) != (R, C // f.block * f.block_bytes):
                raise StrataError(f"{self.path}: {name} is {e.get('dtype')} {e.get('shape')}, "
                                  f"not the {f.name} blocks of a [{R}, {C}] matrix its metadata "
                                  f"names; the pack is corrupted")
            out[name] = (R, C)
        return out

    def verify(self, progress=None) -> int:
        """Check every tensor against the CRC32 written with it (reads the whole file); the
        bytes checked. `progress(nbytes)` after each tensor."""
        crcs = self.meta.get("crc32", {})
        if not isinstance(crcs, dict):
            raise StrataError(f"{self.path}: its checksum table is malformed; re-create it with "
                              f"strata pack")
        done = 0
        for name in self._names():
            want = crcs.get(name)
            raw = self._raw(name)
            got = f"{zlib.crc32(raw.numpy()) & 0xFFFFFFFF:08x}"
            if want != got:
                raise StrataError(f"{self.path}: tensor {name} fails its checksum (crc32 {got}, "
                                  f"written {want}); the file is corrupted: re-create it with "
                                  f"strata pack")
            done += raw.numel()
            if progress is not None:
                progress(raw.numel())
        return done

    # -- access ----------------------------------------------------------------------------
    @property
    def tokenizer(self) -> dict | None:
        """The tokenizer carried from the source ({json, add_bos, source}), or None."""
        raw = self._header["__metadata__"].get(TOKENIZER_KEY)
        if raw is None:
            return None
        try:
            entry = json.loads(raw)
        except ValueError:
            entry = None
        if not isinstance(entry, dict) or not isinstance(entry.get("json"), str):
            raise StrataError(f"{self.path}: its tokenizer entry is malformed; re-create it with "
                              f"strata pack")
        return entry

    def _names(self) -> list[str]:
        return [n for n in self._header if n != "__metadata__" and not n.startswith("__pad.")]

    def _raw(self, name: str) -> torch.Tensor:
        a, b = self._header[name]["data_offsets"]
        return self._buf[self._data_start + a:self._data_start + b]

    def experts(self, i: int) -> torch.Tensor:
        """Layer i's experts: uint8 [E, blob_size], blob e at row e (a view of the map)."""
        if not 0 <= i < self.shape.n_layer:
            raise StrataError(f"layer {i} out of range; the pack has {self.shape.n_layer} layers")
        if self.layers[i].layout is None:   # a dense layer: no experts
            return torch.empty(self.shape.n_expert, 0, dtype=torch.uint8)
        return self._raw(experts_name(i)).view(self.shape.n_expert, self.layers[i].blob_size)

    def expert_span(self, i: int) -> tuple[str, int, int] | None:
        """(file path, byte offset, bytes) of layer i's expert blobs in the pack file (None for
        a dense layer): what a loader reads with pread instead of faulting the map in."""
        if self.layers[i].layout is None:
            return None
        a, b = self._header[experts_name(i)]["data_offsets"]
        return str(self.path), self._data_start + a, b - a

    def expert_set(self, i: int) -> ExpertSet:
        """Layer i's experts as an ExpertSet over the map (CPU): slot_offset[e] = e * blob_size."""
        bs = self.layers[i].blob_size
        return ExpertSet(self.experts(i).reshape(-1),
                         torch.arange(self.shape.n_expert, dtype=torch.int64) * bs,
                         self.layers[i].layout)

    def dense_names(self) -> list[str]:
        return [n for n in self._names() if not n.endswith(".experts")]

    def dense(self, name: str) -> torch.Tensor:
        """A dense tensor (view of the map; its stored dtype; a matrix kept as blocks decoded,
        fp32). "output.weight" of a tied pack is the embeddings."""
        return as_float(self.dense_stored(name))

    def dense_stored(self, name: str):
        """A dense tensor as the pack holds it: a view of the map in its stored dtype, or a
        QuantDense over the map's blocks (strata.packs.qdense) for a matrix kept as blocks."""
        if name == "output.weight" and self.tied:
            name = "token_embd.weight"
        e = self._header.get(name)
        if e is None or name.endswith(".experts") or name.startswith("__"):
            raise StrataError(f"{self.path} has no dense tensor {name!r}")
        raw = self._raw(name).view(_DTYPES[e["dtype"]][0]).view(tuple(e["shape"]))
        b = self.meta.get(DENSE_BLOCKS_KEY, {}).get(name)
        return raw if b is None else QuantDense(b["fmt"], tuple(b["shape"]), raw)

    def __repr__(self) -> str:
        fmts = sorted({f"{m.fmt.name}" for pl in self.layers if pl.layout is not None
                       for m in pl.layout.matrices})
        blocks = self.meta.get(DENSE_BLOCKS_KEY, {})
        kept = (f", {len(blocks)} dense matrices as blocks "
                f"({'/'.join(sorted({b['fmt'] for b in blocks.values()}))})" if blocks else "")
        return (f"Pack({self.path.name}: {self.shape.n_layer} layers, E={self.shape.n_expert}, "
                f"formats {'/'.join(fmts)}, max_blob {self.max_blob}, native={self.native}{kept})")
