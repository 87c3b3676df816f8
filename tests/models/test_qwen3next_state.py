"""The recurrent state of Qwen3-Next / Qwen3.5-MoE's linear-attention layers across chunks, and
what the plan counts for it.

- A long prompt read in chunks of 64 (the delta rule's chunk, the conv's SiLU block) carries
  the conv state and S exactly: each linear layer gives the one-call output and final state bit
  for bit on the CPU (strata.kernels.deltanet's chunk and conv docstrings say why a cut at a
  multiple of 64 runs the same operations on the same rows).
- A packed chunk (several independent sequences, strata.models.packed) runs each sequence's rows
  from a zero conv state and S: bit for bit each sequence alone; the delta rule per sequence
  fits the chunk's dn_* scratch.
- The whole model read in chunks of 64 through the streaming engine (experts streamed through a
  ring smaller than a layer) equals the resident read with the same chunks; both stay within
  FP32_REL of the one-call read (the full layers' attention over a cache is another summation
  order: fp32 noise).
- The plan's per-layer bytes (KV for the full layers, the recurrent state for the linear ones)
  are what the caches allocate, and the delta rule's chunk scratch in the layout is what the
  launcher takes (it then allocates none of it itself).
"""
from __future__ import annotations

import importlib.util

import pytest
import torch

from strata.engine.load import load_model, resident_provider
from strata.kernels.deltanet import chunk_gated_delta_rule
from strata.kernels.deltanet.launch import pin_delta_launch
from strata.kernels.deltanet.sizes import (chunk_buffers, chunk_scratch_bytes,
                                          recurrent_state_bytes)
from strata.memory.layout import PromptLayout
from strata.models.moe import EXPERT_FFNS, expert_ffn
from strata.planning import KVPolicy, layout_spec, model_sizes
from tests.models.hf_qwen3next import QWEN35MOE_TINY, QWEN3NEXT_TINY, make_hybrid
from tests.models.test_parity_archs import FP32_REL, _pack, rel

SHAPES = {"qwen3next": QWEN3NEXT_TINY, "qwen35moe": QWEN35MOE_TINY}


