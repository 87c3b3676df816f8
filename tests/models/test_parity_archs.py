"""Mixtral and GPT-OSS through the model seam: a tiny seeded random transformers model, packed
from its HF folder and from GGUFs written in llama.cpp's layouts (tests/models/hf_archs.py),
gives transformers' logits at every position, all-resident and streamed.

Tolerances (normalized: max |a - b| / max |b|), as for Qwen3-MoE (test_parity_packs):
- FP32_REL = 1e-5 with the fp32 reference expert FFN: identical weights on both sides (BF16-exact
  HF weights; for Q8_0/MXFP4 HF holds the dequantized weights), fp32 arithmetic in another order
  only (measured ≈ 6e-7 Mixtral, 1.5e-6 GPT-OSS: its sinks, biases and YaRN add ops).
- BF16_FFN_REL = 1e-2 through the Triton expert GEMM (interpreter): the kernel rounds x and h to
  bf16 in every MoE layer (see test_parity_packs).
Streamed runs (the PrefillEngine: uneven chunks, a ring smaller than a layer's experts, STAGE)
must equal the all-resident forward within FP32_REL (only the order of fp32 sums differs).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from strata.cli import main
from strata.engine.load import load_model, resident_provider
from strata.models.moe import expert_ffn
from strata.shapes import get_preset
from tests.models.hf_archs import (GPT_OSS_TINY, MIXTRAL_TINY, make_gpt_oss, make_mixtral,
                                   requantize_gpt_oss, state, write_gpt_oss_gguf,
                                   write_mixtral_gguf)
from tests.models.hf_tiny import requantize_experts

FP32_REL = 1e-5
BF16_FFN_REL = 1e-2

TOKENS = [3, 250, 17, 17, 0, 128, 64, 9, 200, 31, 5, 77, 1]
ARCHS = {"mixtral": (make_mixtral, MIXTRAL_TINY), "gpt-oss": (make_gpt_oss, GPT_OSS_TINY)}


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(np.abs(a - b).max() / np.abs(b).max())


def hf_logits(hf, tokens=TOKENS):
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0].float().numpy()


def _pack(args, out):
    assert main(["pack", *map(str, args), "-o", str(out)]) == 0, f"strata pack {args} failed"
    return out


def _prefill(pack, tmp_path, *extra):
    out = tmp_path / "logits.npy"
    assert main(["prefill", str(pack), "--tokens", ",".join(map(str, TOKENS)),
                 "--dump-logits", str(out), *extra]) == 0
    return np.load(out)


@pytest.fixture(scope="module", params=list(ARCHS))
def hf_pack(request, tmp_path_factory):
    """(arch, HF model, its BF16 pack from the HF folder, HF logits)."""
    make, shape = ARCHS[request.param]
    hf = make(shape, seed=5)
    d = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(d / "hf")
    pack = _pack([d / "hf", "--quant", "BF16"], d / "hf.pack")
    return request.param, hf, pack, hf_logits(hf)


def test_hf_folder_pack(hf_pack, tmp_path):
    arch, hf, pack, ref = hf_pack
    got = _prefill(pack, tmp_path, "--device", "cpu", "--experts", "ref", "--chunk", "5")
    assert got.shape == (len(TOKENS), ARCHS[arch][1].vocab)
    assert rel(got, ref) < FP32_REL


def test_triton_expert_gemm(hf_pack, tmp_path):
    """The Triton moe_ffn with GPT-OSS's bias + clamped-SwiGLU epilogue, chunked unevenly."""
    arch, hf, pack, ref = hf_pack
    if arch == "mixtral":   # its experts are the plain silu FFN test_parity_packs runs
        pytest.skip("Mixtral's expert FFN is Qwen3-MoE's (tests/models/test_parity_packs.py)")
    got = _prefill(pack, tmp_path, "--device", "cpu", "--experts", "kernel", "--dtype",
                   "float32", "--chunk", "6")
    assert rel(got, ref) < BF16_FFN_REL


GGUF_CASES = [  # id, arch, expert format, Mixtral's per-expert 2-D tensors
    ("mixtral-exps-bf16", "mixtral", "BF16", False),
    ("mixtral-per-expert-q8_0", "mixtral", "Q8_0", True),
    ("gpt-oss-bf16", "gpt-oss", "BF16", False),
    ("gpt-oss-mxfp4", "gpt-oss", "MXFP4", False),
]


