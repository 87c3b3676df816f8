"""GGUF (llama.cpp's qwen3moe) -> pack. Expert tensors are kept byte for byte (a native pack).

llama.cpp stores `blk.N.ffn_{gate,up}_exps` as ggml {D, F, E} and `ffn_down_exps` as {F, D, E}:
read row-major that is [E, F, row_bytes(D)] and [E, D, row_bytes(F)], i.e. E consecutive matrices
in exactly the blob's row format. Dense tensors keep F32/F16/BF16; quantized dense tensors are
dequantized to F32 (lossless). llama.cpp's converter permutes nothing for qwen3moe (its RoPE is
NEOX, the same rotate-half as Hugging Face), so q/k weights are used as stored.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from strata.blob import BlobLayout
from strata.errors import StrataError
from strata.formats.table import get_format
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


def open_gguf(path):
    import gguf
    try:
        return gguf.GGUFReader(str(path), "r")
    except (ValueError, OSError, KeyError, IndexError) as e:
        raise StrataError(f"{path} is not a readable GGUF file ({e})") from None


def gguf_shape(r, path) -> ModelShape:
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
        rope_theta=float(f"{float(_field(r, f'{a}.rope.freq_base', 10000.0)):.7g}"),
        rms_eps=float(f"{float(_field(r, f'{a}.attention.layer_norm_rms_epsilon')):.7g}"),
        max_pos=int(_field(r, f"{a}.context_length", 40960)))


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
        shape = self.shape
        tensors = {t.name: t for t in r.tensors}
        self._dense = {name: _dense(tensors[name], shp)
                       for name, shp in dense_specs(shape).items() if name in tensors}
        self.tied = "output.weight" not in self._dense
        self.layers, self._mats = [], []
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
                    raise StrataError(f"{n} has ggml shape {[int(v) for v in t.shape]}, expected "
                                      f"{want} from the metadata")
                mats.append(t.data)
                fmts.append(fmt.name)
            lay = BlobLayout.make(shape.d_model, shape.d_expert, *fmts)
            self.layers.append(PackLayer(lay, lay.size))
            self._mats.append(mats)
        self.max_blob = max(pl.blob_size for pl in self.layers)

    def blobs(self, i: int) -> np.ndarray:
        """Layer i's blobs, uint8 [E, blob_size] (numpy)."""
        return assemble_blobs(self.layers[i].layout, *self._mats[i], self.shape.n_expert)

    def experts(self, i: int) -> torch.Tensor:
        return torch.from_numpy(self.blobs(i))

    def dense_names(self) -> list[str]:
        return list(self._dense)

    def dense(self, name: str) -> torch.Tensor:
        if name == "output.weight" and self.tied:
            name = "token_embd.weight"
        return self._dense[name]


def gguf_to_pack(src, out, progress: bool = True):
    """Write a native pack from a qwen3moe GGUF file; returns the output path."""
    from strata.packs.file import write_pack
    g = GGUFModel(src)
    makers = [lambda i=i: g.blobs(i) for i in range(g.shape.n_layer)]
    return write_pack(out, g.shape, g._dense, makers, [pl.layout for pl in g.layers], native=True,
                      source=g.source, progress=progress)
