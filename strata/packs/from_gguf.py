"""GGUF (llama.cpp's qwen3moe) -> pack. Expert tensors are kept byte for byte (a native pack).

llama.cpp stores `blk.N.ffn_{gate,up}_exps` as ggml {D, F, E} and `ffn_down_exps` as {F, D, E}:
read row-major that is [E, F, row_bytes(D)] and [E, D, row_bytes(F)], i.e. E consecutive matrices
in exactly the blob's row format. Dense tensors keep F32/F16/BF16; quantized dense tensors are
dequantized to F32 (lossless). llama.cpp's converter permutes nothing for qwen3moe (its RoPE is
NEOX, the same rotate-half as Hugging Face), so q/k weights are used as stored.
"""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import torch

from strata.blob import BlobLayout
from strata.errors import StrataError
from strata.formats.table import get_format
from strata.packs.blobs import assemble_blobs
from strata.packs.names import dense_specs
from strata.shapes import ModelShape

_PLAIN = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def _field(r, key, default=None, required=True):
    f = r.get_field(key)
    if f is None:
        if required and default is None:
            raise StrataError(f"GGUF metadata {key} is missing; is this a qwen3moe file?")
        return default
    return f.contents()


# What gguf-py raises on a corrupted or truncated file (a wrong length or count, a bad type
# code, a string that is not UTF-8): the file's fault, said in one line.
_READ_ERRORS = (ValueError, OSError, KeyError, IndexError, OverflowError, MemoryError, TypeError,
                AssertionError, struct.error)


def open_gguf(path):
    import gguf
    from strata import filekind
    other = filekind.not_a(path, filekind.GGUF)
    if other:
        raise StrataError(other)
    try:
        return gguf.GGUFReader(str(path), "r")
    except _READ_ERRORS as e:
        raise StrataError(f"{path} is not a readable GGUF file ({_short(e)}); truncated or "
                          f"corrupted") from None


def _short(e: BaseException) -> str:
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    return text if len(text) <= 120 else text[:117] + "..."


def gguf_shape(r, path) -> ModelShape:
    """The model shape from the GGUF's metadata; one line naming the key that is missing or
    unreadable. rope.freq_base is required: llama.cpp's fallback (10000) is not Qwen3's."""
    from strata.packs.file import check_shape
    try:
        shape = _gguf_shape(r, path)
        check_shape(shape, path)
        return shape
    except _READ_ERRORS as e:
        raise StrataError(f"{path}: its metadata is unreadable or of the wrong type ({_short(e)}); "
                          f"the file is corrupted") from None


