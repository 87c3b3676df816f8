"""GGUF (llama.cpp's qwen3moe) -> pack. Expert tensors are kept byte for byte (a native pack).

llama.cpp stores `blk.N.ffn_{gate,up}_exps` as ggml {D, F, E} and `ffn_down_exps` as {F, D, E}:
read row-major that is [E, F, row_bytes(D)] and [E, D, row_bytes(F)], i.e. E consecutive matrices
in exactly the blob's row format. Newer conversions fuse gate and up into `ffn_gate_up_exps`
{D, 2F, E} (per expert the gate rows, then the up rows). The three matrices and the layers may
each have their own type (llama.cpp's Q4_K_M etc. mix them); every type and shape is checked
against the metadata, naming the tensor that disagrees. Dense tensors keep F32/F16/BF16; quantized dense tensors are
dequantized to F32 (lossless). llama.cpp's converter permutes nothing for qwen3moe (its RoPE is
NEOX, the same rotate-half as Hugging Face), so q/k weights are used as stored.

Other architectures (a GGUF general.architecture that a tensor-name map claims, see
strata.packs.names.by_source: `llama` with experts is Mixtral, `gpt-oss`) bring their metadata
reader (`gguf_shape`), dense transform (`gguf_dense`) and expert reader (`gguf_experts`, which
may return the experts' biases) from their map.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from strata.blob import BlobLayout
from strata.errors import StrataError
from strata.formats.table import get_format
from strata.gguf_file import READ_ERRORS, open_gguf, short_error
from strata.packs.blobs import assemble_blobs
from strata.packs.file import PackLayer
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


def gguf_shape(r, path) -> ModelShape:
    """The model shape from the GGUF's metadata; one line naming the key that is missing or
    unreadable, or that strata would drop (strata.packs.hparams audits every key first).
    rope.freq_base is required: llama.cpp's fallback (10000) is not Qwen3's."""
    from strata.packs.file import check_shape
    from strata.packs.hparams import audit_gguf, gguf_meta
    try:
        audit_gguf(_field(r, "general.architecture", required=False), gguf_meta(r), path)
        shape = _gguf_shape(r, path)
        check_shape(shape, path)
        return shape
    except READ_ERRORS as e:
        raise StrataError(f"{path}: its metadata is unreadable or of the wrong type ({short_error(e)}); "
                          f"the file is corrupted") from None


def _gguf_shape(r, path) -> ModelShape:
    arch = _field(r, "general.architecture")
    from strata.packs import from_gguf_ds
    if arch in from_gguf_ds.ARCHS:   # GLM-4.5, DeepSeek-V3 / Kimi-K2
        return from_gguf_ds.gguf_shape_ds(r, path, _field, _rope_base)
    tensors = {t.name: t for t in r.tensors}
    if arch != "qwen3moe":
        from strata.packs.names import ARCH_NAMES, by_source
        m = by_source("gguf", arch)
        if m is None:
            raise StrataError(f"{path} is a {arch!r} model; strata packs qwen3moe GGUF files "
                              f"and the architectures of {', '.join(ARCH_NAMES)}")
        return m.gguf_shape(lambda key, default=None: _field(r, key, default), tensors, path)
    a = arch
    D = int(_field(r, f"{a}.embedding_length"))
    H = int(_field(r, f"{a}.attention.head_count"))
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


def _ggml_shape(t) -> list[int]:
    return [int(v) for v in t.shape]


def _expert_format(t, cols: int):
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


def _check_expert(t, want: list[int], fmt) -> None:
    got = _ggml_shape(t)
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
        fmt = _expert_format(fused, D)
        _check_expert(fused, [D, 2 * F, E], fmt)
        data = np.asarray(fused.data).reshape(E, 2 * F, fmt.row_bytes(D))
        mats += [data[:, :F], data[:, F:]]
        fmts += [fmt.name, fmt.name]
    else:
        for w, t in zip(("gate", "up"), parts[:2]):
            if t is None:
                raise StrataError(f"{src} has no {p}ffn_{w}_exps.weight (nor a fused "
                                  f"{p}ffn_gate_up_exps.weight); not a MoE layer strata can pack")
            fmt = _expert_format(t, D)
            _check_expert(t, [D, F, E], fmt)
            mats.append(t.data)
            fmts.append(fmt.name)
    fmt = _expert_format(parts[2], F)
    _check_expert(parts[2], [F, D, E], fmt)
    mats.append(parts[2].data)
    fmts.append(fmt.name)
    return mats, fmts


def _check_dense_expert(ts: list, cols: int, rows: int):
    """The one Format of per-expert 2-D tensors `ts` (ggml {cols, rows} each); one line naming
    the first that differs in type or shape."""
    fmt = _expert_format(ts[0], cols)
    for t in ts:
        if t.tensor_type != ts[0].tensor_type:
            raise StrataError(f"{t.name} is {t.tensor_type.name} but {ts[0].name} is "
                              f"{ts[0].tensor_type.name}; a layer's experts share one type")
        if _ggml_shape(t) != [cols, rows]:
            raise StrataError(f"{t.name} has ggml shape {_ggml_shape(t)}, expected "
                              f"{[cols, rows]} from the metadata")
        if int(np.asarray(t.data).nbytes) != rows * fmt.row_bytes(cols):
            raise StrataError(f"{t.name} holds {int(np.asarray(t.data).nbytes):,} bytes; "
                              f"{fmt.name} {[cols, rows]} is {rows * fmt.row_bytes(cols):,}")
    return fmt


def _check_dense(t, shp) -> None:
    """A dense tensor's ggml shape is its torch shape reversed; one line naming it otherwise."""
    want = list(shp)[::-1]
    if _ggml_shape(t) != want:
        raise StrataError(f"{t.name} has ggml shape {_ggml_shape(t)}, expected {want} from the "
                          f"metadata")


