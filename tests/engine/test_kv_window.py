"""A tiny GPT-OSS read through the engine with its sliding layers keeping only their window's KV
(strata.models.kv), against the old read that kept every token and only masked, on the CPU;
and `strata plan` showing the smaller KV.

The old read is the same engine with every layer's KV described as full (kv_windows -> zeros):
the sliding layers then keep, split and stage every token as the full ones do, and mask.

- PromptKV (--kv int8, or --kv-resident): the attention is chunk_attention_torch, which sums
  the same visible terms over fewer keys (the old read adds exact zeros for the keys outside
  the window): fp32 reduction noise, then the bf16 rounding of the attention output
  (tests/models/test_kv_window.py bounds one chunk: fp32 noise plus at most one bf16 step).
  Measured: the same logits bit for bit in every case here; held to a tenth of the bf16
  attention's own distance from the fp32 reference (a few flipped roundings, against the
  rounding of every element), which a wrong key would exceed by far.
- The model's own cache (bf16 default, all resident; fp32 on the CPU): masked_attention in fp32
  over [kept tail + chunk] against the old [every key + chunk]: within FP32_REL, the bound the
  parity tests use for fp32 arithmetic in another order.

Shape: 4 layers (0 and 2 slide over W = 5, 1 and 3 attend fully), 23 tokens; chunks 3 < W,
5 = W, 8 > W, 7 > W (uneven: the last one 2); --kv-resident 2 spills the full layers to host
memory (and is less than the W - 1 = 4 a sliding layer keeps).
"""
from __future__ import annotations

import json

import pytest
import torch

from strata.cli import main
from strata.engine import prompt_kv as engine_prompt_kv
from strata.engine.prefill import EngineConfig, PrefillEngine
from strata.kernels.attention import kv_token_bytes
from strata.engine.load import load_model, resident_provider
from strata.models.moe import expert_ffn
from strata.packs.synth import ExpertFormats, synth_pack
from strata.shapes import GptOssOptions, ModelShape, Window
from tests.routing import clear_routing

SHAPE = ModelShape("gpt-oss", n_layer=4, d_model=64, n_expert=4, top_k=2, d_expert=32,
                   n_head=4, n_kv_head=2, head_dim=16, vocab=128, opts=GptOssOptions(),
                   window=Window(5), max_pos=4096)
N = 23
FP32_REL = 1e-5
FLIPS_OF_BF16 = 0.1    # the windowed read's distance from the old one, in bf16 attention errors


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    """Drawn from seed 26: the GPU test holds bf16 reads to the fp32 reference, so no routing
    near-tie (tests/routing.py; seed 0's gap is 0.0006)."""
    return synth_pack(tmp_path_factory.mktemp("p") / "oss.pack", SHAPE, ExpertFormats.of("Q8_0"),
                      seed=26, progress=False)


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, SHAPE.vocab, (N,), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def reference(pack, tokens):
    """fp32 dense weights and experts, the whole prompt as one chunk."""
    return load_model(pack, dtype=torch.float32, ffn=expert_ffn("ref")).prefill(
        tokens, resident_provider(pack), chunk=None)


def test_the_prompt_routes_clear_of_ties(pack, tokens):
    assert clear_routing(pack, tokens)


def rel(a, b):
    a, b = a.float().cpu(), b.float().cpu()     # the reference is on CUDA where there is one
    return float((a - b).abs().max() / b.abs().max())


def read(pack, tokens, monkeypatch, *, old: bool, **kw):
    """(engine, result, the PromptKV it made or None); `old`: every layer's KV kept full."""
    with monkeypatch.context() as m:
        if old:
            m.setattr(engine_prompt_kv, "kv_windows", lambda s: (0,) * s.n_layer)
        eng = PrefillEngine(pack, EngineConfig(vram=1 << 30, cache=1 << 20, max_prompt=32,
                                               device="cpu", ring=4, ffn="ref", **kw))
        made = []
        real = eng.prompt_kv

        def spy(n, stages):
            kv = real(n, stages)
            made.append(kv and (kv.vram_bytes, kv.host_bytes))
            return kv
        m.setattr(eng, "prompt_kv", spy)
        res = eng.run(tokens, logits="all")
    return eng, res, made[0]


@pytest.mark.parametrize("kv,resident,chunk", [
    ("bf16", 2, 3), ("bf16", 2, 7), ("int8", 2, 5), ("int8", 2, 8), ("int8", None, 7)],
    ids=lambda x: str(x))
