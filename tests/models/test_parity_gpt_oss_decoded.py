"""GPT-OSS's experts (MXFP4 blobs with fp32 biases, clamped SwiGLU) read through decode-once: the
tiny seeded GPT-OSS of tests/models/hf_archs.py, packed from an MXFP4 GGUF, gives with
`--experts decoded` and `auto` the fused kernel's logits, all-resident and streamed.

Bounds: bit for bit against "kernel" at one pinned tile and the decode dot (the fused kernel
rounds each decoded weight to bf16 before the dot, as the decode writes it; the biases arrive as
the same fp32 bits: tests/kernels/test_moe_decoded_biased.py); against the fused GEMM's torch
twin, BF16_FFN_REL as test_parity_archs' Triton GEMM (x and h rounded to bf16 in every MoE
layer). How far the streamed read may sit from the resident one, and both from transformers'
logits, the fp32 reference FFN's tests hold (test_parity_archs: test_streamed_equals_resident,
test_gguf_pack's gpt-oss-mxfp4); here the decoded FFN only has to be the kernel's.
"""
from __future__ import annotations

import pytest
import torch

from strata.cli import main
from strata.engine.load import load_model, resident_provider
from strata.kernels import pin_tile
from strata.models.moe import expert_ffn
from tests.models.hf_archs import (GPT_OSS_TINY, make_gpt_oss, requantize_gpt_oss, state,
                                   write_gpt_oss_gguf)
from tests.models.test_parity_archs import BF16_FFN_REL, TOKENS, rel

# N is 96 (down) and 128 (gate | up): 64 leaves a part tile, and K 64 / 96 two or three steps
SAME_TILE = dict(schedule="dp", BLOCK_N=64, BLOCK_K=32, dot="decode")


@pytest.fixture(scope="module")
def oss(tmp_path_factory):
    """Its MXFP4 pack (HF requantized first: the GGUF holds what HF then holds)."""
    hf = make_gpt_oss(GPT_OSS_TINY, seed=6)
    requantize_gpt_oss(hf, "MXFP4")   # HF holds exactly what the blobs decode to
    d = tmp_path_factory.mktemp("oss")
    g = write_gpt_oss_gguf(state(hf), GPT_OSS_TINY, d / "oss.gguf", "MXFP4")
    assert main(["pack", str(g), "-o", str(d / "oss.pack")]) == 0
    return d / "oss.pack"


@pytest.fixture
def decoded_wins(monkeypatch):
    """A measured table in which decode-once is the faster path at every row count, on a
    device named here; returns the list the decoded FFN's calls are counted in."""
    from strata.kernels.moe import choices
    from strata.kernels.moe import decoded as dec_mod
    pts = [{"rows": r, "tflops": {"kernel": 1.0, "decoded": 2.0}} for r in (0.5, 4096)]
    monkeypatch.setattr(choices, "table", lambda: choices.FfnTable({"GPU": {"MXFP4": pts}}, ()))
    monkeypatch.setattr(choices, "device_name", lambda i: "GPU")
    calls, real = [], dec_mod.moe_ffn_decoded

    def counted(*a, **k):
        calls.append(1)
        return real(*a, **k)
    monkeypatch.setattr(dec_mod, "moe_ffn_decoded", counted)
    return calls


def resident(pack, name, dtype=torch.float32):
    model = load_model(pack, dtype=dtype, ffn=expert_ffn(name))
    return model.prefill(torch.tensor(TOKENS), resident_provider(pack), chunk=5)


def test_decoded_and_auto_read_gpt_oss_as_the_kernel(oss, decoded_wins):
    pack = oss
    from strata.packs import Pack
    assert not Pack.open(pack).layers[0].layout.plain
    with pin_tile(**SAME_TILE):
        kernel = resident(pack, "kernel")
        decoded = resident(pack, "decoded")
        n = len(decoded_wins)
        auto = resident(pack, "auto")
    assert n > 0 and len(decoded_wins) == 2 * n   # auto took the decoded path every call
    assert not torch.isnan(decoded).any()
    assert torch.equal(decoded, kernel) and torch.equal(auto, kernel)
    assert rel(decoded.numpy(), resident(pack, "torch").numpy()) < BF16_FFN_REL


def test_streamed_decoded_reads_gpt_oss_as_the_kernel(oss, monkeypatch):
    """The streaming engine (a 2-slot ring < E = 8: several passes a layer, 8 tokens in chunks
    of 5, the last one short) with the decoded FFN: its wdec, sized by the planner, holds each
    pass's biased BF16 blobs (a short one would leave experts undecoded: a StrataError naming
    them); no chunk reads the device from the host outside a declared read (the bias copy
    included: tests/engine/test_syncs.py's guard); the logits are the fused kernel's streamed
    ones, bit for bit."""
    from strata.engine.prefill import EngineConfig, PrefillEngine
    from strata.engine.syncs import SyncGuard
    from strata.packs import Pack
    from tests.engine.test_syncs import watched_chunks
    pack = oss
    out, guards = {}, []

    def leave():
        guards[-1].__exit__(None, None, None)
    with pin_tile(**SAME_TILE), \
            watched_chunks(monkeypatch, lambda: guards.append(SyncGuard().__enter__()), leave):
        for name in ("kernel", "decoded"):
            cfg = EngineConfig(vram=1 << 30, cache=16 * Pack.open(pack).max_blob,
                               max_prompt=32, device="cpu", ffn=name, chunk=5, ring=2)
            res = PrefillEngine(pack, cfg).run(torch.tensor(TOKENS[:8]))
            assert res.ring == 2 and res.stats.bytes_streamed > 0
            out[name] = res.logits
    assert len(guards) == 4
    for g in guards:
        assert not g.caught, g.report()
    assert not torch.isnan(out["decoded"]).any()
    assert torch.equal(out["decoded"], out["kernel"])


@pytest.mark.gpu
def test_gpu_decoded_and_auto_read_gpt_oss_as_the_kernel(oss):
    """On the GPU, all-resident, fp32 dense: "decoded" and "auto" (the packaged table's choice)
    within BF16_FFN_REL of "kernel" (each is within it of the fused GEMM's torch twin; the two
    GEMMs may sum a tile's products in another MMA order there, so bit-exactness is printed, not
    required)."""
    pack = oss
    tok = torch.tensor(TOKENS)
    prov = resident_provider(pack, "cuda")
    got = {}
    with pin_tile(**SAME_TILE):
        for name in ("kernel", "decoded", "auto"):
            model = load_model(pack, device="cuda", dtype=torch.float32, ffn=expert_ffn(name))
            got[name] = model.prefill(tok, prov, chunk=5).cpu()
    print(f"decoded == kernel bit for bit: {torch.equal(got['decoded'], got['kernel'])}")
    for name in ("decoded", "auto"):
        assert not torch.isnan(got[name]).any()
        assert rel(got[name].numpy(), got["kernel"].numpy()) < BF16_FFN_REL, name
