"""GGUF -> pack. Expert tensors are kept byte for byte (a native pack).

llama.cpp stores `blk.N.ffn_{gate,up}_exps` as ggml {D, F, E} and `ffn_down_exps` as {F, D, E}:
read row-major that is [E, F, row_bytes(D)] and [E, D, row_bytes(F)], i.e. E consecutive matrices
in exactly the blob's row format. Newer conversions fuse gate and up into `ffn_gate_up_exps`
{D, 2F, E} (per expert the gate rows, then the up rows). The three matrices and the layers may
each have their own type (llama.cpp's Q4_K_M etc. mix them); every type and shape is checked
against the metadata, naming the tensor that disagrees. Dense tensors keep F32/F16/BF16; a
block-format dense matrix stays its blocks (strata.packs.qdense: rows reordered where the
architecture's transform only reorders rows, else decoded to F32). llama.cpp's converter
permutes nothing for qwen3moe (its RoPE is NEOX, the same rotate-half as Hugging Face), so q/k
weights are used as stored.

The architecture's record (strata.archs.registry, found by general.architecture: `llama` with
experts is Mixtral) brings the metadata reader (`gguf_shape`), the dense transform
(`gguf_dense`, `gguf_join`) and the expert reader (`gguf_experts`, which may return the experts'
biases); strata.archs.gguf_tensors holds what they share.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from strata.archs.gguf_tensors import check_dense_tensor, dense, field
from strata.archs.names import dense_specs
from strata.blob import BlobLayout
from strata.errors import StrataError
from strata.gguf_file import READ_ERRORS, open_gguf, short_error
from strata.packs.blobs import assemble_blobs
from strata.packs.file import PackLayer
from strata.packs.qdense import as_float, keep_blocks, raw_rows
from strata.shapes import ModelShape


def gguf_shape(r, path) -> ModelShape:
    """The model shape from the GGUF's metadata; one line naming the key that is missing or
    unreadable, or that strata would drop (strata.packs.hparams audits every key first).
    rope.freq_base is required: llama.cpp's fallback (10000) is not Qwen3's."""
    from strata.archs.registry import by_gguf
    from strata.packs.file import check_shape
    from strata.packs.hparams import audit_gguf, gguf_meta
    try:
        arch = field(r, "general.architecture", required=False)
        audit_gguf(arch, gguf_meta(r), path)
        shape = by_gguf(field(r, "general.architecture"), path).gguf_shape(r, path)
        check_shape(shape, path)
        return shape
    except READ_ERRORS as e:
        raise StrataError(f"{path}: its metadata is unreadable or of the wrong type ({short_error(e)}); "
                          f"the file is corrupted") from None


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


class GGUFModel:
    """A GGUF read through the interface the model reads from a pack: `shape`, `layers`
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
        from strata.archs.registry import get_arch
        arch = get_arch(shape.arch)
        self._dense = {}
        for name, shp in dense_specs(shape).items():
            if name in tensors:
                t = tensors[name]
                check_dense_tensor(t, shp)
                # a block-format matrix stays its blocks (strata.packs.qdense), rows reordered
                # where the architecture reorders them; anything else is decoded
                q = keep_blocks(t.tensor_type.name, raw_rows(t.data), shp,
                                lambda x, n=name: arch.gguf_dense(n, x, shape))
                self._dense[name] = q if q is not None else \
                    arch.gguf_dense(name, dense(t, shp), shape)
            else:   # a tensor the file stores split (deepseek2's attn_k_b / attn_v_b), joined
                x = arch.gguf_join(name, tensors, shape, dense)
                if x is not None:
                    self._dense[name] = x
        self.tied = "output.weight" not in self._dense
        self.layers, self._mats, self._bias = [], [], []
        for i in range(shape.n_layer):
            if not shape.is_moe_layer(i):   # a leading dense layer: no experts
                self.layers.append(PackLayer.dense())
                self._mats.append(None)
                self._bias.append(None)
                continue
            mats, fmts, bias = arch.gguf_experts(tensors, i, shape, src)
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
        """A dense tensor's values (a matrix kept as blocks decoded: fp32)."""
        return as_float(self.dense_stored(name))

    def dense_stored(self, name: str):
        """A dense tensor as the reader holds it: a QuantDense (its blocks) or a tensor."""
        if name == "output.weight" and self.tied:
            name = "token_embd.weight"
        return self._dense[name]


def gguf_to_pack(src, out, progress: bool = True):
    """Write a native pack from a GGUF file; returns the output path. Each layer keeps
    its own expert types (llama.cpp's mixes change them by layer), so its own blob size. The
    file's tokenizer (tokenizer.ggml.*) is carried into the pack (strata.tokenize); its
    block-format dense matrices as their blocks (strata.packs.qdense)."""
    from strata.packs.writer import write_pack
    from strata.packs.provenance import gguf_record
    from strata.tokenize import gguf_tokenizer
    g = GGUFModel(src)
    makers = [lambda i=i: g.blobs(i) for i in range(g.shape.n_layer)]
    return write_pack(out, g.shape, g._dense, makers, [pl.layout for pl in g.layers], native=True,
                      source=g.source, progress=progress, tokenizer=gguf_tokenizer(src),
                      provenance=gguf_record(g.reader))
