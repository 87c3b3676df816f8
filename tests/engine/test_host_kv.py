"""The engine's host-held KV arena (strata.engine.host_kv): pinned once per engine for its longest
prompt, its bytes the plan's own count, every prompt's host part a view of it, one prompt at a
time. CPU, tiny shapes."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from strata.engine.host_kv import HostKVArena
from strata.engine.prefill import EngineConfig, PrefillEngine
from strata.errors import StrataError
from strata.kernels.attention.kv_int8 import kv_token_parts
from strata.models.kv import kv_windows, layer_kv_tokens
from strata.packs import Pack
from strata.packs.synth import ExpertFormats, synth_pack
from strata.shapes import GptOssOptions, ModelShape, Window, get_preset
from tests.models.hf_family import DS_TINY

OSS = ModelShape("gpt-oss", n_layer=4, d_model=64, n_expert=4, top_k=2, d_expert=32,
                 n_head=4, n_kv_head=2, head_dim=16, vocab=128, opts=GptOssOptions(),
                 window=Window(5), max_pos=4096)
SHAPES = {"qwen3moe": get_preset("tiny"), "deepseek2": DS_TINY, "gpt-oss": OSS,
          "qwen35moe": get_preset("tiny-qwen35moe")}
MAX = 48


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    d = tmp_path_factory.mktemp("packs")
    return {a: Pack.open(synth_pack(d / f"{a}.pack", s, ExpertFormats.of("Q8_0"),
                                    progress=False)) for a, s in SHAPES.items()}


def engine(pack, kv="int8", resident=5):
    return PrefillEngine(pack, EngineConfig(
        vram=1 << 30, cache=24 * pack.max_blob, max_prompt=MAX, device="cpu", chunk=8, ring=2,
        ffn="ref", kv=kv, kv_resident=resident))


@given(st.sampled_from(["bf16", "int8", "fp32"]), st.integers(1, 6), st.integers(1, 8),
       st.integers(0, 40), st.integers(0, 40))
@settings(max_examples=60, deadline=None)
def test_views_are_the_first_rows_of_disjoint_aligned_parts(kv, heads, hd, cap, n):
    """take(layer, n): for each part a contiguous [n, *shape] view starting on a multiple of its
    element size, the parts' regions disjoint inside the layer's cap x row bytes; past the cap
    it is refused in one line."""
    parts = kv_token_parts(kv, heads, 2 * hd)
    a = HostKVArena({0: cap}, parts, pin=False)
    assert a.nbytes(0) == cap * sum(a.row) and a.nbytes(1) == 0
    if n > cap:
        with pytest.raises(StrataError, match="holds"):
            a.take(0, n)
        return
    views = a.take(0, n)
    assert [tuple(v.shape) for v in views] == [(n, *shp) for shp, _ in parts]
    assert [v.dtype for v in views] == [dt for _, dt in parts]
    if not n:
        return
    base = a._bufs[0].data_ptr()
    spans = []
    for v in views:
        assert v.is_contiguous() and (v.data_ptr() - base) % v.element_size() == 0
        spans.append((v.data_ptr() - base, v.data_ptr() - base + v.numel() * v.element_size()))
    spans.sort()
    assert all(a1 <= b0 for (_, a1), (b0, _) in zip(spans, spans[1:]))
    assert spans[-1][1] <= a.nbytes(0)


def test_one_holder_at_a_time():
    a = HostKVArena({0: 4}, kv_token_parts("bf16", 1, 2), pin=False)
    first, second = object(), object()
    a.hold(first)
    a.hold(first)                         # the same one again: fine
    with pytest.raises(StrataError, match="one prompt at a time"):
        a.hold(second)
    a.let_go(second)                      # not the holder: nothing changes
    with pytest.raises(StrataError):
        a.hold(second)
    a.let_go(first)
    a.hold(second)


@pytest.mark.parametrize("arch", list(SHAPES))
def test_the_arena_is_the_plans_host_kv(packs, arch):
    """Per layer, the arena's bytes are sizes.kv_host(max_prompt, layer), the count the plan
    charges (a sliding or linear layer: none); a prompt's host part views it, so prompts of
    different lengths reuse the same bytes, and the engine's KV reports the prompt's own share."""
    pack = packs[arch]
    eng = engine(pack)
    t = torch.randint(0, SHAPES[arch].vocab, (MAX,), generator=torch.Generator().manual_seed(3))
    ptrs = []

    def host_ptrs(session, _):
        kv = session.kv
        ptrs.append({l: kv.hosted[l][0].data_ptr() for l in kv.mine if kv.held[l]})
        return kv.host_bytes
    first = eng.run(t[:30], logits="last", then=host_ptrs)
    arena = eng._host_kv
    assert arena
    for l in range(SHAPES[arch].n_layer):
        assert arena.nbytes(l) == eng.sizes.kv_host(MAX, l), l
    assert arena.allocated == arena.total == eng.sizes.kv_host_all(MAX)
    second = eng.run(t, logits="last", then=host_ptrs)
    assert ptrs[0] and ptrs[0] == {l: p for l, p in ptrs[1].items() if l in ptrs[0]}
    assert first.then == eng.sizes.kv_host_all(30) and second.then == eng.sizes.kv_host_all(MAX)
    assert arena._holder is None          # each prompt let go of it


def test_logits_do_not_depend_on_the_arena(packs):
    """The same prompts read through an engine whose host KV is an arena and through PromptKVs
    that allocate their own (the arena turned off): equal bit for bit, a longer prompt after a
    shorter one included (its rows past the shorter one's were never written by it)."""
    pack = packs["qwen3moe"]
    t = torch.randint(0, SHAPES["qwen3moe"].vocab, (MAX,),
                      generator=torch.Generator().manual_seed(5))
    a, b = engine(pack), engine(pack)
    b._host_kv = False                   # no arena: each prompt's own tensors
    for n in (40, 20, MAX):
        assert torch.equal(a.run(t[:n], logits="all").logits, b.run(t[:n], logits="all").logits)
    assert a._host_kv and not b._host_kv


def test_no_arena_without_host_kv(packs):
    """All resident (no window) or a max_prompt inside the window: nothing is host-held, no
    arena is made."""
    pack = packs["qwen3moe"]
    eng = engine(pack, resident=MAX)
    eng.run(torch.arange(10), logits="last")
    assert eng._host_kv is False
    caps = [layer_kv_tokens(MAX, w, MAX)[1] for w in kv_windows(SHAPES["qwen3moe"])]
    assert not any(caps)


def test_a_kv_that_failed_to_build_lets_the_arena_go(packs, monkeypatch):
    """A prompt whose KV fails after its host views were taken (here the recurrent states'
    allocation) fails in one line and leaves the arena free: the next prompt reads, equal to a
    fresh engine's read."""
    import strata.engine.prompt_kv as pkv
    pack = packs["qwen35moe"]
    t = torch.randint(0, SHAPES["qwen35moe"].vocab, (30,),
                      generator=torch.Generator().manual_seed(9))
    eng = engine(pack)
    real = pkv.new_states
    calls = []

    def failing(*a, **kw):
        calls.append(1)
        if len(calls) == 1:
            raise StrataError("no room for the recurrent state (test)")
        return real(*a, **kw)
    monkeypatch.setattr(pkv, "new_states", failing)
    with pytest.raises(StrataError, match="recurrent state"):
        eng.run(t, logits="last")
    assert eng._host_kv and eng._host_kv._holder is None
    got = eng.run(t, logits="last").logits
    monkeypatch.setattr(pkv, "new_states", real)
    assert torch.equal(got, engine(pack).run(t, logits="last").logits)


@pytest.mark.gpu
def test_the_arena_is_pinned_and_reused_on_the_gpu(tmp_path):
    """On CUDA the arena is pinned host memory; two prompts of different lengths read their
    host-held KV from the same pinned bytes, and their logits equal an engine's whose prompts
    pin their own (the arena off), bit for bit (int8 KV, a host part staged back)."""
    shape = get_preset("small")
    pack = Pack.open(synth_pack(tmp_path / "s.pack", shape, ExpertFormats.of("Q8_0"),
                                progress=False))

    def gpu_engine():
        return PrefillEngine(pack, EngineConfig(vram=1 << 30, cache=40 * pack.max_blob,
                                                max_prompt=200, chunk=64, ring=5, ffn="auto",
                                                kv="int8", kv_resident=40))
    a, b = gpu_engine(), gpu_engine()
    b._host_kv = False
    t = torch.randint(0, shape.vocab, (200,), generator=torch.Generator().manual_seed(2))
    ptrs = []

    def seen(session, _):
        kv = session.kv
        ptrs.append({l: (kv.hosted[l][0].data_ptr(), kv.hosted[l][0].is_pinned())
                     for l in kv.mine if kv.held[l]})
    for n in (120, 200):
        got = a.run(t[:n], logits="all", then=seen).logits
        assert torch.equal(got, b.run(t[:n], logits="all").logits)
    assert ptrs[0] and all(p for _, p in ptrs[0].values())
    assert {l: v for l, v in ptrs[1].items() if l in ptrs[0]} == ptrs[0]
    assert a._host_kv.pin and a._host_kv.allocated == a.sizes.kv_host_all(200)
