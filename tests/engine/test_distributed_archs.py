"""`strata prefill --distributed` for every architecture strata reads: Mixtral, GPT-OSS (sliding
windows, sinks, expert biases), GLM-4.5 and DeepSeek-V3 (a leading dense layer, a shared expert,
grouped sigmoid routing; DeepSeek's MLA cache). Each is a tiny seeded random transformers model
packed from its HF folder (BF16, as tests/models/test_parity_archs and test_family do); two gloo
ranks on the CPU, each holding only its own layers (the others' weights and KV on the meta
device), must give exactly the logits of the one-process read of the same flags (the layers run
the same code in the same order; the hand-off carries the model's fp32 hidden states)."""
from __future__ import annotations


import numpy as np
import pytest
import torch

from strata.cli import main
from tests.engine.test_distributed import one_process, ranks

T = 19     # chunks of 6: three full, one short


def _hf(arch: str):
    from tests.models.hf_archs import GPT_OSS_TINY, MIXTRAL_TINY, make_gpt_oss, make_mixtral
    from tests.models.hf_family import DS_TINY, GLM_TINY, make_hf_family
    return {"mixtral": lambda: make_mixtral(MIXTRAL_TINY, seed=2),
            "gpt-oss": lambda: make_gpt_oss(GPT_OSS_TINY, seed=2),
            "glm4moe": lambda: make_hf_family(GLM_TINY, seed=2),
            "deepseek2": lambda: make_hf_family(DS_TINY, seed=2)}[arch]()