@pytest.mark.parametrize("case", GGUF_CASES, ids=lambda c: c[0])
def test_gguf_pack(tmp_path, case):
    cid, arch, fmt, per_expert = case
    make, shape = ARCHS[arch]
    hf = make(shape, seed=6)
    if fmt != "BF16":   # HF holds exactly what the quantized blobs decode to
        (requantize_gpt_oss if arch == "gpt-oss" else requantize_experts)(hf, fmt)
    if arch == "mixtral":
        g = write_mixtral_gguf(state(hf), shape, tmp_path / f"{cid}.gguf", fmt, per_expert)
    else:
        g = write_gpt_oss_gguf(state(hf), shape, tmp_path / f"{cid}.gguf", fmt)
    pack = _pack([g], tmp_path / f"{cid}.pack")
    got = _prefill(pack, tmp_path, "--device", "cpu", "--experts", "ref", "--chunk", "4")
    assert rel(got, hf_logits(hf)) < FP32_REL


def _engine(pack, **kw):
    from strata.engine.prefill import EngineConfig, PrefillEngine
    from strata.packs import Pack
    kw.setdefault("ffn", "ref")
    cfg = EngineConfig(vram=1 << 30, cache=16 * Pack.open(pack).max_blob, max_prompt=32,
                       device="cpu", **kw)
    return PrefillEngine(pack, cfg)


@pytest.mark.parametrize("mode", ["ring2-chunk5", "stage-chunk4"])
def test_streamed_equals_resident(hf_pack, mode, monkeypatch):
    """A 16-blob cache lending a 2-slot ring (< E = 8: several passes per layer), 13 tokens in
    chunks of 5 (the last one short); STAGE stages only the routed experts of each chunk."""
    arch, hf, pack, ref = hf_pack
    model = load_model(pack, dtype=torch.float32, ffn=expert_ffn("ref"))
    resident = model.prefill(torch.tensor(TOKENS), resident_provider(pack), chunk=None)
    assert rel(resident.numpy(), ref) < FP32_REL
    if mode.startswith("stage"):
        monkeypatch.setenv("STRATA_STREAM_ALL_MIN", "1000")   # every chunk "small": STAGE
        res = _engine(pack, chunk=4).run(torch.tensor(TOKENS))
        assert res.ring == "STAGE"
    else:
        res = _engine(pack, chunk=5, ring=2).run(torch.tensor(TOKENS))
        assert res.ring == 2
    assert res.stats.bytes_streamed > 0
    assert rel(res.logits.numpy(), resident.numpy()) < FP32_REL


def test_gpt_oss_blobs_carry_the_biases(hf_pack):
    """The streamed unit is the whole expert: a GPT-OSS blob holds its matrices and biases."""
    arch, hf, pack, ref = hf_pack
    from strata.packs import Pack
    lay = Pack.open(pack).layers[0].layout
    if arch != "gpt-oss":
        assert lay.bias is None and lay.plain
        return
    s = GPT_OSS_TINY
    assert lay.bias is not None and lay.act.name == "swiglu_oai" and lay.act.limit == 2.0
    assert lay.size >= lay.bias.offset + 4 * (2 * s.d_expert + s.d_model)
    sd = state(hf)
    blob = Pack.open(pack).experts(1)[3]                             # layer 1, expert 3
    off, n = lay.bias.part("up")
    up = blob[off:off + 4 * n].view(torch.float32)
    assert torch.equal(up, sd["model.layers.1.mlp.experts.gate_up_proj_bias"][3, 1::2])


