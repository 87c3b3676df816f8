"""One model in another format: a pack's weights re-encoded as a llama.cpp stock mix or a plain
quant, so every format can be read against the same float base (experiments/quant_quality.py).

    base = MemoryPack(shape, ExpertFormats.of("BF16"))
    q4 = Requant(base, Mix.stock("Q4_K_M", shape))       # or Requant(base, ExpertFormats.of("Q8_0"))
    PrefillEngine(q4, cfg)                                # the Pack interface MemoryPack has

Each expert matrix is decoded to fp32 and encoded in its layer's format: ggml's reference
quantizer where strata has it (strata.formats.codec: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, MXFP4, the
plain types), else strata's round-to-nearest (strata.formats.rtn: the k-quants, IQ4_XS, IQ4_NL;
NOT llama.cpp's scale search: `quantizer()` names which). The dense tensors a mix quantizes are
encoded and decoded back to fp32, as a GGUF -> pack import keeps them; plain quants keep the
base's dense weights (as `strata synth --quant` writes BF16). Expert biases (GPT-OSS) are copied.
A base built of repeated experts (MemoryPack.distinct_experts) is encoded once per distinct one.
"""
from __future__ import annotations

import torch

from strata.blob import BlobLayout
from strata.formats import codec
from strata.formats.rtn import RTN_QUANTIZERS
from strata.formats.table import get_format
from strata.packs.file import PackLayer

PLAIN = ("F32", "F16", "BF16")


def quantizer(fmt: str) -> str:
    """Whose encoder writes `fmt`: ggml's reference (bit-exact), strata's round-to-nearest, or
    none (a plain type)."""
    name = get_format(fmt).name
    if name in PLAIN:
        return "plain"
    return "ggml-reference" if name in codec.QUANTIZERS else "strata-rtn"


def encode(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """uint8 [..., rows, row_bytes] of float `x` [..., rows, cols] in `fmt`."""
    f = get_format(fmt)
    if f.name in codec.QUANTIZERS:
        return codec.quantize(x, f.name)
    f.row_bytes(x.shape[-1])                     # a row that is not whole blocks: one line
    blocks = x.float().reshape(-1, f.block)
    return RTN_QUANTIZERS[f.name](blocks).reshape(*x.shape[:-1], -1)


def reencode_blobs(blobs: torch.Tensor, src: BlobLayout, dst: BlobLayout) -> torch.Tensor:
    """Experts uint8 [n, src.size] decoded and encoded into dst's formats: [n, dst.size]."""
    n = blobs.shape[0]
    out = torch.zeros(n, dst.size, dtype=torch.uint8, device=blobs.device)
    for a, b in zip(src.matrices, dst.matrices):
        w = codec.dequantize(blobs[:, a.offset:a.offset + a.nbytes].reshape(n * a.rows, -1),
                             a.fmt.name)                                  # [n*rows, cols]
        out[:, b.offset:b.offset + b.nbytes] = encode(w, b.fmt.name).reshape(n, -1)
    if src.bias is not None:
        out[:, dst.bias.offset:dst.bias.offset + dst.bias.nbytes] = \
            blobs[:, src.bias.offset:src.bias.offset + src.bias.nbytes]
    return out


class Requant:
    """`base` (a Pack or MemoryPack) with its experts in `fmts` (one ExpertFormats, one per
    layer, or a Mix: its expert types by layer and its dense types)."""

    def __init__(self, base, fmts, *, device=None):
        from strata.packs.synth import Mix, _per_layer
        self.base, self.shape = base, base.shape
        self.native, self.tied = True, getattr(base, "tied", False)
        self.name = fmts.name if isinstance(fmts, Mix) else fmts.gate
        self.source = f"{getattr(base, 'source', 'base')} as {self.name}"
        self.path = self.source
        self.tokenizer = getattr(base, "tokenizer", None)
        self._fmts = _per_layer(self.shape, fmts.experts if isinstance(fmts, Mix) else fmts)
        self._dense_types = fmts.dense if isinstance(fmts, Mix) else {}
        self._device = torch.device(device or "cpu")
        self.layers = [PackLayer(f.layout(self.shape), f.layout(self.shape).size)
                       if pl.layout is not None else PackLayer.dense()
                       for f, pl in zip(self._fmts, base.layers)]
        self.max_blob = max(pl.blob_size for pl in self.layers)
        self._done: dict = {}

    def experts(self, i: int) -> torch.Tensor:
        """Layer i's experts in its format, uint8 [E, blob] (each distinct base expert encoded
        once, on `device`)."""
        src, dst = self.base.layers[i].layout, self.layers[i].layout
        if dst is None:
            return self.base.experts(i)
        if hasattr(self.base, "distinct_experts"):
            blobs, idx = self.base.distinct_experts(i)
        else:
            blobs, idx = self.base.experts(i), torch.arange(self.shape.n_expert)
        key = (blobs.data_ptr(), self._fmts[i])
        if key not in self._done:
            self._done[key] = reencode_blobs(blobs.to(self._device), src, dst).cpu()
        return self._done[key][idx]

    def dense_names(self) -> list[str]:
        return self.base.dense_names()

    def dense(self, name: str) -> torch.Tensor:
        w = self.base.dense(name)
        fmt = self._dense_types.get(name)
        if fmt is None or get_format(fmt).name in PLAIN or w.dim() < 2:
            return w
        x = w.to(self._device, torch.float32)
        return codec.dequantize(encode(x, fmt), fmt).reshape(w.shape).cpu()

    @property
    def expert_bytes(self) -> int:
        return sum(pl.blob_size for pl in self.layers) * self.shape.n_expert

    def bytes_per_weight(self) -> float:
        """Bytes a weight of this model as a GGUF stores it: experts in their formats, dense
        tensors in the mix's types (plain quants: the base's 2-byte dense weights; norms and
        the router F32)."""
        weights = stored = 0
        for name in self.dense_names():
            w = self.base.dense(name)
            fmt = self._dense_types.get(name) or ("F32" if w.dim() < 2 else "BF16")
            rows, cols = (w.numel() // w.shape[-1], w.shape[-1])
            weights += w.numel()
            stored += get_format(fmt).nbytes(rows, cols)
        for pl in self.layers:
            if pl.layout is not None:
                weights += sum(m.rows * m.cols for m in pl.layout.matrices) * self.shape.n_expert
        return (stored + self.expert_bytes) / weights

    def quantizers(self) -> str:
        """Which encoders wrote this model's tensors: ggml-reference, strata-rtn (or both)."""
        fmts = {getattr(f, w) for f in self._fmts for w in ("gate", "up", "down")}
        fmts |= {t for t in self._dense_types.values()}
        return "+".join(sorted({quantizer(f) for f in fmts} - {"plain"})) or "plain"