def test_windowed_equals_full_kv_read(pack, tokens, reference, monkeypatch, chunk, kv,
                                      resident):
    _, old, old_kv = read(pack, tokens, monkeypatch, old=True, chunk=chunk, kv=kv,
                          kv_resident=resident)
    eng, new, new_kv = read(pack, tokens, monkeypatch, old=False, chunk=chunk, kv=kv,
                            kv_resident=resident)
    bf16_err = rel(old.logits, reference)
    assert 0 < bf16_err < 0.05
    assert rel(new.logits, old.logits) <= FLIPS_OF_BF16 * bf16_err
    # what it held: the plan's count; the sliding layers' last W - 1 only, never staged
    s, tok = eng.sizes, kv_token_bytes(kv, SHAPE.n_kv_head, SHAPE.head_dim)
    assert new_kv == (s.kv_vram(N), s.kv_host_all(N))
    res = N if resident is None else min(N, resident)
    # (a sliding layer keeps W - 1 = 4 whatever --kv-resident says: more than 2 here)
    assert new_kv == ((2 * res + 2 * (SHAPE.window.size - 1)) * tok, 2 * (N - res) * tok)
    assert old_kv == (4 * res * tok, 4 * (N - res) * tok)
    staged = sum(min(P, N - res) for P in range(0, N, chunk)) * tok
    assert new.kv_streamed == 2 * staged and old.kv_streamed == 4 * staged


@pytest.mark.parametrize("chunk", [3, 5, 7], ids=lambda c: f"chunk{c}")
def test_model_cache_window(pack, tokens, chunk):
    """The model's own KVCache (the default bf16 all-resident engine path), fp32 on the CPU."""
    from strata.models.kv import KVCache
    model = load_model(pack, dtype=torch.float32, ffn=expert_ffn("ref"))
    prov = resident_provider(pack)
    new = model.prefill(tokens, prov, chunk=chunk)
    s = SHAPE
    full = KVCache(s.n_layer, s.n_kv_head, s.head_dim, capacity=N)    # every token, masked
    old = model.prefill(tokens, prov, chunk=chunk, cache=full)
    assert rel(new, old) <= FP32_REL
    kept = model.new_cache(capacity=N)
    assert [k.shape[1] for k in kept.k] == [4, N, 4, N]


def plan_json(capsys, *argv) -> dict:
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_shows_the_window(capsys):
    """gpt-oss-120b at 131072 tokens: the 18 sliding layers hold 127 tokens each, so the KV is
    the 18 full layers' 18 x 131072 x 2 KiB = 4.5 GiB (the old count charged all 36: 9 GiB)."""
    tok = 2 * 8 * 64 * 2      # keys and values, 8 kv heads of 64, bf16
    for preset, full in (("gpt-oss-120b", 18), ("gpt-oss-20b", 12)):
        argv = ["--preset", preset, "--vram", "24GiB", "--prompt-tokens", "131072"]
        kv = plan_json(capsys, *argv)["kv"]
        assert kv["vram_bytes"] == (full * 131072 + full * 127) * tok
        assert (kv["sliding_layers"], kv["sliding_tokens"]) == (full, 127)
        assert kv["sliding_vram_bytes"] == full * 127 * tok and kv["host_bytes"] == 0
        assert main(["plan", *argv]) == 0
        line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("  kv")][0]
        assert f"({full} sliding layers keep their last 127" in line
    kv = plan_json(capsys, "--preset", "gpt-oss-120b", "--vram", "24GiB", "--prompt-tokens",
                   "131072", "--kv-resident", "16384")["kv"]
    assert kv["host_bytes"] == 18 * (131072 - 16384) * tok      # full layers only
    assert "sliding_layers" not in plan_json(capsys, "--preset", "qwen3-30b-a3b", "--vram",
                                             "24GiB")["kv"]


@pytest.mark.gpu
@pytest.mark.parametrize("kv", ["bf16", "int8"])
def test_windowed_read_gpu(pack, tokens, reference, monkeypatch, kv):
    """On CUDA (bf16 dense, chunk_attention over the ring's segments): the kernel's bf16
    probabilities round against other tile maxima than the old read's, so the two differ at
    bf16 level; the windowed read stays as close to the fp32 reference as the old one."""
    got = {}
    for old in (True, False):
        with monkeypatch.context() as m:
            if old:
                m.setattr(engine_prompt_kv, "kv_windows", lambda s: (0,) * s.n_layer)
            eng = PrefillEngine(pack, EngineConfig(vram=1 << 30, cache=1 << 20, max_prompt=32,
                                                   device="cuda", chunk=7, ring=4, kv=kv,
                                                   kv_resident=2))
            got[old] = eng.run(tokens, logits="all").logits.cpu()
    assert torch.isfinite(got[False]).all()
    assert rel(got[False], reference) <= 1.5 * rel(got[True], reference)