def _gguf_shape(r, path) -> ModelShape:
    arch = _field(r, "general.architecture")
    if arch != "qwen3moe":
        raise StrataError(f"{path} is a {arch!r} model; strata packs qwen3moe GGUF files")
    a = arch
    D = int(_field(r, f"{a}.embedding_length"))
    H = int(_field(r, f"{a}.attention.head_count"))
    tensors = {t.name: t for t in r.tensors}
    if "token_embd.weight" not in tensors:
        raise StrataError(f"{path} has no token_embd.weight")
    V = int(tensors["token_embd.weight"].shape[1])
    return ModelShape(
        arch="qwen3moe", n_layer=int(_field(r, f"{a}.block_count")), d_model=D,
        n_expert=int(_field(r, f"{a}.expert_count")), top_k=int(_field(r, f"{a}.expert_used_count")),
        d_expert=int(_field(r, f"{a}.expert_feed_forward_length")), n_head=H,
        n_kv_head=int(_field(r, f"{a}.attention.head_count_kv", H)),
        head_dim=int(_field(r, f"{a}.attention.key_length", D // H)), vocab=V,
        rope_theta=float(f"{float(_rope_base(r, a, path)):.7g}"),
        rms_eps=float(f"{float(_field(r, f'{a}.attention.layer_norm_rms_epsilon')):.7g}"),
        max_pos=int(_field(r, f"{a}.context_length", 40960)))


def _check_spans(tensors, path) -> None:
    """Tensor data ranges must not overlap: a corrupted offset would otherwise read a
    neighbour's bytes as this tensor (GGUF has no checksum to catch it)."""
    spans = sorted((int(t.data_offset), int(t.data_offset) + int(t.n_bytes), t.name)
                   for t in tensors)
    for (a0, a1, an), (b0, b1, bn) in zip(spans, spans[1:]):
        if b0 < a1:
            raise StrataError(f"{path}: tensors {an} and {bn} overlap in the file (offsets "
                              f"{a0}..{a1} and {b0}..{b1}); the GGUF is corrupted")
    if len({n for *_, n in spans}) != len(spans):
        raise StrataError(f"{path}: a tensor name appears twice; the GGUF is corrupted")


def _rope_base(r, a: str, path) -> float:
    f = r.get_field(f"{a}.rope.freq_base")
    if f is None:
        raise StrataError(f"{path}: GGUF metadata {a}.rope.freq_base is missing; strata will not "
                          f"guess it (llama.cpp falls back to 10000, Qwen3 models use 1000000): "
                          f"set it with gguf-py's gguf_set_metadata.py or re-convert the model")
    v = float(f.contents())
    if not v > 0 or v != v or v == float("inf"):
        raise StrataError(f"{path}: GGUF metadata {a}.rope.freq_base is {v}; it must be a "
                          f"positive number")
    return v


def _dense(t, want_shape) -> torch.Tensor:
    import gguf
    from gguf.quants import dequantize
    name = t.tensor_type.name
    if name in _PLAIN:
        raw = np.ascontiguousarray(t.data).reshape(-1)
        x = torch.from_numpy(raw.view(np.uint8).copy()).view(_PLAIN[name])
    else:
        try:
            x = torch.from_numpy(dequantize(t.data, t.tensor_type).astype(np.float32))
        except NotImplementedError:
            raise StrataError(f"{t.name} is {name}, which gguf-py cannot dequantize") from None
    if x.numel() != int(np.prod(want_shape)):
        raise StrataError(f"{t.name} holds {x.numel()} weights, expected {list(want_shape)}")
    return x.reshape(want_shape)


def gguf_to_pack(src, out, progress: bool = True):
    """Write a native pack from a qwen3moe GGUF file; returns the output path."""
    from strata.packs.file import write_pack
    src = Path(src)
    r = open_gguf(src)
    shape = gguf_shape(r, src)
    tensors = {t.name: t for t in r.tensors}
    _check_spans(r.tensors, src)
    dense = {}
    for name, shp in dense_specs(shape).items():
        if name in tensors:
            dense[name] = _dense(tensors[name], shp)
    layouts, makers = [], []
    for i in range(shape.n_layer):
        mats, fmts = [], []
        for which, rows, cols in (("gate", shape.d_expert, shape.d_model),
                                  ("up", shape.d_expert, shape.d_model),
                                  ("down", shape.d_model, shape.d_expert)):
            n = f"blk.{i}.ffn_{which}_exps.weight"
            t = tensors.get(n)
            if t is None:
                raise StrataError(f"{src} has no {n}; not a MoE layer strata can pack")
            fmt = get_format(t.tensor_type)  # refuses types strata cannot read, naming them
            want = [cols, rows, shape.n_expert]
            if [int(v) for v in t.shape] != want:
                raise StrataError(f"{n} has ggml shape {[int(v) for v in t.shape]}, expected {want} "
                                  f"from the metadata")
            mats.append(t.data)
            fmts.append(fmt.name)
        lay = BlobLayout.make(shape.d_model, shape.d_expert, *fmts)
        layouts.append(lay)
        makers.append(lambda lay=lay, mats=mats: assemble_blobs(lay, *mats, shape.n_expert))
    return write_pack(out, shape, dense, makers, layouts, native=True, source=f"gguf:{src.name}",
                      progress=progress)