@pytest.fixture(scope="module", params=list(SHAPES))
def pack(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(request.param)
    make_hybrid(SHAPES[request.param], seed=3).save_pretrained(d / "hf")
    return _pack([d / "hf", "--quant", "BF16"], d / "hf.pack")


def test_chunks_of_64_carry_the_state_bit_for_bit(pack):
    model = load_model(pack, dtype=torch.float32, ffn=expert_ffn("ref"))
    s = model.shape
    x = torch.randn(192, s.d_model, generator=torch.Generator().manual_seed(7))
    for l in range(s.n_layer):
        if s.layer_kind(l) != "linear":
            continue
        one, parts = model.new_cache(), model.new_cache()
        ref = model.delta_attend(x, model.layers[l].attn, one, l)
        got = torch.cat([model.delta_attend(x[a:a + 64], model.layers[l].attn, parts, l)
                         for a in range(0, 192, 64)])
        assert torch.equal(got, ref), l
        assert torch.equal(parts.states.S[l], one.states.S[l]), l
        assert torch.equal(parts.states.conv[l], one.states.conv[l]), l
        # the conv state is the projection's last rows as the projection of the whole input
        # computed them (a 3-row product is another BLAS blocking: other roundings on some CPUs)
        assert torch.equal(one.states.conv[l], (x @ model.layers[l].attn.qkv.t())[-3:]), l


def test_packed_sequences_each_start_from_zero_state(pack):
    """A packed chunk (cache.packed): each sequence's rows of every linear layer are bit for bit
    the layer over that sequence alone from a fresh cache, whatever state the cache held."""
    from strata.models.packed import Packed
    model = load_model(pack, dtype=torch.float32, ffn=expert_ffn("ref"))
    s, lengths = model.shape, (5, 1, 70, 3)
    x = torch.randn(sum(lengths), s.d_model, generator=torch.Generator().manual_seed(8))
    for l in range(s.n_layer):
        if s.layer_kind(l) != "linear":
            continue
        w, cache = model.layers[l].attn, model.new_cache()
        cache.states.S[l].fill_(float("nan"))         # nothing of it may reach the sequences
        cache.states.conv[l].fill_(float("nan"))
        cache.packed = Packed.of(lengths)
        got = model.delta_attend(x.clone(), w, cache, l)
        for a, b in cache.packed.bounds:
            assert torch.equal(got[a:b], model.delta_attend(x[a:b], w, model.new_cache(), l)), l


@pytest.mark.parametrize("lengths", [(5, 1, 9), (64, 13)])
def test_per_sequence_rules_fit_the_chunks_scratch(lengths):
    """The delta rule run per sequence of a packed chunk takes its first rows of the chunk's
    dn_* views (placed for T = the whole chunk: poisoned, then computed in) and gives what each
    sequence's call with its own buffers gives."""
    s = QWEN3NEXT_TINY
    lin, T = s.linear, sum(lengths)
    Hk, Hv, dk, dv = lin.n_k_head, lin.n_v_head, lin.k_head_dim, lin.v_head_dim
    lay = PromptLayout(model_sizes(s), 64, layout_spec(EXPERT_FFNS["kernel"], KVPolicy(), s))
    scratch = {p.name[3:]: torch.full((p.nbytes // 4,), float("nan"))
               for p in lay.placements(T, 0) if p.name.startswith("dn_")}
    g = torch.Generator().manual_seed(T)
    q, k = (torch.randn(T, Hk, dk, generator=g) for _ in range(2))
    v = torch.randn(T, Hv, dv, generator=g)
    gate, beta = -torch.rand(T, Hv, generator=g), torch.rand(T, Hv, generator=g)
    a = 0
    for n in lengths:
        r = slice(a, a + n)
        for t in scratch.values():
            t.fill_(float("nan"))
        S = torch.zeros(Hv, dk, dv)
        o, S = chunk_gated_delta_rule(q[r], k[r], v[r], gate[r], beta[r], S, use_qk_l2norm=True,
                                      out_state=S, scratch=scratch)
        o2, S2 = chunk_gated_delta_rule(q[r], k[r], v[r], gate[r], beta[r], torch.zeros_like(S),
                                        use_qk_l2norm=True)
        assert torch.equal(o, o2) and torch.equal(S, S2)
        for b in chunk_buffers(n, Hk, Hv, dk, dv, qk_l2norm=True):   # computed in the views
            assert not scratch[b.name][:b.nbytes // 4].isnan().any(), b.name
        a += n


def test_long_prompt_streamed_equals_resident(pack):
    from strata.engine.prefill import EngineConfig, PrefillEngine
    from strata.packs import Pack
    tokens = torch.randint(0, 256, (150,), generator=torch.Generator().manual_seed(2))
    model = load_model(pack, dtype=torch.float32, ffn=expert_ffn("ref"))
    whole = model.prefill(tokens, resident_provider(pack), chunk=None)
    resident = model.prefill(tokens, resident_provider(pack), chunk=64)
    assert rel(resident.numpy(), whole.numpy()) < FP32_REL
    cfg = EngineConfig(vram=1 << 30, cache=16 * Pack.open(pack).max_blob, max_prompt=256,
                       device="cpu", ffn="ref", chunk=64, ring=2)
    res = PrefillEngine(pack, cfg).run(tokens)
    assert res.ring == 2 and res.stats.bytes_streamed > 0
    assert torch.equal(res.logits, resident)


@pytest.mark.parametrize("kv,dtype", [("fp32", torch.float32), ("bf16", torch.bfloat16),
                                      ("bf16", torch.float32)])
@pytest.mark.parametrize("n", [1, 100])
def test_plan_counts_what_the_cache_allocates(pack, kv, dtype, n):
    model = load_model(pack, dtype=dtype, ffn=expert_ffn("ref"))
    s = model.shape
    sizes = model_sizes(s, kv=KVPolicy(kv))
    cache = model.new_cache(capacity=n, kv=kv)
    assert cache.vram_bytes == sizes.kv_vram(n)
    lin = s.linear
    state = recurrent_state_bytes(lin.n_k_head, lin.n_v_head, lin.k_head_dim, lin.v_head_dim,
                                  conv_kernel=lin.conv_kernel, itemsize=2 if kv == "bf16" else 4)
    for l in range(s.n_layer):
        if s.layer_kind(l) == "linear":
            assert sizes.kv_bytes(n, l) == state and sizes.kv_host(n, l) == 0
            assert cache.k[l].numel() == cache.v[l].numel() == 0
        else:
            assert sizes.kv_bytes(n, l) == s.kv_bytes(n, kv)


BACKENDS = [pytest.param("strata", id="strata"),
            pytest.param("fla", id="fla", marks=pytest.mark.skipif(
                importlib.util.find_spec("fla") is None, reason="fla-core is not installed"))]
DN_NAMES = {"strata": {"g_cum", "w", "u", "qn", "kn"},
            "fla": {"g_cum", "A", "w", "u", "v_new", "h", "ht", "qn", "kn"}}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("T", [1, 64, 77])
def test_layout_scratch_is_what_the_launcher_takes(T, backend):
    """The dn_* placements of the layout are chunk_scratch_bytes of the launch in force (fla's
    at the fp32 KV's itemsize: the CPU's activations); the launcher given those views computes
    in them (poisoned before, overwritten after) and gives the result it gives with its own
    buffers."""
    s = QWEN3NEXT_TINY
    lin = s.linear
    with pin_delta_launch(backend=backend):
        kv = KVPolicy("fp32")
        lay = PromptLayout(model_sizes(s, kv=kv), 64,
                           layout_spec(EXPERT_FFNS["kernel"], kv, s))
        placed = {p.name: p.nbytes for p in lay.placements(T, 0) if p.name.startswith("dn_")}
        want = chunk_scratch_bytes(T, lin.n_k_head, lin.n_v_head, lin.k_head_dim,
                                   lin.v_head_dim, qk_l2norm=True, backend=backend, itemsize=4)
        assert sum(placed.values()) == want
        assert set(placed) == {f"dn_{n}" for n in DN_NAMES[backend]}
        g = torch.Generator().manual_seed(T)
        Hk, Hv, dk, dv = lin.n_k_head, lin.n_v_head, lin.k_head_dim, lin.v_head_dim
        q, k = (torch.randn(T, Hk, dk, generator=g) for _ in range(2))
        v = torch.randn(T, Hv, dv, generator=g)
        gate = -torch.rand(T, Hv, generator=g)
        beta = torch.rand(T, Hv, generator=g)
        scratch = {n[3:]: torch.full((b // 4,), float("nan")) for n, b in placed.items()}
        o, S = chunk_gated_delta_rule(q, k, v, gate, beta, None, use_qk_l2norm=True,
                                      scratch=scratch)
        o2, S2 = chunk_gated_delta_rule(q, k, v, gate, beta, None, use_qk_l2norm=True)
    assert torch.equal(o, o2) and torch.equal(S, S2)
    # every byte computed in (fla's A is zeroed first: its solve writes the lower triangle)
    assert all(not t.isnan().any() for t in scratch.values())


@pytest.mark.skipif(importlib.util.find_spec("fla") is None, reason="fla-core is not installed")
def test_fla_backend_streamed_equals_resident(tmp_path):
    """The whole hybrid read with the fla backend pinned (its kernels in the interpreter, the
    delta rule's buffers carved from the plan's layout): the streamed read equals the resident
    one bit for bit, and both stay within fp32 order's bound of the torch twin's read (derived
    from the model itself: tests/models/fp32_bound.py, on transformers' forward of the same
    weights and tokens)."""
    from strata.engine.prefill import EngineConfig, PrefillEngine
    from strata.packs import Pack
    d = tmp_path
    hf = make_hybrid(QWEN35MOE_TINY, seed=5)
    hf.save_pretrained(d / "hf")
    pack = _pack([d / "hf", "--quant", "BF16"], d / "hf.pack")
    tokens = torch.randint(0, 256, (100,), generator=torch.Generator().manual_seed(8))
    bound = _order_bound(hf, tokens)
    # fp32 order's scale (8e-4 here: 100 tokens through four hybrid layers; the twin and fla
    # differ by 1.7e-5 on an AMD EPYC), not a constant one CPU happened to pass
    assert 0 < bound < 2e-3
    model = load_model(pack, dtype=torch.float32, ffn=expert_ffn("ref"))
    twin = model.prefill(tokens, resident_provider(pack), chunk=64)
    cfg = EngineConfig(vram=1 << 30, cache=32 * Pack.open(pack).max_blob, max_prompt=128,
                       device="cpu", ffn="ref", chunk=64, ring=2)
    with pin_delta_launch(backend="fla"):
        resident = model.prefill(tokens, resident_provider(pack), chunk=64)
        res = PrefillEngine(pack, cfg).run(tokens)
    assert res.ring == 2 and res.stats.bytes_streamed > 0
    assert torch.equal(res.logits, resident)
    assert not torch.equal(resident, twin)           # fla's kernels ran, not the twin
    assert rel(resident.numpy(), twin.numpy()) < bound


def _order_bound(hf, tokens: torch.Tensor) -> float:
    """fp32 order's normalized logit bound of `hf`'s forward on `tokens` (fp32_bound)."""
    from tests.models.fp32_bound import model_order_bound

    def logits(m):
        with torch.no_grad():
            return m(tokens[None]).logits[0].float()
    return model_order_bound(hf, logits, tokens=tokens.numel())


def test_the_plan_shows_each_kind(capsys):
    from strata.cli import main
    assert main(["plan", "--preset", "qwen3-next-80b-a3b", "--vram", "12GiB",
                 "--prompt-tokens", "32768"]) == 0
    out = capsys.readouterr().out
    assert "in the 12 full-attention layers; the 36 linear-attention layers keep a recurrent " \
           "state instead (73.69 MiB" in out
    assert main(["plan", "--preset", "qwen3.5-35b-a3b", "--vram", "12GiB"]) == 0
    assert "the 30 linear-attention layers keep a recurrent state" in capsys.readouterr().out
    # the delta rule's launch and its scratch for the chunk, as the layout counts it
    # (Qwen3.5 at 32768, bf16: strata's fp32 g_cum, w, u, qn, kn 1,540 MiB; fla-core's 1,670)
    # (the default, auto, resolves for the plan's device, a GPU: fla-core's where installed)
    from strata.kernels.deltanet.launch import _fla_installed
    fla, strata = "fla-core's kernels, 1.63 GiB", "strata's kernels, 1.50 GiB"
    for flag, says in (([], fla if _fla_installed() else strata),
                       (["--delta", "backend=strata"], strata),
                       (["--delta", "backend=fla"], fla)):
        if "backend=fla" in flag and importlib.util.find_spec("fla") is None:
            continue
        assert main(["plan", "--preset", "qwen3.5-35b-a3b", "--vram", "12GiB", "--prompt-tokens",
                     "32768", "--chunk", "32768", *flag]) == 0
        assert f"their delta rule: {says} of scratch a chunk" in capsys.readouterr().out
    assert main(["plan", "--preset", "qwen3.5-35b-a3b", "--vram", "12GiB",
                 "--delta", "backend=triton"]) == 2
    assert "backend must be one of" in capsys.readouterr().err


def test_engine_prompt_kv_keeps_only_the_full_layers(pack):
    """Under --kv-resident the engine's own PromptKV holds the full layers' KV (the older tokens
    host-held) and the linear layers' states, and reads what the model's cache reads."""
    from strata.engine.prefill import EngineConfig, PrefillEngine
    from strata.packs import Pack
    tokens = torch.randint(0, 256, (150,), generator=torch.Generator().manual_seed(4))
    model = load_model(pack, dtype=torch.float32, ffn=expert_ffn("ref"))
    resident = model.prefill(tokens, resident_provider(pack), chunk=64)
    cfg = EngineConfig(vram=1 << 30, cache=64 * Pack.open(pack).max_blob, max_prompt=256,
                       device="cpu", ffn="ref", chunk=64, ring=2, kv_resident=40)
    res = PrefillEngine(pack, cfg).run(tokens)
    assert rel(res.logits.numpy(), resident.numpy()) < FP32_REL
    sizes = model_sizes(model.shape, kv=KVPolicy("fp32", 40, 256))
    assert res.kv_bytes == (sizes.kv_vram(150), sizes.kv_host_all(150))
    assert res.kv_bytes[1] > 0     # the full layers' older tokens were host-held