def test_presets_plan_and_window():
    s = get_preset("gpt-oss-120b")
    assert [s.layer_window(l) for l in range(4)] == [128, 0, 128, 0]
    assert get_preset("mixtral-8x7b").layer_window(0) == 0
    from strata.blob import BlobLayout
    lay = BlobLayout.for_shape(s, "MXFP4")
    # MXFP4: 17 bytes per 32 weights; biases fp32 (2F + D); each region 256-aligned
    assert lay.bias.nbytes == 4 * (2 * 2880 + 2880)
    assert lay.size == lay.bias.offset + 34560 and lay.down.nbytes == 2880 * 2880 // 32 * 17
    assert 60e9 < lay.size * s.n_expert * s.n_layer < 62e9    # "about 60 GB of experts"
    assert main(["plan", "--preset", "gpt-oss-120b", "--quant", "MXFP4", "--vram", "24GiB",
                 "--prompt-tokens", "8192"]) == 0
    assert main(["plan", "--preset", "mixtral-8x7b", "--vram", "24GiB"]) == 0


def test_yarn_matches_transformers():
    """strata's YaRN frequencies and attention factor are HF's, truncate on and off."""
    from transformers import GptOssConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from strata.models.layers import yarn_inv_freq
    for truncate in (False, True):
        cfg = GptOssConfig(head_dim=64, num_attention_heads=64, hidden_size=2880,
                           max_position_embeddings=131072,
                           rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0,
                                            "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                            "truncate": truncate,
                                            "original_max_position_embeddings": 4096})
        want, want_attn = ROPE_INIT_FUNCTIONS["yarn"](cfg, "cpu")
        got, attn = yarn_inv_freq(64, 150000.0, 32.0, 4096, 32.0, 1.0, truncate)
        assert torch.equal(got, want) and attn == pytest.approx(want_attn, rel=1e-12)


def test_unreadable_sources_are_one_line(tmp_path, capsys):
    """A dense llama GGUF (no experts) and OpenAI's MXFP4 safetensors release: exit 2, one line
    saying what to do."""
    import json

    import gguf
    w = gguf.GGUFWriter(str(tmp_path / "dense.gguf"), "llama")
    w.add_block_count(1)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_tensor("token_embd.weight", np.zeros((32, 64), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert main(["pack", str(tmp_path / "dense.gguf"), "-o", str(tmp_path / "d.pack")]) == 2
    assert "dense llama model" in capsys.readouterr().err
    hf = tmp_path / "oss"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "gpt_oss",
                                                "quantization_config": {"quant_method": "mxfp4"}}))
    assert main(["pack", str(hf), "-o", str(tmp_path / "o.pack")]) == 2
    err = capsys.readouterr().err
    assert "MXFP4 blocks" in err and "convert_hf_to_gguf" in err and len(err.splitlines()) == 1


@pytest.mark.gpu
def test_gpu_resident_prefill(hf_pack):
    """On the GPU: fp32 dense + Triton GEMM within BF16_FFN_REL of the CPU's fp32 reference
    read; bf16 dense (GPT-OSS's window and sinks then run chunk_attention over the cache) agrees
    on the top token at >= 90% of positions with a median error under 2 BF16_FFN_REL (as
    test_parity_packs' GPU case). The reference is strata's CPU read, which test_hf_folder_pack
    holds to transformers' logits within FP32_REL under the tested transformers (>= 5.24). The
    GPU image carries transformers 5.17, outside the tested range: there strata's CPU read of
    its GPT-OSS save is ~1x the logits' size away from its own forward (a checkpoint layout or
    forward strata was not checked against), so HF's logits there would test the image's
    transformers, not this GPU path."""
    arch, hf, pack, _ = hf_pack
    tok = torch.tensor(TOKENS)
    cpu = load_model(pack, device="cpu", dtype=torch.float32, ffn=expert_ffn("ref"))
    ref = cpu.prefill(tok, resident_provider(pack, "cpu"), chunk=5).numpy()
    model = load_model(pack, device="cuda", dtype=torch.float32, ffn=expert_ffn("kernel"))
    prov = resident_provider(pack, "cuda")
    assert rel(model.prefill(tok, prov, chunk=5).cpu().numpy(), ref) < BF16_FFN_REL
    bf = load_model(pack, device="cuda", dtype=torch.bfloat16, ffn=expert_ffn("kernel"))
    got = bf.prefill(tok, prov, chunk=5).cpu().numpy()
    per_pos = np.abs(got - ref).max(-1) / np.abs(ref).max()
    assert np.median(per_pos) < 2 * BF16_FFN_REL
    assert (got.argmax(-1) == ref.argmax(-1)).mean() >= 0.9
