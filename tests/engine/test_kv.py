"""The engine's KV (strata.models.kv.PromptKV) on the CPU, tiny shapes: int8 against bf16, a
streamed (host-held) window against an all-resident one, what a prompt leaves behind, and the
host-memory refusal before anything is pinned.

- streamed == resident, exactly: on the CPU the attention is chunk_attention_torch, which
  concatenates its segments, so [staged host tokens, resident tokens] is the same tensor as one
  resident segment; the forced chunk and ring keep every expert pass alike (on the GPU the
  Triton kernel's tiles split differently at the segment border: fp32 reduction noise).
- int8 against bf16: see INT8_TO_BF16_ROUNDING (measured on this model: 0.048 of max|logit|
  against the bf16 KV's 0.017 from fp32; argmax agreement 96%; every key int8-rounded, the
  chunk's own too).
"""
from __future__ import annotations

import gc
import weakref

import pytest
import torch

from strata import budget
from strata.engine import prefill as engine_prefill
from strata.engine.prefill import EngineConfig, PrefillEngine
from strata.errors import StrataError
from strata.packs.synth import ExpertFormats, synth_pack
from strata.shapes import get_preset

SHAPE = get_preset("tiny")     # L=2, D=64, Hkv=2, hd=16
N = 45                         # prompt tokens: chunks of 8 -> 6 chunks, 5 with a prefix

# int8 KV against bf16 KV, as a multiple of the bf16 KV's own rounding (its distance from the
# fp32 reference, measured in the same test): int8 rounds an element to within max|row|/254
# (kv_int8's bound), bf16 to within |x|/512. At |x| = max|row| that is 2x; a normed 16-wide
# Gaussian row's typical |x| is about 0.4 of its max, so about 5x. The logits' distance follows
# the per-element rounding (the same layers carry both), hence 5x the bf16 KV's distance.
INT8_TO_BF16_ROUNDING = 5.0


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    return synth_pack(tmp_path_factory.mktemp("p") / "tiny.pack", SHAPE,
                      ExpertFormats.of("Q8_0"), progress=False)


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, SHAPE.vocab, (N,), generator=torch.Generator().manual_seed(3))


def engine(pack, **kw):
    cfg = EngineConfig(vram=1 << 30, cache=64 * 1024, max_prompt=64, device="cpu", chunk=8,
                       ring=4, ffn="ref", **kw)
    return PrefillEngine(pack, cfg)


def read(pack, tokens, **kw):
    eng = engine(pack, **kw)
    return eng, eng.run(tokens, logits="all")


def rel(a, b):
    a, b = a.float().cpu(), b.float().cpu()    # the engine's logits are on its device
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("kv", ["bf16", "int8"])
@pytest.mark.parametrize("resident", [1, 13, 40])
def test_streamed_equals_resident(pack, tokens, kv, resident):
    _, whole = read(pack, tokens, kv=kv, kv_resident=64)   # PromptKV, every token resident
    eng, part = read(pack, tokens, kv=kv, kv_resident=resident)
    names = [n for n, _, _ in part.memory[0].placements]
    assert "kv_stage" in names and "kv_stage" not in [n for n, _, _ in whole.memory[0].placements]
    assert whole.kv_streamed == 0 < part.kv_streamed
    # every chunk at P streams min(P, N - resident) tokens of every layer back
    tok = SHAPE.kv_bytes(1, kv)
    want = sum(min(P, N - resident) for P in range(0, N, 8)) * tok * SHAPE.n_layer
    assert part.kv_streamed == want
    assert torch.equal(part.logits, whole.logits)


def test_int8_against_bf16(pack, tokens):
    from strata.engine.load import load_model, resident_provider
    from strata.models.moe import expert_ffn
    _, bf = read(pack, tokens, kv="bf16", kv_resident=64)      # PromptKV, bf16
    _, i8 = read(pack, tokens, kv="int8")
    ref = load_model(pack, dtype=torch.float32, ffn=expert_ffn("ref")).prefill(
        tokens, resident_provider(pack), chunk=None)
    assert not torch.equal(i8.logits, bf.logits)      # the int8 path really ran
    bf_err = rel(bf.logits, ref)       # bf16 KV and attention vs the fp32 reference
    assert 0 < bf_err <= 0.05
    assert rel(i8.logits, bf.logits) <= INT8_TO_BF16_ROUNDING * bf_err
    top = (i8.logits.argmax(-1) == bf.logits.argmax(-1)).float().mean()
    assert top >= 0.9


def test_kv_released_and_cache_restored(pack, tokens, monkeypatch):
    eng = engine(pack, kv="int8", kv_resident=5)
    snap = [p.cache.buffer.clone() for p in eng.parts]
    made = []
    real = eng.prompt_kv

    def spy(n, stages):
        kv = real(n, stages)
        made.append([weakref.ref(t) for parts in kv.hosted + kv.resident for t in parts])
        return kv
    monkeypatch.setattr(eng, "prompt_kv", spy)
    res = eng.run(tokens, logits="last")
    gc.collect()
    assert made and made[0] and all(r() is None for r in made[0]), "host/resident KV kept"
    for p, s in zip(eng.parts, snap):
        assert torch.equal(p.cache.buffer, s)
    assert res.kv_streamed > 0


def test_host_kv_that_does_not_fit_is_refused_before_pinning(pack, monkeypatch):
    refused_before_pinning(monkeypatch, SHAPE, lambda: engine(pack, kv_resident=4))


def refused_before_pinning(monkeypatch, shape, make) -> None:
    """`make()` (an engine of max_prompt 64, --kv-resident 4, bf16) on a host one byte short of
    the host-held KV refuses in one line before the host blobs load (tests/models too)."""
    host_kv = shape.n_layer * shape.kv_bytes(64 - 4, "bf16")
    monkeypatch.setattr(budget, "host_available", lambda: host_kv - 1)

    def no_pinning(*a, **k):
        raise AssertionError("host blobs loaded before the KV check")
    monkeypatch.setattr(engine_prefill, "HostExperts", no_pinning)
    with pytest.raises(StrataError) as e:
        make()
    msg = str(e.value)
    assert "\n" not in msg
    for words in ("KV cache of 64 tokens", "in host memory", "VRAM", "available",
                  "--kv int8", "--kv-resident"):
        assert words in msg, msg


def test_cli_refuses_with_one_line(pack, monkeypatch, capsys):
    from strata.cli import main
    monkeypatch.setattr(budget, "host_available", lambda: 1000)
    rc = main(["prefill", str(pack), "--prompt-tokens", "40", "--kv-resident", "4",
               "--device", "cpu", "--chunk", "8"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "KV" in err, err