def _arch_pack(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(request.param)
    _hf(request.param).save_pretrained(d / "hf")
    out = d / "m.pack"
    assert main(["pack", str(d / "hf"), "--quant", "BF16", "-o", str(out)]) == 0
    return request.param, out


@pytest.fixture(scope="module", params=["mixtral", "gpt-oss", "glm4moe", "deepseek2"])
def arch_pack(request, tmp_path_factory):
    return _arch_pack(request, tmp_path_factory)


# on the GPU the wirings with kernels of their own: GPT-OSS (window + sinks, the clamped-SwiGLU
# epilogue) and DeepSeek's MLA in the carve's scratch; Mixtral and GLM-4.5 share the GQA launches
@pytest.fixture(scope="module", params=["gpt-oss", "deepseek2"])
def gpu_arch_pack(request, tmp_path_factory):
    return _arch_pack(request, tmp_path_factory)


def _read_both(arch_pack, tmp_path, device: str, experts: str, *extra):
    arch, pack = arch_pack
    common = [pack, "--prompt-tokens", T, "--device", device, "--experts", experts, "--chunk", 6,
              "--ring", 2, "--cache", "200KiB", "--force", *extra]
    # gloo: the two ranks may share one GPU (NCCL refuses that)
    got = ranks(*common, "--vram", "1GiB", "--dist-schedule", "pipelined",
                "--distributed-backend", "gloo", "--dump-logits", tmp_path / "d.npy")
    for r, (rc, out, err) in enumerate(got):
        assert rc == 0, f"rank {r}: {err[-2000:]}"
    assert got[0][1] == "" and f"({arch}) on 2 ranks" in got[-1][1], got[-1][1]
    want = one_process(*common, out=tmp_path / "s.npy")
    have = np.load(tmp_path / "d.npy")
    assert have.shape == want.shape == (T, _vocab(pack))
    assert np.isfinite(want).all()
    return arch, have, want


def test_two_ranks_equal_the_one_process_read(arch_pack, tmp_path):
    """No warm-up here: the engine's-KV test below keeps it (its state is what a dry prompt
    could disturb), and on the CPU it only doubles the reads' time."""
    arch, have, want = _read_both(arch_pack, tmp_path, "cpu", "ref", "--no-warmup")
    assert have.dtype == want.dtype and (have == want).all(), arch


def test_two_ranks_equal_the_one_process_read_with_the_engines_kv(arch_pack, tmp_path):
    """--kv int8 --kv-resident 8: the engine's PromptKV on each rank for its layers only, int8
    codes, the tokens before the last 8 held in host memory and staged back through the rank's
    carve each chunk (MLA: the latent's PromptKV)."""
    arch, have, want = _read_both(arch_pack, tmp_path, "cpu", "ref", "--kv", "int8",
                                  "--kv-resident", 8)
    assert have.dtype == want.dtype and (have == want).all(), arch


@pytest.mark.gpu
def test_two_ranks_equal_the_one_process_read_on_the_gpu(gpu_arch_pack, tmp_path):
    """The same on CUDA through the Triton kernels (MLA's attention in the carve's scratch), two
    gloo ranks sharing the GPU: every layer runs the same launches on the same inputs as in one
    process, and the hand-off carries the model's bf16 hidden states unchanged."""
    arch, have, want = _read_both(gpu_arch_pack, tmp_path, "cuda", "kernel")
    assert have.dtype == want.dtype and (have == want).all(), arch


def _vocab(pack) -> int:
    from strata.packs import Pack
    return Pack.open(pack).shape.vocab


def test_a_stage_holds_only_its_own_layers(arch_pack):
    """The stage model's other layers (and the embeddings or head it does not use) sit on the
    meta device: never read from the pack, no memory; its cache likewise."""
    from strata.engine.distributed import load_stage
    from strata.packs import Pack
    arch, pack = arch_pack
    s = Pack.open(pack).shape
    own = range(1, s.n_layer)
    model = load_stage(pack, own, device=torch.device("cpu"), dtype=torch.float32, ffn=None)
    assert [d.type for d in model.layer_devices] == ["meta"] + ["cpu"] * (s.n_layer - 1)
    assert model.tok_embd.device.type == "meta" and model.lm_head.device.type == "cpu"
    cache = model.new_cache(capacity=T)
    stores = ([cache.c, cache.k_pe] if s.mla else [cache.k, cache.v])
    for per_layer in stores:
        assert per_layer[0].device.type == "meta"
        assert all(t.device.type == "cpu" for t in per_layer[1:])
    # the engine's own KV likewise: layer 0's host and resident stores hold nothing
    from strata.engine.engine_config import EngineConfig, kv_policy
    from strata.engine.prompt_kv import new_prompt_kv
    from strata.planning import model_sizes
    cfg = EngineConfig(vram=1 << 30, device="cpu", kv="int8", kv_resident=8)
    sizes = model_sizes(s, kv=kv_policy(cfg))
    stage = torch.zeros(1 << 20, dtype=torch.uint8)
    kv = new_prompt_kv(s, cfg, sizes, T, layers=own, vram=1 << 30,
                       devices=model.layer_devices, stages={l: stage for l in own}, lanes={},
                       pin=False)
    assert all(t.device.type == "meta" for t in kv.hosted[0] + kv.resident[0])
    assert kv.host_bytes == sizes.kv_host_all(T, own) > 0
    assert kv.vram_bytes == sizes.kv_vram(T, own)


def test_mla_int8_kv_is_the_models_own_cache(arch_pack):
    """MLA keeps int8 in its own cache (as the one-process engine does): not refused."""
    from strata.engine.session import PromptSession
    from strata.engine.engine_config import EngineConfig
    from strata.engine.prompt_kv import uses_prompt_kv
    from strata.packs import Pack
    arch, pack = arch_pack
    s = Pack.open(pack).shape
    int8 = EngineConfig(vram=1 << 30, device="cpu", kv="int8")
    assert uses_prompt_kv(s, int8) is (not s.mla)
    if s.mla:
        from strata.engine.distributed import load_stage
        model = load_stage(pack, range(s.n_layer), device=torch.device("cpu"),
                           dtype=torch.float32, ffn=None)
        session = PromptSession([], [], None, T, 0.9, shape=s, host=None, layouts=None,
                                land=None, slab=False)
        cache = session.new_kv(T, lambda n, stages: None, model, "int8")   # the stage's KV
        assert cache.kv == "int8" and cache.c[0].dtype == torch.int8
