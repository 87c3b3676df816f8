"""Logits parity with transformers for a tiny Qwen3-MoE in each of llama.cpp's stock mixes
(Q4_K_M, Q5_K_M, Q3_K_M, Q2_K, IQ4_XS): `strata synth --mix` writes the GGUF as llama.cpp lays the
mix out (K-/I-quant experts and dense tensors, per-layer ffn_down types, fallbacks), `strata pack`
packs it, `strata prefill` reads it, and transformers' Qwen3MoeForCausalLM runs on the same
weights decoded by gguf-py.

Why random blocks and not the HF model quantized: neither strata nor gguf-py has a quantizer for
Q2_K..Q6_K or IQ4_XS (strata quantizes Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/MXFP4/Q2_0; see
strata.formats.codec.QUANTIZERS), so the weights are synth's random valid blocks and the parity is
against transformers run on their dequantized values - exactly what the blocks hold.

Bounds (normalized max |a - b| / max |b|), named per mix. Both sides hold identical fp32 weights
(strata's decoders are bit-exact with gguf-py's, tests/test_formats.py); only fp32 arithmetic
order differs (strata chunks the prompt and sums the K experts in its own order; HF's SDPA
softmax; HF's grouped expert GEMM), ~4e-7 over two layers in tests/models/test_qwen3moe. Over the
8 layers here (D = 256) measured: Q4_K_M 6.7e-6, Q5_K_M 2.9e-6, Q3_K_M 3.3e-6, Q2_K 3.4e-6,
IQ4_XS 1.3e-6. The bound is the suite's fp32 bound, 1e-5, for every mix: the weights' precision
does not enter (the same numbers on both sides), and one flipped expert choice - what a decoder or
layout bug causes - moves the logits by > 1e-3.
"""
from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from strata.cli import main
from strata.packs import Pack
from strata.packs.synth import Mix, synth_gguf
from strata.shapes import PRESETS
from tests.models.hf_tiny import HF_TO_GGUF, make_hf_model

# D = F = 256: whole K-quant super-blocks (llama.cpp falls back to legacy types otherwise);
# 16 experts so the 8-expert (Mixtral) rule for attn_k/attn_v does not apply.
SHAPE = PRESETS["tiny"].with_(n_layer=8, d_model=256, d_expert=256, n_expert=16, top_k=2,
                              head_dim=64)
BOUND = {"Q4_K_M": 1e-5, "Q5_K_M": 1e-5, "Q3_K_M": 1e-5, "Q2_K": 1e-5, "IQ4_XS": 1e-5}
TOKENS = [3, 250, 17, 17, 0, 128, 64, 9, 200, 31, 5, 77, 1]


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(np.abs(a - b).max() / np.abs(b).max())


def hf_from_gguf(path, shape):
    """A transformers Qwen3MoeForCausalLM (fp32) holding the GGUF's weights decoded by gguf-py."""
    r = gguf.GGUFReader(str(path))
    t = {x.name: x for x in r.tensors}

    def f32(name):
        x = t[name]
        w = np.asarray(gguf.quants.dequantize(np.asarray(x.data), x.tensor_type), np.float32)
        return torch.from_numpy(w.copy())
    hf = make_hf_model(shape, seed=0)
    sd = {"model.embed_tokens.weight": f32("token_embd.weight"),
          "model.norm.weight": f32("output_norm.weight"), "lm_head.weight": f32("output.weight")}
    for i in range(shape.n_layer):
        pre = f"model.layers.{i}."
        for hfn, gg in HF_TO_GGUF.items():
            sd[pre + hfn + ".weight"] = f32(f"blk.{i}.{gg}.weight")
        gate, up, down = (f32(f"blk.{i}.ffn_{m}_exps.weight") for m in ("gate", "up", "down"))
        sd[pre + "mlp.experts.gate_up_proj"] = torch.cat([gate, up], dim=1)   # [E, 2F, D]
        sd[pre + "mlp.experts.down_proj"] = down                              # [E, D, F]
    own = hf.state_dict()
    for k, v in sd.items():
        assert k in own and own[k].shape == v.reshape(own[k].shape).shape, k
        sd[k] = v.reshape(own[k].shape)
    missing = set(own) - set(sd)
    assert not missing, f"HF parameters left random: {sorted(missing)[:4]}"
    hf.load_state_dict(sd)
    return hf.eval()


@pytest.mark.parametrize("mix", list(BOUND))
def test_stock_mix_logits_match_transformers(mix, tmp_path):
    g = synth_gguf(tmp_path / f"{mix}.gguf", SHAPE, Mix.stock(mix, SHAPE), seed=11,
                   progress=False)
    types = {x.name: x.tensor_type.name for x in gguf.GGUFReader(str(g)).tensors}
    want_types = Mix.stock(mix, SHAPE)
    assert [types[f"blk.{i}.ffn_down_exps.weight"] for i in range(SHAPE.n_layer)] == \
        [f.down for f in want_types.experts], "the GGUF holds the mix's per-layer types"
    pack = tmp_path / f"{mix}.pack"
    assert main(["pack", str(g), "-o", str(pack)]) == 0
    assert [pl.layout.matrices[2].fmt.name for pl in Pack.open(pack).layers] == \
        [f.down for f in want_types.experts]
    out = tmp_path / "l.npy"
    assert main(["prefill", str(pack), "--tokens", ",".join(map(str, TOKENS)), "--device", "cpu",
                 "--experts", "ref", "--chunk", "5", "--dump-logits", str(out)]) == 0
    with torch.no_grad():
        want = hf_from_gguf(g, SHAPE)(torch.tensor([TOKENS])).logits[0].numpy()
    got = np.load(out)
    assert np.isfinite(want).all() and got.shape == want.shape
    assert rel(got, want) < BOUND[mix], f"{mix}: {rel(got, want):.2e}"
