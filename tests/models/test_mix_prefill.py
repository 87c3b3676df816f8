"""A llama.cpp-style mixed-type model end to end: `strata synth --mix Q4_K_M` writes a GGUF whose
layers differ in expert types (ffn_down Q6_K on use_more_bits layers, Q4_K elsewhere) and whose
dense tensors are Q4_K / Q6_K / Q5_0 (fallback) / F32; `strata pack` keeps each layer's layout;
`strata prefill` (resident, torch reference experts) gives the logits of the reference forward
run on weights decoded by gguf-py, independently of strata's decoders.

Identical weights on both sides (strata's decoders are bit-exact with gguf-py); what differs is the
order of fp32 sums (strata reads in chunks of 4, the reference the whole prompt at once). This
8-layer model amplifies that noise: the whole-prompt fp32 reference is itself 2.2e-5 from the same
forward with fp64 residuals, so a fixed 1e-5 passed on one CPU and failed on another (AVX-512
BLAS blocks its sums differently). The bound is derived from fp32's backward error propagated
through this model (tests/models/fp32_bound.py), and at the same chunking strata's logits equal
the reference's bit for bit here (the engine adds nothing of its own)."""
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
from strata.archs.names import dense_specs
from strata.shapes import PRESETS
from tests.models.fp32_bound import order_bound, rel

SHAPE = PRESETS["tiny"].with_(n_layer=8, d_model=256, d_expert=256, n_expert=4, top_k=2)
TOKENS = [3, 250, 17, 17, 0, 128, 64, 9, 200, 31, 5]


def gguf_weights(path, shape) -> dict[str, torch.Tensor]:
    """Every weight of the GGUF decoded by gguf-py to fp32 (dense by name, experts [E, rows, cols])."""
    r = gguf.GGUFReader(str(path))
    t = {x.name: x for x in r.tensors}

    def f32(name):
        x = t[name]
        return torch.from_numpy(np.asarray(
            gguf.quants.dequantize(np.asarray(x.data), x.tensor_type), np.float32).copy())
    w = {n: f32(n).reshape(shp) for n, shp in dense_specs(shape).items()}
    for i in range(shape.n_layer):
        for m in ("gate", "up", "down"):
            w[f"blk.{i}.ffn_{m}_exps.weight"] = f32(f"blk.{i}.ffn_{m}_exps.weight")
    return w


def reference(weights, shape=SHAPE, tokens=TOKENS, chunk=None, cls=Qwen3Moe) -> torch.Tensor:
    """Logits [T, V] of the fp32 reference forward of model class `cls` on `weights` (experts
    as F32 blobs), reading the prompt whole (chunk None, forward_torch: Qwen3Moe) or in chunks
    of `chunk` tokens."""
    dense = {n: weights[n] for n in dense_specs(shape)}
    lay = BlobLayout.make(shape.d_model, shape.d_expert, "F32")
    blobs = []
    for i in range(shape.n_layer):
        arena = torch.zeros(shape.n_expert, lay.size, dtype=torch.uint8)
        for m in lay.matrices:
            w = weights[f"blk.{i}.ffn_{m.name}_exps.weight"].contiguous()
            arena[:, m.offset:m.offset + m.nbytes] = w.reshape(shape.n_expert, -1).view(torch.uint8)
        blobs.append(arena)
    model = cls.from_tensors(shape, dense, ffn=moe_ffn_ref)
    prov = ResidentProvider(blobs, [lay] * shape.n_layer)
    if chunk is None:
        return forward_torch(model, prov, torch.tensor(tokens))
    return model.reference().prefill(torch.tensor(tokens), prov, chunk=chunk)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """(GGUF, pack, fp32 weights, whole-prompt reference logits, their derived fp32 bound)."""
    from strata.packs.synth import Mix, synth_gguf
    d = tmp_path_factory.mktemp("mix")
    g = synth_gguf(d / "m.gguf", SHAPE, Mix.stock("Q4_K_M", SHAPE), seed=3, progress=False)
    pack = d / "m.pack"
    assert main(["pack", str(g), "-o", str(pack)]) == 0
    w = gguf_weights(g, SHAPE)
    bound = order_bound(reference, w, tokens=len(TOKENS))
    return g, pack, w, reference(w).numpy(), bound


def _prefill(pack, out, *extra):
    assert main(["prefill", str(pack), "--tokens", ",".join(map(str, TOKENS)), "--device", "cpu",
                 "--experts", "ref", "--dump-logits", str(out), *extra]) == 0
    return np.load(out)


def test_synth_mix_pack_prefill_equals_reference(mixed, tmp_path):
    g, pack, _, want, bound = mixed
    types = {x.name: x.tensor_type.name for x in gguf.GGUFReader(str(g)).tensors}
    assert {types[f"blk.{i}.ffn_down_exps.weight"] for i in range(8)} == {"Q4_K", "Q6_K"}
    assert types["blk.0.attn_output.weight"] == "Q5_0" and types["output.weight"] == "Q6_K"
    pk = Pack.open(pack)
    assert len({pl.blob_size for pl in pk.layers}) == 2 and pk.max_blob == max(
        pl.blob_size for pl in pk.layers)
    got = _prefill(pack, tmp_path / "r.npy", "--chunk", "4")
    assert got.shape == want.shape == (len(TOKENS), SHAPE.vocab)
    assert np.isfinite(want).all() and rel(got, want) < bound


def test_synth_mix_streamed_equals_reference(mixed, tmp_path, capsys):
    """Streamed through a 4-slot ring and a cache too small for every expert: per-layer blob
    sizes of the mix (Q6_K-down layers larger) move through slots sized by max_blob."""
    _, pack, _, want, bound = mixed
    got = _prefill(pack, tmp_path / "s.npy", "--vram", "2GiB", "--cache", "3MiB", "--ring", "4",
                   "--chunk", "4")
    out = capsys.readouterr().out
    assert "streamed" in out and "served from the cache" in out
    assert rel(got, want) < bound


@pytest.mark.parametrize("extra", [(), ("--vram", "2GiB", "--cache", "3MiB", "--ring", "4")],
                         ids=["resident", "streamed"])
def test_same_chunking_as_the_reference_is_order_noise_free(mixed, tmp_path, extra):
    """Read in the reference's own chunks, strata runs the reference's fp32 operations on the same
    shapes: nothing but the BLAS's own blocking may differ, a far smaller error than the bound."""
    _, pack, w, _, bound = mixed
    got = _prefill(pack, tmp_path / "c.npy", "--chunk", "3", *extra)
    assert rel(got, reference(w, chunk=3).numpy()) < bound / 100


def test_the_bound_catches_bf16_rounding(mixed):
    """The derived bound is not vacuous: the same weights rounded once to bf16 (what a KV or
    activation kept in bf16 does to a forward) move the logits far past it."""
    _, _, w, want, bound = mixed
    bf16 = {k: v.to(torch.bfloat16).float() for k, v in w.items()}
    assert bound < 1e-3
    assert rel(reference(bf16).numpy(), want) > 10 * bound