class GGUFModel:
    """A qwen3moe GGUF read through the interface the model reads from a pack: `shape`, `layers`
    (PackLayer per layer), `max_blob`, `native`, `tied`, `dense_names()`, `dense(name)` and
    `experts(i)` (uint8 [E, blob_size], assembled from the file's rows when asked, so one layer's
    blobs are in memory at a time). Every expert tensor's type and shape is checked on open."""

    def __init__(self, src):
        src = Path(src)
        r = open_gguf(src)
        self.path, self.shape = src, gguf_shape(r, src)
        self.source, self.native = f"gguf:{src.name}", True
        self.reader = r
        shape = self.shape
        tensors = {t.name: t for t in r.tensors}
        _check_spans(r.tensors, src)
        from strata.packs.names import arch_names
        m = arch_names(shape.arch)
        self._dense = {}
        for name, shp in dense_specs(shape).items():
            if name in tensors:
                _check_dense(tensors[name], shp)
                x = _dense(tensors[name], shp)
                self._dense[name] = m.gguf_dense(name, x, shape) if m is not None else x
            elif name.endswith("attn_kv_b.weight"):   # deepseek2's k_b / v_b split, joined
                from strata.packs.from_gguf_ds import join_kv_b
                kvb = join_kv_b(shape, int(name.split(".")[1]), tensors, _dense)
                if kvb is not None:
                    self._dense[name] = kvb
        self.tied = "output.weight" not in self._dense
        self.layers, self._mats, self._bias = [], [], []
        for i in range(shape.n_layer):
            if not shape.is_moe_layer(i):   # a leading dense layer: no experts
                self.layers.append(PackLayer.dense())
                self._mats.append(None)
                self._bias.append(None)
                continue
            if m is not None:   # Mixtral, GPT-OSS: the arch's name map reads them
                mats, fmts, bias = m.gguf_experts(tensors, i, shape, src)
            else:
                (mats, fmts), bias = layer_experts(tensors, i, shape, src), None
            lay = BlobLayout.for_shape(shape, *fmts)
            self.layers.append(PackLayer(lay, lay.size))
            self._mats.append(mats)
            self._bias.append(bias)
        self.max_blob = max(pl.blob_size for pl in self.layers)

    def blobs(self, i: int) -> np.ndarray:
        """Layer i's blobs, uint8 [E, blob_size] (numpy)."""
        return assemble_blobs(self.layers[i].layout, *self._mats[i], self.shape.n_expert,
                              bias=self._bias[i])

    def experts(self, i: int) -> torch.Tensor:
        if self.layers[i].layout is None:
            return torch.empty(self.shape.n_expert, 0, dtype=torch.uint8)
        return torch.from_numpy(self.blobs(i))

    def dense_names(self) -> list[str]:
        return list(self._dense)

    def dense(self, name: str) -> torch.Tensor:
        if name == "output.weight" and self.tied:
            name = "token_embd.weight"
        return self._dense[name]


def gguf_to_pack(src, out, progress: bool = True):
    """Write a native pack from a qwen3moe GGUF file; returns the output path. Each layer keeps
    its own expert types (llama.cpp's mixes change them by layer), so its own blob size. The
    file's tokenizer (tokenizer.ggml.*) is carried into the pack (strata.tokenize)."""
    from strata.packs.writer import write_pack
    from strata.packs.provenance import gguf_record
    from strata.tokenize import gguf_tokenizer
    g = GGUFModel(src)
    makers = [lambda i=i: g.blobs(i) for i in range(g.shape.n_layer)]
    return write_pack(out, g.shape, g._dense, makers, [pl.layout for pl in g.layers], native=True,
                      source=g.source, progress=progress, tokenizer=gguf_tokenizer(src),
                      provenance=gguf_record(g.reader))
