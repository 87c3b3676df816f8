"""Small random packs for the pack tests."""
from __future__ import annotations

import numpy as np
import torch

from strata.blob import BlobLayout
from strata.packs import dense_specs, write_pack
from strata.shapes import PRESETS

TINY = PRESETS["tiny"]


def random_dense(shape, seed=0, tied=False):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for n, shp in dense_specs(shape).items():
        if tied and n == "output.weight":
            continue
        dt = torch.bfloat16 if len(shp) == 2 else torch.float32
        out[n] = torch.randn(shp, generator=g).to(dt)
    return out


def mixed_layouts(shape):
    """Layer 0 all Q8_0, layer 1 Q4_0 gate/up with a Q8_0 down: mixed quantization."""
    lays = [BlobLayout.make(shape.d_model, shape.d_expert, "Q8_0"),
            BlobLayout.make(shape.d_model, shape.d_expert, "Q4_0", "Q4_0", "Q8_0")]
    return [lays[i % 2] for i in range(shape.n_layer)]


def random_pack(path, shape=TINY, seed=0, tied=False, layouts=None):
    rng = np.random.default_rng(seed)
    lays = layouts or mixed_layouts(shape)
    blobs = [rng.integers(0, 256, (shape.n_expert, l.size), dtype=np.uint8) for l in lays]
    dense = random_dense(shape, seed, tied)
    write_pack(path, shape, dense, blobs, lays, native=True, source="test", progress=False)
    return dense, blobs, lays
