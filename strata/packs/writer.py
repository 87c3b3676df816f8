"""Writing a pack (the layout and checks of strata.packs.file): the tensor plan in file order, each
tensor page-aligned, its CRC32 taken as it is written, the header signed, all into
`<path>.partial` and renamed (a pack is whole or absent)."""
from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path
from typing import Iterable

import numpy as np
import torch

from strata.atomic import atomic_write
from strata.blob import BlobLayout
from strata.errors import StrataError
from strata.packs.file import (_NP_TO_ST, _TORCH_TO_ST, DENSE_BLOCKS_KEY, FILE_ALIGN,
                               META_KEY, PACK_VERSION, TOKENIZER_KEY, sign_header)
from strata.packs.qdense import QuantDense
from strata.archs.names import check_dense, dense_specs, experts_name
from strata.shapes import ModelShape


def _dense_bytes(name: str, t) -> tuple[str, tuple[int, ...], np.ndarray]:
    if isinstance(t, QuantDense):     # its blocks, as the GGUF holds them
        return "U8", tuple(t.raw.shape), t.raw.contiguous().reshape(-1).numpy()
    return _float_bytes(name, t)


def _float_bytes(name: str, t) -> tuple[str, tuple[int, ...], np.ndarray]:
    """(safetensors dtype, shape, uint8 view) of a torch tensor or numpy array, no copy if possible."""
    if isinstance(t, torch.Tensor):
        st = _TORCH_TO_ST.get(t.dtype)
        if st is None or st == "U8":
            raise StrataError(f"dense tensor {name} is {t.dtype}; packs hold bf16, f16 or f32")
        shape = tuple(t.shape)
        u8 = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
        return st, shape, u8
    a = np.asarray(t)
    st = _NP_TO_ST.get(a.dtype)
    if st is None or st == "U8":
        raise StrataError(f"dense tensor {name} is {a.dtype}; packs hold bf16, f16 or f32")
    return st, tuple(a.shape), np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def _blob_bytes(i: int, blobs, layout: BlobLayout, n_expert: int) -> np.ndarray:
    if callable(blobs):
        blobs = blobs()
    if isinstance(blobs, torch.Tensor):
        blobs = blobs.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
    a = np.ascontiguousarray(blobs)
    if a.dtype != np.uint8:
        raise StrataError(f"layer {i} expert blobs are {a.dtype}; give uint8 [E, blob_size]")
    if a.size != n_expert * layout.size:
        raise StrataError(f"layer {i} expert blobs hold {a.size} bytes, expected {n_expert} x "
                          f"{layout.size} (E x blob size)")
    return a.reshape(-1)


