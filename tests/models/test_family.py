"""Parity with transformers for the DeepSeek / GLM-4.5 family (Glm4MoeForCausalLM,
DeepseekV3ForCausalLM): tiny random configs with a leading dense layer, a shared expert, grouped
sigmoid routing (4 groups, 2 kept) with a correction bias and routed scale 2.5; packed from the
HF folder and from a GGUF in llama.cpp's glm4moe / deepseek2 layout (the newer MLA k_b/v_b split
and the older kv_b), read all-resident and streamed (uneven chunks, a 3-slot ring, STAGE).

FP32_REL = 1e-5 (max |a - b| / max |b|): weights identical on both sides (BF16-exact, BF16
expert blobs), fp32 arithmetic in another order only (measured 5.5e-7 / 5.7e-7), as in
test_parity_packs; the routing is decisive (router x4, continuous bias), so no choice flips.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from strata.cli import main
from strata.engine.prefill import EngineConfig, PrefillEngine
from strata.packs import Pack
from tests.models.hf_family import DS_TINY, GLM_TINY, make_hf_family
from tests.models.hf_gguf_family import write_family_gguf
from tests.models.hf_tiny import hf_state

FP32_REL = 1e-5
TOKENS = [3, 250, 17, 17, 0, 128, 64, 9, 200, 31, 5, 77, 1, 42, 99, 7, 180]
SHAPES = {"glm": GLM_TINY, "ds": DS_TINY}


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.fixture(scope="module", params=sorted(SHAPES))
def family(request, tmp_path_factory):
    """(shape, HF logits of TOKENS, HF folder pack, GGUF pack(s) by layout)."""
    shape = SHAPES[request.param]
    hf = make_hf_family(shape, seed=3)
    d = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(d / "hf")
    with torch.no_grad():
        want = hf(torch.tensor([TOKENS])).logits[0].float().numpy()
    assert main(["pack", str(d / "hf"), "--quant", "BF16", "-o", str(d / "hf.pack")]) == 0
    sd = hf_state(hf)
    ggufs = {}
    for split in ((True, False) if shape.mla else (True,)):
        g = write_family_gguf(sd, shape, d / f"m{int(split)}.gguf", split_kv_b=split)
        out = d / f"gguf{int(split)}.pack"
        assert main(["pack", str(g), "-o", str(out)]) == 0
        ggufs["k_b/v_b" if split and shape.mla else "kv_b" if shape.mla else "glm4moe"] = out
    return shape, want, d / "hf.pack", ggufs


def _prefill(pack, tmp_path, *extra):
    out = tmp_path / "logits.npy"
    assert main(["prefill", str(pack), "--tokens", ",".join(map(str, TOKENS)), "--device", "cpu",
                 "--experts", "ref", "--dump-logits", str(out), *extra]) == 0
    return np.load(out)


def test_pack_keeps_the_family_shape(family):
    shape, _, hf_pack, ggufs = family
    for p in [hf_pack, *ggufs.values()]:
        pk = Pack.open(p)
        assert pk.shape.with_(max_pos=shape.max_pos) == shape   # HF says 512, GGUF 40960
        assert [pl.layout is None for pl in pk.layers] == [True, False, False]  # dense lead
        assert pk.experts(0).shape == (shape.n_expert, 0)


def test_hf_pack_matches_transformers(family, tmp_path):
    shape, want, hf_pack, _ = family
    assert rel(_prefill(hf_pack, tmp_path, "--chunk", "5"), want) < FP32_REL


def test_gguf_packs_match_transformers(family, tmp_path):
    shape, want, _, ggufs = family
    for layout, p in ggufs.items():
        assert rel(_prefill(p, tmp_path, "--chunk", "7"), want) < FP32_REL, layout


@pytest.mark.parametrize("ring,chunk,stage,blobs", [(3, 5, False, 12), (None, 6, True, 24)],
                         ids=["R3-C5", "STAGE-C6"])
def test_streamed_matches_transformers(family, monkeypatch, ring, chunk, stage, blobs):
    """The engine over a cache of 12 or 24 blobs (of 32; STAGE stages up to 16 a layer):
    uneven chunks, a tiny ring or STAGE; the dense layer has no cache slots and streams
    nothing; the cache ends as it began."""
    shape, want, hf_pack, ggufs = family
    if stage:
        monkeypatch.setenv("STRATA_STREAM_ALL_MIN", "1000")
    pack = Pack.open(next(iter(ggufs.values())))
    eng = PrefillEngine(pack, EngineConfig(vram=1 << 30, cache=blobs * pack.max_blob, max_prompt=64,
                                           device="cpu", ffn="ref", chunk=chunk, ring=ring))
    assert all(l != 0 for l, _ in eng.cache.layout.slot_owner)
    snap = eng.cache.buffer.clone()
    res = eng.run(torch.tensor(TOKENS))
    assert res.ring == ("STAGE" if stage else ring)
    assert rel(res.logits.numpy(), want) < FP32_REL
    assert res.stats.bytes_streamed > 0
    assert all(len(c.hit_fraction) == len(shape.moe_layers) for c in res.stats.chunks)
    assert torch.equal(eng.cache.buffer, snap)


def test_bf16_expert_gemm_resident(family, tmp_path):
    """The Triton expert GEMM (interpreter) under the family's routing: bf16 x and h in each of
    the 2 MoE layers, the bound of test_parity_packs (BF16_FFN_REL). One arch (CI time): both
    feed the kernel the same scaled grouped-routing weights."""
    shape, want, hf_pack, _ = family
    if not shape.mla:
        pytest.skip("the deepseek2 case runs the same kernel path")
    got = _prefill(hf_pack, tmp_path, "--chunk", "9").astype(np.float32)
    out = tmp_path / "k.npy"
    assert main(["prefill", str(hf_pack), "--tokens", ",".join(map(str, TOKENS)), "--device",
                 "cpu", "--experts", "kernel", "--chunk", "9", "--dump-logits", str(out)]) == 0
    assert rel(np.load(out), want) < 1e-2
    assert rel(got, want) < FP32_REL


def test_mla_streams_a_host_held_window(family):
    """deepseek2's KV is the latent (strata.models.mla): with --kv-resident 4 its older tokens
    live in host memory and stream back (PromptKV.attend_latent), and the logits equal those of
    every token resident in the same bf16 store, bit for bit (CPU; the full set of checks is
    tests/models/test_mla_kv_resident.py)."""
    shape, _, hf_pack, _ = family
    if not shape.mla:
        pytest.skip("GQA: tests/engine/test_kv.py")
    pack = Pack.open(hf_pack)
    cfg = dict(vram=1 << 30, cache=24 * pack.max_blob, max_prompt=64, device="cpu", ffn="ref",
               chunk=8, ring=2)
    part = PrefillEngine(pack, EngineConfig(kv_resident=4, **cfg)).run(torch.tensor(TOKENS))
    whole = PrefillEngine(pack, EngineConfig(kv_resident=64, **cfg)).run(torch.tensor(TOKENS))
    assert part.kv_streamed > 0 == whole.kv_streamed
    assert torch.equal(part.logits, whole.logits)


@pytest.mark.gpu
@pytest.mark.parametrize("ffn", ["kernel", "auto"])
def test_streamed_on_the_gpu(family, ffn):
    """CUDA: the streaming engine (pinned blobs, copy lane, the Triton expert GEMM, MLA's fused
    SDPA path) against the all-resident bf16 forward of the same pack; the bound of
    tests/engine/test_streaming_gpu (BF16_Y_REL, norm-relative: bf16 dense math)."""
    from strata.engine.load import load_model, resident_provider
    from strata.models.moe import expert_ffn
    shape, _, hf_pack, _ = family
    pack = Pack.open(hf_pack)
    eng = PrefillEngine(pack, EngineConfig(vram=1 << 30, cache=12 * pack.max_blob, ring=3,
                                           chunk=5, max_prompt=64, ffn=ffn))
    assert eng.host.pinned
    tok = torch.tensor(TOKENS)
    res = eng.run(tok)
    model = load_model(pack, device="cuda:0", dtype=torch.bfloat16, ffn=expert_ffn(ffn))
    want = model.prefill(tok, resident_provider(pack, "cuda:0"), chunk=5)
    got = res.logits.to(want.device)
    assert float((got - want).norm() / want.norm()) < 2e-2
    assert res.stats.bytes_streamed > 0


@pytest.mark.parametrize("shape", [GLM_TINY, DS_TINY], ids=["glm", "ds"])
def test_memory_pack_with_dense_layers_saves_what_it_serves(shape, tmp_path):
    """A synthetic MemoryPack of the family (dense first layer: no experts) written as a pack
    file reads back the same layers and gives the same logits, bit for bit."""
    from strata.engine.load import load_model, resident_provider
    from strata.models.moe import expert_ffn
    from strata.packs.memory import MemoryPack
    from strata.packs.synth import ExpertFormats
    mem = MemoryPack(shape, ExpertFormats.of("BF16"), distinct=2, variants=1, device="cpu")
    path = mem.save(tmp_path / "m.pack", progress=False, tokenizer=False)
    pk = Pack.open(path)
    assert [pl.blob_size for pl in pk.layers] == [pl.blob_size for pl in mem.layers]
    assert pk.layers[0].layout is None and pk.max_blob == mem.max_blob
    tok = torch.arange(11) % shape.vocab
    a = load_model(mem, ffn=expert_ffn("ref")).prefill(tok, resident_provider(mem), chunk=4)
    b = load_model(pk, ffn=expert_ffn("ref")).prefill(tok, resident_provider(pk), chunk=4)
    assert torch.isfinite(a).all() and torch.equal(a, b)
