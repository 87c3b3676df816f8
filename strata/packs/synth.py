"""Synthetic models of every architecture: a real GGUF file (as llama.cpp lays it out:
strata.packs.synth_gguf) or a pack directly.

Random weights that behave like a trained MoE where streaming cares:
  * every matrix has weight std 1/sqrt(fan_in) (so a unit-RMS input gives unit-RMS outputs), norm
    weights are 1 + N(0, 0.05^2), embeddings N(0, 1): activations stay O(1) through every layer
    (the residual grows only like sqrt(layers));
  * the router `ffn_gate_inp` [E, D] is N(0, 1/D): logits ~ N(0, 1) per expert for a unit-RMS token,
    independent across experts, so top-K of different tokens are nearly independent draws and a chunk
    of T >= 2048 tokens at K=8, E=128 hits every expert (see strata.engine.route_trace).
Expert matrices are drawn as raw block bytes (strata.packs.randblocks), never by quantizing floats.

Time and memory (full qwen3-30b-a3b, Q8_0, ~32 GB): one layer's expert tensor at a time is in RAM
(~0.7 GB); random bytes come from up to 8 threads, so it is disk- and RNG-bound: about 2-4 minutes
on a 16-core host with a fast disk. Dense weights (~2.4 GB bf16) are made one tensor at a time.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from strata.archs.names import dense_specs
from strata.packs.blobs import assemble_blobs
from strata.packs.qdense import keep_blocks, raw_rows
from strata.packs.synth_draws import (BIAS_SIGMA, NORM_JITTER, QK_NORM_SCALE,  # noqa: F401
                                      ExpertFormats, Mix, _dense_type, _per_layer, _seed,
                                      dense_dtype, dense_sigma, dense_tensor, expert_biases,
                                      expert_matrix, expert_sigmas)
from strata.packs.synth_gguf import synth_gguf  # noqa: F401  (strata synth's GGUF writer)
from strata.packs.synth_vocab import synth_tokenizer
from strata.shapes import ModelShape


# ------------------------------------------------------------------------------------ pack
def synth_dense(shape: ModelShape, seed: int = 0, dense_type: str = "BF16",
                dense_types: dict | None = None, qk_norm_scale: float = QK_NORM_SCALE
                ) -> dict[str, torch.Tensor]:
    """The random dense weights (same draws as synth_gguf's for the same seed), each as a GGUF ->
    pack import holds it (strata.packs.from_gguf): a block-format matrix of a mix as its blocks
    (a QuantDense; strata.packs.qdense.as_float decodes it), rows reordered where the import
    reorders them (Mixtral's q/k un-permuted); a tensor the file stores split (MLA's attn_kv_b
    as attn_k_b / attn_v_b) drawn as its parts, decoded and joined; anything else a tensor."""
    from strata.archs.gguf_layout import file_order
    from strata.archs.registry import get_arch
    arch = get_arch(shape.arch)
    k = {name: i for i, (name, *_) in enumerate(file_order(shape))}

    def draw(name, shp):
        dt = _dense_type(name, dense_type, dense_types)
        return dense_tensor(name, shp, shape, _seed(seed, k[name]), dt, qk_norm_scale), dt
    out = {}
    for name, shp in dense_specs(shape).items():
        parts = arch.gguf_split(name, shp, shape)
        if parts:
            out[name] = arch.gguf_join(name, {n: _decoded(*draw(n, s), s)
                                              for n, s in parts.items()}, shape, lambda t, _s: t)
            continue
        raw, dt = draw(name, shp)
        q = keep_blocks(dt, raw_rows(raw), shp, lambda x, n=name: arch.gguf_dense(n, x, shape))
        out[name] = q if q is not None else arch.gguf_dense(name, _decoded(raw, dt, shp), shape)
    return out


def _decoded(raw: np.ndarray, dt: str, shp) -> torch.Tensor:
    """A dense tensor's raw bytes as values: F32/F16/BF16 kept, a block format decoded to F32
    (where the import cannot keep the blocks: a tensor it joins or transforms)."""
    from strata.formats.codec import dequantize
    tdt = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
    if dt in tdt:
        return torch.from_numpy(np.ascontiguousarray(raw).reshape(-1)).view(tdt[dt]).view(shp)
    return dequantize(raw, dt).reshape(shp)


def synth_pack(path, shape: ModelShape,
               fmts: ExpertFormats | list[ExpertFormats] | Mix = ExpertFormats(),
               seed: int = 0, dense_type: str = "BF16", progress: bool = True,
               qk_norm_scale: float = QK_NORM_SCALE) -> Path:
    """Write a pack with random weights directly (no GGUF); `fmts` one for all layers, one per
    layer, or a Mix (whose dense tensors are drawn in its types and stored as the import stores
    them: a block-format matrix as its blocks).
    Any format of the table, Q2_0 included; `qk_norm_scale`: see QK_NORM_SCALE. Blobs of one
    layer are in RAM at a time (qwen3-30b-a3b Q8_0: 128 x 5,222,400 B = 0.67 GB); the ~32 GB
    pack takes minutes (see module doc).
    Native: the blobs keep GGUF block layouts. Every tensor is drawn from the seed synth_gguf
    draws it from (its index in llama.cpp's file order), so this is the pack `strata pack` makes
    of synth_gguf's file with the same arguments: a full-size side-by-side needs only one of
    the two files at a time."""
    from strata.packs.writer import write_pack
    mix = fmts if isinstance(fmts, Mix) else None
    per_layer = _per_layer(shape, mix.experts if mix else fmts)
    layouts = [f.layout(shape) for f in per_layer]

    from strata.archs.gguf_layout import file_order
    k = {name: n for n, (name, *_) in enumerate(file_order(shape))}   # synth_gguf's seeds

    def layer(i):
        def make():
            f = per_layer[i]
            p = f"blk.{i}.ffn_"
            mats = [expert_matrix(w, getattr(f, w), shape, _seed(seed, k[f"{p}{w}_exps.weight"]))
                    for w in ("gate", "up", "down")]
            bias = (expert_biases(shape, [_seed(seed, k[f"{p}{w}_exps.bias"])
                                          for w in ("gate", "up", "down")])
                    if layouts[i].bias is not None else None)
            return assemble_blobs(layouts[i], *mats, shape.n_expert, bias=bias)
        return make
    return write_pack(path, shape, synth_dense(shape, seed, dense_type, mix.dense if mix else None,
                                               qk_norm_scale=qk_norm_scale),
                      [layer(i) for i in range(shape.n_layer)], layouts, native=True,
                      source=f"synth seed={seed}", progress=progress,
                      tokenizer=synth_tokenizer(shape.vocab))

