"""A synthetic pack held in memory: the full-size experiments' model, built in seconds.

Writing a ~32 GB qwen3-30b-a3b Q8_0 pack to disk takes minutes (synth_pack); a streaming
benchmark only needs the bytes in host memory. `MemoryPack` has the `Pack` interface the model
and the engine read (shape, layers, max_blob, native, experts(i), dense(name), dense_names()),
with

- dense weights drawn on `device` (a GPU when there is one) with the same scales as synth_pack
  (strata.packs.synth.dense_sigma, norms 1 + jitter, q/k norms x QK_NORM_SCALE: the choices that
  keep synthetic routing spread over the experts; a DeltaNet layer's ssm_a in -SSM_A_RANGE, so
  its heads decay), and
- expert blobs that are random VALID blocks (strata.packs.randblocks, the synth_pack generator)
  for `distinct` experts per layer variant, repeated over the E experts of a layer and cycled over
  `variants` layer variants. Streaming and the expert GEMM see real blocks of the real size; only
  the variety of the values is smaller, which routing and timing do not depend on.

experts(i) builds layer i's [E, blob] tensor on demand, so the engine's pinned copy is the only
full-size copy in memory.
"""
from __future__ import annotations

import math

import torch

from strata.packs.file import PackLayer
from strata.archs.names import dense_specs
from strata.packs.synth import (NORM_JITTER, QK_NORM_SCALE, ExpertFormats, dense_sigma,
                                expert_biases, expert_matrix)
from strata.packs.synth_draws import SSM_A_RANGE
from strata.shapes import ModelShape


def ssm_a(z: torch.Tensor) -> torch.Tensor:
    """A DeltaNet layer's ssm_a [Hv] fp32 = -A, A ~ U(SSM_A_RANGE) as synth_pack draws it, from
    standard normal draws z through their CDF: the draw takes the generator's normals as every
    other tensor does, so the tensors after it keep their values."""
    lo, hi = SSM_A_RANGE
    u = 0.5 * (1 + torch.erf(z.float() / math.sqrt(2)))                          # U(0, 1)
    return -(lo + (hi - lo) * u)


class MemoryPack:
    def __init__(self, shape: ModelShape, fmts=ExpertFormats(), *, seed: int = 0,
                 distinct: int = 8, variants: int = 4, device=None,
                 dense_dtype: torch.dtype = torch.bfloat16):
        """`fmts`: one ExpertFormats, one per layer, or a Mix (its expert types by layer; the
        dense weights stay `dense_dtype`: they are resident, not streamed)."""
        from strata.packs.synth import Mix, _per_layer
        self.shape = shape
        self.native = True
        self.tied = False
        self.source = f"memory synth seed={seed}"
        self.path = self.source
        self._fmts = _per_layer(shape, fmts.experts if isinstance(fmts, Mix) else fmts)
        lays = {f: f.layout(shape) for f in self._fmts}
        self.layers = [PackLayer(lays[f], lays[f].size) if shape.is_moe_layer(i)
                       else PackLayer.dense() for i, f in enumerate(self._fmts)]
        self.max_blob = max(pl.blob_size for pl in self.layers)
        dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        g = torch.Generator(device=dev).manual_seed(seed)
        self._dense = {}
        for i, (name, shp) in enumerate(dense_specs(shape).items()):
            sigma = dense_sigma(name, shape)
            if sigma is None:   # a norm: 1 + jitter (q/k norms sharper, as synth_pack)
                base = QK_NORM_SCALE if name.endswith(("attn_q_norm.weight",
                                                       "attn_k_norm.weight")) else 1.0
                w = base * (1 + NORM_JITTER * torch.randn(shp, generator=g, device=dev))
                self._dense[name] = w.float().cpu()
            elif name.endswith("ssm_a"):   # fp32, every head decaying (SSM_A_RANGE)
                self._dense[name] = ssm_a(torch.randn(shp, generator=g, device=dev,
                                                        dtype=torch.float32)).cpu()
            else:
                w = torch.randn(shp, generator=g, device=dev, dtype=torch.float32) * sigma
                self._dense[name] = w.to(dense_dtype).cpu()
        small = shape.with_(n_expert=distinct)
        self._base = {}          # per layer formats, per variant: uint8 [distinct, blob]
        for f, lay in lays.items():
            self._base[f] = []
            for v in range(variants):
                mats = [torch.from_numpy(expert_matrix(w, getattr(f, w), small,
                                                       [seed, 7_000_000 + 3 * v + j]))
                        for j, w in enumerate(("gate", "up", "down"))]
                blob = torch.zeros(distinct, lay.size, dtype=torch.uint8)
                for m, t in zip(lay.matrices, mats):
                    blob[:, m.offset:m.offset + m.nbytes] = t.reshape(distinct, -1)
                if lay.bias is not None:   # GPT-OSS: the biases stream inside the blob
                    for name, b in zip(("gate", "up", "down"),
                                       expert_biases(small, [[seed, 8_000_000 + 3 * v + j]
                                                            for j in range(3)])):
                        off, n = lay.bias.part(name)
                        blob[:, off:off + 4 * n] = torch.from_numpy(b).view(torch.uint8)
                self._base[f].append(blob)
        self._idx = torch.arange(shape.n_expert) % distinct

    def experts(self, i: int) -> torch.Tensor:
        """Layer i's experts, uint8 [E, blob_size] (built now; the caller keeps or pins it);
        [E, 0] for a leading dense layer."""
        if self.layers[i].layout is None:
            return torch.empty(self.shape.n_expert, 0, dtype=torch.uint8)
        base = self._base[self._fmts[i]]
        return base[i % len(base)][self._idx]

    def distinct_experts(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer i's distinct experts uint8 [distinct, blob] and the index [E] that repeats them
        into experts(i): a re-encoding (strata.packs.requant) encodes each distinct one once."""
        if self.layers[i].layout is None:
            return self.experts(i), torch.arange(self.shape.n_expert)
        base = self._base[self._fmts[i]]
        return base[i % len(base)], self._idx

    def save(self, path, progress: bool = True, tokenizer: bool = True):
        """Write this model as a pack file (the same bytes a reader of this MemoryPack sees):
        seconds for a full-size shape, where `strata synth --pack` draws every expert afresh
        and takes minutes. For benchmarks that need a file (a fresh process opening it, the
        page cache, pinning): the blobs repeat `distinct` experts, which no copy or kernel
        cost depends on. `tokenizer=False` leaves synth's tokenizer out (a token-id-only pack)."""
        from strata.packs.writer import write_pack
        from strata.packs.synth import synth_tokenizer
        return write_pack(path, self.shape, dict(self._dense),
                          [lambda i=i: self.experts(i) for i in range(self.shape.n_layer)],
                          [pl.layout for pl in self.layers], native=True, source=self.source,
                          progress=progress,
                          tokenizer=synth_tokenizer(self.shape.vocab) if tokenizer else None)

    def dense_names(self) -> list[str]:
        return list(self._dense)

    def dense(self, name: str) -> torch.Tensor:
        return self._dense[name]

    @property
    def expert_bytes(self) -> int:
        return sum(pl.blob_size for pl in self.layers) * self.shape.n_expert   # dense layers: 0

    def __repr__(self) -> str:
        return (f"MemoryPack({self.shape.n_layer} layers, E={self.shape.n_expert}, max_blob "
                f"{self.max_blob:,}, {self.expert_bytes / 1e9:.1f} GB of experts)")


