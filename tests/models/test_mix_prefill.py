"""A llama.cpp-style mixed-type model end to end: `strata synth --mix Q4_K_M` writes a GGUF whose
layers differ in expert types (ffn_down Q6_K on use_more_bits layers, Q4_K elsewhere) and whose
dense tensors are Q4_K / Q6_K / Q5_0 (fallback) / F32; `strata pack` keeps each layer's layout;
`strata prefill` (resident, torch reference experts) gives the logits of the reference forward
run on weights decoded by gguf-py, independently of strata's decoders.

FP32_REL = 1e-5 as tests/models/test_qwen3moe: identical weights on both sides (strata's decoders
are bit-exact with gguf-py), fp32 arithmetic in a different order only (chunked vs whole)."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from strata.blob import BlobLayout
from strata.cli import main
from strata.models import ResidentProvider
from strata.models.moe import moe_ffn_ref
from strata.models.qwen3moe import Qwen3Moe, forward_torch
from strata.packs import Pack
from strata.packs.names import dense_specs
from strata.shapes import PRESETS

FP32_REL = 1e-5
SHAPE = PRESETS["tiny"].with_(n_layer=8, d_model=256, d_expert=256, n_expert=4, top_k=2)
TOKENS = [3, 250, 17, 17, 0, 128, 64, 9, 200, 31, 5]


def gguf_reference(path, shape, tokens) -> torch.Tensor:
    """Logits [T, V] of forward_torch on the GGUF's weights decoded by gguf-py (experts as F32)."""
    r = gguf.GGUFReader(str(path))
    t = {x.name: x for x in r.tensors}

    def f32(name):
        x = t[name]
        return np.asarray(gguf.quants.dequantize(np.asarray(x.data), x.tensor_type), np.float32)
    dense = {n: torch.from_numpy(f32(n).copy()).reshape(shp)
             for n, shp in dense_specs(shape).items()}
    lay = BlobLayout.make(shape.d_model, shape.d_expert, "F32")
    blobs = []
    for i in range(shape.n_layer):
        arena = torch.zeros(shape.n_expert, lay.size, dtype=torch.uint8)
        for m in lay.matrices:
            w = torch.from_numpy(f32(f"blk.{i}.ffn_{m.name}_exps.weight").copy())
            arena[:, m.offset:m.offset + m.nbytes] = w.reshape(shape.n_expert, -1).view(torch.uint8)
        blobs.append(arena)
    model = Qwen3Moe.from_tensors(shape, dense, ffn=moe_ffn_ref)
    return forward_torch(model, ResidentProvider(blobs, [lay] * shape.n_layer),
                         torch.tensor(tokens))


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """(GGUF, pack, reference logits) of a synth Q4_K_M model."""
    from strata.packs.synth import Mix, synth_gguf
    d = tmp_path_factory.mktemp("mix")
    g = synth_gguf(d / "m.gguf", SHAPE, Mix.stock("Q4_K_M", SHAPE), seed=3, progress=False)
    pack = d / "m.pack"
    assert main(["pack", str(g), "-o", str(pack)]) == 0
    return g, pack, gguf_reference(g, SHAPE, TOKENS).numpy()


def _prefill(pack, out, *extra):
    assert main(["prefill", str(pack), "--tokens", ",".join(map(str, TOKENS)), "--device", "cpu",
                 "--experts", "ref", "--dump-logits", str(out), *extra]) == 0
    return np.load(out)


def test_synth_mix_pack_prefill_equals_reference(mixed, tmp_path):
    g, pack, want = mixed
    types = {x.name: x.tensor_type.name for x in gguf.GGUFReader(str(g)).tensors}
    assert {types[f"blk.{i}.ffn_down_exps.weight"] for i in range(8)} == {"Q4_K", "Q6_K"}
    assert types["blk.0.attn_output.weight"] == "Q5_0" and types["output.weight"] == "Q6_K"
    pk = Pack.open(pack)
    assert len({pl.blob_size for pl in pk.layers}) == 2 and pk.max_blob == max(
        pl.blob_size for pl in pk.layers)
    got = _prefill(pack, tmp_path / "r.npy", "--chunk", "4")
    assert got.shape == want.shape == (len(TOKENS), SHAPE.vocab)
    assert np.isfinite(want).all() and rel(got, want) < FP32_REL


def test_synth_mix_streamed_equals_reference(mixed, tmp_path, capsys):
    """Streamed through a 4-slot ring and a cache too small for every expert: per-layer blob
    sizes of the mix (Q6_K-down layers larger) move through slots sized by max_blob."""
    _, pack, want = mixed
    got = _prefill(pack, tmp_path / "s.npy", "--vram", "2GiB", "--cache", "3MiB", "--ring", "4",
                   "--chunk", "4")
    out = capsys.readouterr().out
    assert "streamed" in out and "served from the cache" in out
    assert rel(got, want) < FP32_REL
