"""The streaming engine on real GPUs: the Triton FFNs, CUDA copy lanes and events, pinned blobs.

Skipped without CUDA; the two-GPU case also needs a second device (nvidia-h200-x2).
"""
import pytest
import torch

from strata.engine.prefill import EngineConfig, PrefillEngine
from strata.engine.load import load_model, resident_provider
from strata.models.moe import expert_ffn
from strata.packs.synth import ExpertFormats, synth_pack
from strata.shapes import get_preset

BF16_Y_REL = 2e-2   # bf16 dense math on the GPU, y rounded per layer in the resident forward

SHAPE = get_preset("small")      # L=4, D=256, E=16, K=4, F=128


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    return synth_pack(tmp_path_factory.mktemp("g") / "small.pack", SHAPE,
                      ExpertFormats.of("Q8_0", down="Q4_0"), progress=False)


def rel(a, b):
    return float((a - b).norm() / b.norm())


def run_and_compare(pack, devices, ffn, ring=5, chunk=96, n=300):
    from strata.packs import Pack
    blob = Pack.open(pack).max_blob
    eng = PrefillEngine(pack, EngineConfig(vram=[1 << 30] * len(devices), cache=40 * blob,
                                           devices=devices, ring=ring, chunk=chunk,
                                           max_prompt=n, ffn=ffn))
    assert eng.host.pinned
    snap = [p.cache.buffer.clone() for p in eng.parts]
    tok = torch.randint(0, SHAPE.vocab, (n,), generator=torch.Generator().manual_seed(1))
    res = eng.run(tok)
    model = load_model(pack, device="cuda:0", dtype=torch.bfloat16, ffn=expert_ffn(ffn))
    want = model.prefill(tok, resident_provider(pack, "cuda:0"), chunk=chunk)
    assert rel(res.logits.to(want.device), want) < BF16_Y_REL
    assert res.stats.bytes_streamed > 0 and res.stats.h2d_gbps > 0
    for p, s in zip(eng.parts, snap):
        assert torch.equal(p.cache.buffer, s)
    return res


@pytest.mark.gpu
@pytest.mark.parametrize("ffn", ["kernel", "decoded", "auto"])
def test_streamed_on_the_gpu(pack, ffn):
    run_and_compare(pack, ["cuda:0"], ffn)


@pytest.mark.gpu
def test_two_gpus(pack):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    res = run_and_compare(pack, ["cuda:0", "cuda:1"], "auto")
    assert len(res.plan.participants) == 2
