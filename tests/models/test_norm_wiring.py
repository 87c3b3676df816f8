"""The fused norms in the models' forwards (strata.models.layers.rms_norm / norm_rope, attention's
q/k path): which path a read takes, and that the two paths read alike.

- CPU (the suite): a read takes the torch twins, no kernel launch (the fp32 reference path is the
  code it was, bit for bit); pinned to "triton" it launches the kernels (the interpreter) for
  the layers' norms through rms_norm and for q and k of every layer through qk_norm_rope, and
  reads as the twins do within FP32_REL (fp32 on both sides, only the order of the mean
  square's sum differs).
- GPU: a bf16 read on CUDA launches the kernels by default and none pinned to "torch"; the two
  agree within BF16_Y_REL, the bound tests/engine/test_streaming_gpu.py holds two bf16 reads of
  one pack to (the norms round by at most a step apart, and bf16 dense math carries that
  through the layers). Both KV paths: model.prefill in chunks (KVCache: later chunks go to the
  flash op with the kernel's strides) and the engine (PromptKV: chunk_attention).
"""
from __future__ import annotations

import pytest
import torch

from strata.kernels import norm
from strata.kernels.norm import pin_norm
from strata.engine.load import load_model, resident_provider
from strata.models.moe import expert_ffn
from strata.packs.synth import ExpertFormats, synth_pack
from strata.shapes import get_preset

FP32_REL = 1e-5
BF16_Y_REL = 2e-2
TINY = get_preset("tiny")      # qwen3moe, L=2, D=64, H=4, Hkv=2, hd=16
SMALL = get_preset("small")    # qwen3moe, L=4, D=256, hd=64


def rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.fixture
def launches(monkeypatch):
    """Counts of the kernel launchers' calls, by name (the layers look them up per call)."""
    n = {"rms_norm": 0, "qk_norm_rope": 0}
    for name in n:
        fn = getattr(norm, name)

        def counted(*a, _fn=fn, _name=name, **kw):
            n[_name] += 1
            return _fn(*a, **kw)
        monkeypatch.setattr(norm, name, counted)
    return n


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(model, provider, tokens, the read pinned to the torch twins)."""
    pack = synth_pack(tmp_path_factory.mktemp("n") / "tiny.pack", TINY, ExpertFormats.of("Q8_0"),
                      progress=False)
    model = load_model(pack, dtype=torch.float32, ffn=expert_ffn("ref"))
    prov = resident_provider(pack)
    tok = torch.randint(0, TINY.vocab, (9,), generator=torch.Generator().manual_seed(2))
    with pin_norm("torch"):
        plain = model.prefill(tok, prov, chunk=CHUNK)
    return model, prov, tok, plain, pack


CHUNK, CHUNKS = 5, 2     # 9 tokens: a chunk of 5, then 4 after a prefix


def test_cpu_read_takes_the_torch_twins(tiny, launches):
    model, prov, tok, plain, _ = tiny
    assert torch.equal(model.prefill(tok, prov, chunk=CHUNK), plain)
    assert launches == {"rms_norm": 0, "qk_norm_rope": 0}


def test_cpu_read_pinned_to_the_kernels(tiny, launches):
    """Each chunk x layer: q and k through qk_norm_rope, the two layer norms (and, per chunk,
    the output norm) through rms_norm."""
    model, prov, tok, plain, _ = tiny
    with pin_norm("triton"):
        got = model.prefill(tok, prov, chunk=CHUNK)
    assert launches["qk_norm_rope"] == 2 * TINY.n_layer * CHUNKS
    assert launches["rms_norm"] >= 2 * TINY.n_layer * CHUNKS + 1
    assert rel(got, plain) < FP32_REL


def test_cpu_engine_pinned_to_the_kernels(tiny, launches):
    """The engine's KV path on the CPU with the Triton attention (interpreter): PromptKV hands
    the fused k back as [T, Hkv, hd] rows, and chunk_attention takes it beside v only if their
    strides agree (the contract apply_rope's layout kept). The KV is bf16, so a q/k element the
    other sum order moved can round to the neighbouring bf16 value: the reads agree within
    BF16_Y_REL, not FP32_REL."""
    from strata.engine.prefill import EngineConfig, PrefillEngine
    from strata.kernels.attention import pin_attention
    from strata.packs import Pack
    _, _, tok, _, pack = tiny
    eng = PrefillEngine(pack, EngineConfig(vram=1 << 30, cache=16 * Pack.open(pack).max_blob,
                                           max_prompt=16, device="cpu", chunk=CHUNK, ring=2,
                                           ffn="ref"))
    with pin_attention("triton"):
        with pin_norm("torch"):
            plain = eng.run(tok).logits
        assert launches["qk_norm_rope"] == 0
        with pin_norm("triton"):
            got = eng.run(tok).logits
    assert launches["qk_norm_rope"] >= 2 * TINY.n_layer * CHUNKS
    assert torch.isfinite(got).all() and rel(got, plain) < BF16_Y_REL


# -- on the GPU ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_pack(tmp_path_factory):
    return synth_pack(tmp_path_factory.mktemp("g") / "small.pack", SMALL,
                      ExpertFormats.of("Q8_0"), progress=False)


def _gpu_tokens(n=300):
    return torch.randint(0, SMALL.vocab, (n,), generator=torch.Generator().manual_seed(1))


@pytest.mark.gpu
def test_gpu_model_read_fused_vs_torch(small_pack, launches):
    """model.prefill in chunks of 96 (KVCache; chunks after the first attend through the flash
    op with the fused q/k's strides)."""
    model = load_model(small_pack, device="cuda:0", dtype=torch.bfloat16,
                       ffn=expert_ffn("kernel"))
    prov, tok = resident_provider(small_pack, "cuda:0"), _gpu_tokens()
    fused = model.prefill(tok, prov, chunk=96)
    chunks = 4
    assert launches["qk_norm_rope"] == 2 * SMALL.n_layer * chunks
    assert launches["rms_norm"] >= 2 * SMALL.n_layer * chunks
    seen = dict(launches)
    with pin_norm("torch"):
        plain = model.prefill(tok, prov, chunk=96)
    assert launches == seen                     # pinned: no launch
    assert torch.isfinite(fused).all() and rel(fused, plain) < BF16_Y_REL


@pytest.mark.gpu
def test_gpu_engine_read_fused_vs_torch(small_pack, launches):
    """The streaming engine (PromptKV: later chunks through chunk_attention, whose k and v must
    share strides: the fused k's [T, Hkv, hd] rows do, as apply_rope's did)."""
    from strata.engine.prefill import EngineConfig, PrefillEngine
    from strata.packs import Pack
    blob = Pack.open(small_pack).max_blob
    eng = PrefillEngine(small_pack, EngineConfig(vram=1 << 30, cache=40 * blob, ring=5,
                                                 chunk=96, max_prompt=300, ffn="kernel"))
    tok = _gpu_tokens()
    fused = eng.run(tok).logits
    assert launches["qk_norm_rope"] >= 2 * SMALL.n_layer * 4
    seen = dict(launches)
    with pin_norm("torch"):
        plain = eng.run(tok).logits
    assert launches == seen
    assert torch.isfinite(fused).all() and rel(fused, plain) < BF16_Y_REL


@pytest.mark.parametrize("name", ["tiny-qwen3next", "tiny-glm4moe", "tiny-minimax-m2"])
def test_partial_rotary_models_pinned_to_the_kernel(name, launches, tmp_path):
    """The partial-rotary models (Qwen3.5 / Qwen3-Next's gated attention with its per-head norm,
    GLM-4.5's optional one, MiniMax-M2's RoPE alone) send q and k of every full-attention layer
    through qk_norm_rope's partial path when pinned to the kernels, and read as the twins do
    within FP32_REL (only the mean square's sum order differs; RoPE-only layers not even that)."""
    shape = get_preset(name)
    assert shape.rot_dim < shape.head_dim
    pack = synth_pack(tmp_path / "p.pack", shape, ExpertFormats.of("Q8_0"), progress=False)
    model = load_model(pack, dtype=torch.float32, ffn=expert_ffn("ref"))
    prov = resident_provider(pack)
    tok = torch.randint(0, shape.vocab, (9,), generator=torch.Generator().manual_seed(3))
    with pin_norm("torch"):
        plain = model.prefill(tok, prov, chunk=CHUNK)
    assert launches["qk_norm_rope"] == 0
    with pin_norm("triton"):
        got = model.prefill(tok, prov, chunk=CHUNK)
    full = sum(shape.layer_kind(l) == "full" for l in range(shape.n_layer)) if shape.linear \
        else shape.n_layer
    assert launches["qk_norm_rope"] == 2 * full * CHUNKS
    assert rel(got, plain) < FP32_REL