def write_pack(path, shape: ModelShape, dense: dict, layer_blobs: Iterable, layouts,
               native: bool, source: str = "", progress: bool = True,
               tokenizer: dict | None = None, provenance: dict | None = None) -> Path:
    """Write a pack. `dense`: name -> torch tensor / numpy array, or a QuantDense (a matrix
    kept as its GGUF blocks, strata.packs.qdense; the metadata's `dense_blocks` names its format
    and shape) (names and shapes of strata.archs.names; "output.weight" may be left out when
    tied to the embeddings).
    `layer_blobs`: L items, each uint8 [E, blob_size] (numpy/torch) or a callable returning one,
    consumed in layer order so a big pack streams one layer at a time (a leading dense layer's
    item is skipped: it has no experts). `layouts`: one BlobLayout for every layer or a list of
    L. `provenance`: the source's metadata record (strata.packs.provenance).
    Writes to `<path>.partial` then renames."""
    import strata
    path = Path(path)
    L, E = shape.n_layer, shape.n_expert
    if isinstance(layouts, BlobLayout):
        layouts = [layouts] * L
    layouts = list(layouts)
    if len(layouts) != L:
        raise StrataError(f"{len(layouts)} blob layouts for {L} layers")
    # a leading dense layer (shape.is_moe_layer false) has no blob layout and no experts tensor
    layouts = [lay if shape.is_moe_layer(i) else None for i, lay in enumerate(layouts)]
    for i, lay in enumerate(layouts):
        if lay is None:
            continue
        if (lay.d_model, lay.d_expert) != (shape.d_model, shape.d_expert):
            raise StrataError(f"layer {i} blob layout is D={lay.d_model}, F={lay.d_expert}; the shape "
                              f"says D={shape.d_model}, F={shape.d_expert}")
    dense_info = {n: _dense_bytes(n, t) for n, t in dense.items()}
    blocks = {n: {"fmt": t.fmt, "shape": list(t.shape)} for n, t in dense.items()
              if isinstance(t, QuantDense)}
    check_dense(shape, {n: tuple(blocks[n]["shape"]) if n in blocks else v[1]
                        for n, v in dense_info.items()}, f"writing {path}")
    tied = "output.weight" not in dense_info

    # Tensor plan in file order: globals, then per layer its dense tensors and its experts.
    order = [n for n in dense_specs(shape) if n in dense_info and not n.startswith("blk.")]
    plan: list[tuple[str, str, tuple[int, ...], int]] = [
        (n, dense_info[n][0], dense_info[n][1], dense_info[n][2].size) for n in order]
    for i in range(L):
        plan += [(n, dense_info[n][0], dense_info[n][1], dense_info[n][2].size)
                 for n in dense_specs(shape) if n.startswith(f"blk.{i}.") and n in dense_info]
        if layouts[i] is not None:
            plan.append((experts_name(i), "U8", (E, layouts[i].size), E * layouts[i].size))

    header: dict = {}
    entries = []  # (name or None for padding, start, nbytes)
    off = 0
    for name, st, shp, nbytes in plan:
        pad = -off % FILE_ALIGN
        if pad:
            header[f"__pad.{len(entries)}"] = {"dtype": "U8", "shape": [pad],
                                               "data_offsets": [off, off + pad]}
            entries.append((None, off, pad))
            off += pad
        header[name] = {"dtype": st, "shape": list(shp), "data_offsets": [off, off + nbytes]}
        entries.append((name, off, nbytes))
        off += nbytes
    meta = {
        "pack_version": PACK_VERSION, "strata_version": strata.__version__,
        "shape": shape.to_dict(),
        "layers": [{"layout": lay.to_dict(), "blob_size": lay.size} if lay is not None
                   else {"layout": None, "blob_size": 0} for lay in layouts],
        "max_blob": max(lay.size for lay in layouts if lay is not None), "native": bool(native), "tied": tied,
        "source": str(source),
        "crc32": {n: "00000000" for n, *_ in plan},
    }
    if provenance is not None:
        meta["source_meta"] = provenance
    if blocks:
        meta[DENSE_BLOCKS_KEY] = blocks

    def header_bytes(meta: dict) -> bytes:
        h = dict(header)
        h["__metadata__"] = {META_KEY: json.dumps(meta, sort_keys=True)}
        if tokenizer is not None:
            h["__metadata__"][TOKENIZER_KEY] = json.dumps(tokenizer, sort_keys=True)
        raw = json.dumps(sign_header(h)).encode()
        raw += b" " * (-(8 + len(raw)) % FILE_ALIGN)  # data starts page-aligned
        return raw

    raw = header_bytes(meta)
    crcs = {}
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=L, desc=f"pack {path.name}", unit="layer", file=__import__("sys").stderr)
    blob_iter = iter(b for i, b in enumerate(layer_blobs) if layouts[i] is not None)
    try:
        with atomic_write(path) as tmp, open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(raw)))
            f.write(raw)
            for name, start, nbytes in entries:
                if name is None:
                    f.write(bytes(nbytes))
                    continue
                if name.endswith(".experts"):
                    i = int(name.split(".")[1])
                    try:
                        item = next(blob_iter)
                    except StopIteration:
                        raise StrataError(f"expert blobs given for {i} layers, the shape has {L}") from None
                    data = _blob_bytes(i, item, layouts[i], E)
                else:
                    data = dense_info[name][2]
                crcs[name] = f"{zlib.crc32(data) & 0xFFFFFFFF:08x}"
                f.write(memoryview(data))
                if bar is not None and name.endswith(".experts"):
                    bar.update(1)
            meta["crc32"] = crcs
            raw2 = header_bytes(meta)
            assert len(raw2) == len(raw), "fixed-width checksums keep the header size"
            f.seek(8)
            f.write(raw2)
    finally:
        if bar is not None:
            bar.close()
    return path
