"""A GGUF file's tensors and metadata as every architecture's reader reads them: a metadata
field, the RoPE base (never guessed), a dense tensor's values (F32/F16/BF16 as stored, quantized
ones dequantized), and a layer's expert tensors checked against the metadata and kept byte for
byte (3-D `ffn_*_exps`, fused `ffn_gate_up_exps`, or per-expert 2-D).

Legend: E experts, D hidden, F expert width.
"""
from __future__ import annotations

import numpy as np
import torch

from strata.errors import StrataError
from strata.formats.table import get_format
from strata.shapes import ModelShape

_PLAIN = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def field(r, key, default=None, required=True):
    f = r.get_field(key)
    if f is None:
        if required and default is None:
            raise StrataError(f"GGUF metadata {key} is missing; is this a qwen3moe file?")
        return default
    return f.contents()


def rope_base(r, a: str, path) -> float:
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


def dense(t, want_shape) -> torch.Tensor:
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


def ggml_shape(t) -> list[int]:
    return [int(v) for v in t.shape]


def expert_format(t, cols: int):
    """The table Format of expert tensor `t` whose rows hold `cols` weights; one line naming the
    tensor where its type is not one strata reads or its rows are not whole blocks."""
    try:
        fmt = get_format(t.tensor_type)
    except StrataError:
        raise StrataError(f"{t.name} is stored as {t.tensor_type.name}, a ggml type strata cannot "
                          f"read; re-quantize it to a type strata reads (strata.formats.FORMATS)"
                          ) from None
    if cols % fmt.block:
        raise StrataError(f"{t.name}: {fmt.name} rows are whole {fmt.block}-weight blocks, but its "
                          f"rows hold {cols} weights; the file's type and shape disagree")
    return fmt


def check_expert(t, want: list[int], fmt) -> None:
    got = ggml_shape(t)
    if got != want:
        raise StrataError(f"{t.name} has ggml shape {got}, expected {want} from the metadata")
    nbytes = want[2] * want[1] * fmt.row_bytes(want[0])
    if int(np.asarray(t.data).nbytes) != nbytes:
        raise StrataError(f"{t.name} holds {int(np.asarray(t.data).nbytes):,} bytes, but "
                          f"{fmt.name} {want} is {nbytes:,}; the file's type and shape disagree")


def layer_experts(tensors: dict, i: int, shape: ModelShape, src) -> tuple[list, list[str]]:
    """Layer i's expert matrices as ([gate, up, down] uint8 [E, rows, row_bytes], their format
    names). Reads separate `ffn_{gate,up}_exps` or one fused `ffn_gate_up_exps` (ggml
    {D, 2F, E}: per expert the F gate rows, then the F up rows), and `ffn_down_exps` {F, D, E}."""
    E, D, F = shape.n_expert, shape.d_model, shape.d_expert
    p = f"blk.{i}."
    fused = tensors.get(p + "ffn_gate_up_exps.weight")
    parts = [tensors.get(p + f"ffn_{w}_exps.weight") for w in ("gate", "up", "down")]
    if fused is not None and (parts[0] is not None or parts[1] is not None):
        raise StrataError(f"{src} holds both {fused.name} and separate ffn_gate/ffn_up_exps for "
                          f"layer {i}; a layer has one or the other")
    if parts[2] is None:
        raise StrataError(f"{src} has no {p}ffn_down_exps.weight; not a MoE layer strata can pack")
    mats, fmts = [], []
    if fused is not None:
        fmt = expert_format(fused, D)
        check_expert(fused, [D, 2 * F, E], fmt)
        data = np.asarray(fused.data).reshape(E, 2 * F, fmt.row_bytes(D))
        mats += [data[:, :F], data[:, F:]]
        fmts += [fmt.name, fmt.name]
    else:
        for w, t in zip(("gate", "up"), parts[:2]):
            if t is None:
                raise StrataError(f"{src} has no {p}ffn_{w}_exps.weight (nor a fused "
                                  f"{p}ffn_gate_up_exps.weight); not a MoE layer strata can pack")
            fmt = expert_format(t, D)
            check_expert(t, [D, F, E], fmt)
            mats.append(t.data)
            fmts.append(fmt.name)
    fmt = expert_format(parts[2], F)
    check_expert(parts[2], [F, D, E], fmt)
    mats.append(parts[2].data)
    fmts.append(fmt.name)
    return mats, fmts


def check_dense_expert(ts: list, cols: int, rows: int):
    """The one Format of per-expert 2-D tensors `ts` (ggml {cols, rows} each); one line naming
    the first that differs in type or shape."""
    fmt = expert_format(ts[0], cols)
    for t in ts:
        if t.tensor_type != ts[0].tensor_type:
            raise StrataError(f"{t.name} is {t.tensor_type.name} but {ts[0].name} is "
                              f"{ts[0].tensor_type.name}; a layer's experts share one type")
        if ggml_shape(t) != [cols, rows]:
            raise StrataError(f"{t.name} has ggml shape {ggml_shape(t)}, expected "
                              f"{[cols, rows]} from the metadata")
        if int(np.asarray(t.data).nbytes) != rows * fmt.row_bytes(cols):
            raise StrataError(f"{t.name} holds {int(np.asarray(t.data).nbytes):,} bytes; "
                              f"{fmt.name} {[cols, rows]} is {rows * fmt.row_bytes(cols):,}")
    return fmt


def _ne(shape: list[int]) -> list[int]:
    """A ggml shape without its trailing 1s: ggml's ne pads every tensor to 4 dims with 1s, so
    [64] and [64, 1] are one tensor (llama.cpp's converter writes the shared expert's gate as
    [64, 1], its quantizer as [64])."""
    while len(shape) > 1 and shape[-1] == 1:
        shape = shape[:-1]
    return shape


def check_dense_tensor(t, shp) -> None:
    """A dense tensor's ggml shape is its torch shape reversed (up to trailing 1s); one line
    naming it otherwise."""
    want = list(shp)[::-1]
    if _ne(ggml_shape(t)) != _ne(want):
        raise StrataError(f"{t.name} has ggml shape {ggml_shape(t)}, expected {want} from the "
                          f"metadata")
