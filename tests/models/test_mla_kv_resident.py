"""MLA with a host-held latent window (`--kv-resident N`: strata.models.kv.PromptKV over the
latent, `attend_latent`), tiny DeepSeek shapes.

- The blocked attention over [a staged prefix segment, the rest as one run] equals the same keys
  in one run, bit for bit, bf16 and int8, in a NaN-poisoned scratch (its c rows included: a key
  block spanning both segments is gathered there, or dequantized there piece by piece) into a
  NaN-poisoned output: any split (the prefix empty, the run the chunk alone), blocks of one key,
  blocks larger than the segments. The references (fp32 expanded, fp64 absorbed) take the prefix
  too and agree with the run they join.
- The engine on the CPU: streamed logits == all-resident logits of the same dtype (PromptKV with
  every token resident), exactly: the reference attention joins the segments into the tensor an
  all-resident read attends, so any difference is a wrong token, position or scale. int8 equals
  the model's own int8 MLACache too (the same codes). The bytes streamed are every chunk's
  min(P, host) tokens a layer at the shape's own per-token count (ModelShape.kv_bytes).
- CUDA's path on the CPU (bf16 dense math, the blocked attention in the scratch the engine
  carves, mla_c included): streamed against the same plan read with every token in the model's
  own MLACache, bit for bit.
- The plan's MLA KV bytes (resident, host, the kv_stage) equal what PromptKV allocates and
  views, for random MLA shapes, dtypes, windows and prompt lengths (Hypothesis); and in the
  engine, what a prompt's PromptKV holds is what its plan charged.
- The KV goes with the prompt; host RAM too small is refused before anything is pinned, in one
  line (exit 2 through the CLI).
- `strata prefill --kv-resident` on a DeepSeek pack runs (its warm-up's dry prompt included).
- On CUDA (gpu mark): streamed against the same plan read with every token in the model's own
  MLACache, bit for bit (Triton expert GEMM, copy lane, pinned host KV, the blocked attention's
  gather), and the attention over [staged, resident] at DeepSeek-V3's latent widths.
"""
from __future__ import annotations

import gc
import weakref

import pytest
import torch
from hypothesis import example, given, settings, strategies as st

from strata import budget
from strata.engine.prefill import EngineConfig, PrefillEngine
from strata.errors import StrataError
from strata.memory.layout import PromptLayout
from strata.models.kv import PromptKV
from strata.kernels.attention.kv_int8 import KV_DTYPES
from strata.models.mla import (LatentSegment, MLACache, mla_chunk_attention,
                              mla_chunk_attention_absorbed)
from strata.models.mla_scratch import MLAScratch, mla_scratch_rows
from strata.models.moe import ffn_named
from strata.planning import KVPolicy, layout_spec, model_sizes
from strata.shapes import Mla, ModelShape
from tests.engine.test_kv import refused_before_pinning
from tests.models.hf_family import DS_TINY
from tests.models.test_mla_blocks import REL, draw, poisoned
from tests.models.test_mla_int8 import int8_cache_of

N_TOK, CHUNK = 23, 5      # 5 chunks; DS_TINY: 3 layers (the first dense), latent 32 + rope 8


def scratch_of(H, hd, Hv, T, S, block, L, R, dtype, device="cpu") -> MLAScratch:
    """A NaN-poisoned scratch with its c rows (what the plan carves with a host-held window)."""
    s = poisoned(H, hd, Hv, T, S, block, dtype=dtype, device=device)
    rows = mla_scratch_rows(T, S, block)[0]    # the launch's key rows (a cudnn key_block's too)
    return MLAScratch(s.k, s.v, s.state, torch.full((rows * (L + R),), float("nan"),
                                                    dtype=dtype, device=device))


def split_run(c, k_pe, cs, ks, n):
    """(prefix [the first n tokens, or none], the rest's (c, k_pe, c_scale, k_pe_scale))."""
    sl = (lambda t, a, b: None if t is None else t[a:b])
    pre = [LatentSegment(c[:n], k_pe[:n], sl(cs, 0, n), sl(ks, 0, n))] if n else []
    S = c.shape[0]
    return pre, (c[n:], k_pe[n:], sl(cs, n, S), sl(ks, n, S))


def segmented_against_one_run(H, T, P, N, R, Hv, L, block, seed, n, kv, dtype,
                              device="cpu"):
    q_nope, q_pe, c, k_pe, wkvb = draw(H, T, P, N, R, Hv, L, seed, dtype=dtype, device=device)
    S = P + T
    cs = ks = None
    if kv == "int8":
        c, k_pe, cs, ks = int8_cache_of(c, k_pe, [P, T] if P else [T])
    kw = dict(v_head_dim=Hv, scale=(N + R) ** -0.5, block=block)
    whole = mla_chunk_attention(q_nope, q_pe, c, k_pe, wkvb, sdpa=True, c_scale=cs,
                                k_pe_scale=ks, out=torch.full((T, H, Hv), float("nan"),
                                                              dtype=dtype, device=device),
                                scratch=scratch_of(H, N + R, Hv, T, S, block, L, R, dtype,
                                                   device), **kw)
    pre, (cr, kr, csr, ksr) = split_run(c, k_pe, cs, ks, n)
    out = torch.full((T, H, Hv), float("nan"), dtype=dtype, device=device)
    got = mla_chunk_attention(q_nope, q_pe, cr, kr, wkvb, sdpa=True, c_scale=csr, k_pe_scale=ksr,
                              prefix=pre, out=out,
                              scratch=scratch_of(H, N + R, Hv, T, S, block, L, R, dtype, device),
                              **kw)
    return got, whole, out, (q_nope, q_pe, c, k_pe, wkvb, cs, ks, cr, kr, csr, ksr, pre, kw)


@settings(max_examples=30, deadline=None)
@given(H=st.integers(1, 3), T=st.integers(1, 9), P=st.integers(0, 25), N=st.integers(1, 5),
       R=st.sampled_from([2, 4]), Hv=st.integers(1, 5), L=st.integers(1, 8),
       block=st.integers(1, 40), seed=st.integers(0, 999), frac=st.floats(0, 1),
       kv=st.sampled_from(["bf16", "int8"]))
@example(H=2, T=3, P=9, N=3, R=2, Hv=3, L=4, block=4, seed=0, frac=0.5, kv="bf16").via(
    "blocks that span the segment border: gathered into the c rows")
@example(H=2, T=3, P=9, N=3, R=2, Hv=3, L=4, block=4, seed=0, frac=0.5, kv="int8").via(
    "int8: each block dequantized piece by piece")
@example(H=1, T=4, P=6, N=2, R=2, Hv=2, L=3, block=1, seed=1, frac=1.0, kv="bf16").via(
    "blocks of one key; the run is the chunk alone (a chunk starting in the host part)")
@example(H=2, T=5, P=0, N=2, R=4, Hv=2, L=5, block=8, seed=2, frac=1.0, kv="int8").via(
    "no prefix: nothing cached yet")
@example(H=1, T=2, P=20, N=3, R=2, Hv=2, L=6, block=40, seed=3, frac=0.3, kv="bf16").via(
    "one block holds every key: the masked launch spans both segments")
def test_segmented_equals_one_run(H, T, P, N, R, Hv, L, block, seed, frac, kv):
    n = int(frac * P)           # the staged prefix's tokens: 0..P (the run holds the chunk)
    got, whole, out, _ = segmented_against_one_run(H, T, P, N, R, Hv, L, block, seed, n, kv,
                                                   torch.bfloat16)
    assert got.data_ptr() == out.data_ptr() and torch.isfinite(got).all()
    assert torch.equal(got, whole)


@pytest.mark.parametrize("kv", ["bf16", "int8"])
def test_the_references_take_the_prefix(kv):
    """The fp32 expanded and the fp64 absorbed forms over [prefix, run] equal themselves over
    the joined keys (they join them), and the blocked path agrees with both (REL)."""
    got, _, _, a = segmented_against_one_run(2, 4, 11, 3, 2, 3, 5, 4, 7, 6, kv, torch.float32)
    q_nope, q_pe, c, k_pe, wkvb, cs, ks, cr, kr, csr, ksr, pre, kw = a
    for fn in (lambda **x: mla_chunk_attention(sdpa=False, **x), mla_chunk_attention_absorbed):
        seg = fn(q_nope=q_nope, q_pe=q_pe, c=cr, k_pe=kr, wkvb=wkvb, c_scale=csr, k_pe_scale=ksr,
                 prefix=pre, **kw)
        one = fn(q_nope=q_nope, q_pe=q_pe, c=c, k_pe=k_pe, wkvb=wkvb, c_scale=cs, k_pe_scale=ks,
                 **kw)
        assert torch.equal(seg, one)
        assert float((got - one).abs().max() / one.abs().max()) < REL


def test_a_prefix_of_another_format_is_refused():
    q_nope, q_pe, c, k_pe, wkvb = draw(1, 2, 3, 2, 2, 2, 4, 0)
    cq, kq, cs, ks = int8_cache_of(c, k_pe, [5])
    kw = dict(v_head_dim=2, scale=0.5)
    with pytest.raises(StrataError, match="prefix segment"):    # int8 prefix, bf16 run
        mla_chunk_attention(q_nope, q_pe, c[3:], k_pe[3:], wkvb,
                            prefix=[LatentSegment(cq[:3], kq[:3], cs[:3], ks[:3])], **kw)
    with pytest.raises(StrataError, match="too small"):    # bf16 segments need the c rows
        mla_chunk_attention(q_nope, q_pe, c[3:], k_pe[3:], wkvb, sdpa=True,
                            prefix=[LatentSegment(c[:3], k_pe[:3])],
                            scratch=poisoned(1, 4, 2, 2, 5, 64), **kw)


# -- the engine ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    from strata.packs import Pack
    from strata.packs.memory import MemoryPack
    from strata.packs.synth import ExpertFormats
    mem = MemoryPack(DS_TINY, ExpertFormats.of("BF16"), distinct=2, variants=1, device="cpu")
    path = mem.save(tmp_path_factory.mktemp("ds") / "m.pack", progress=False, tokenizer=False)
    return path, Pack.open(path).max_blob


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, DS_TINY.vocab, (N_TOK,), generator=torch.Generator().manual_seed(5))


def engine(pack, device="cpu", **kw):
    path, max_blob = pack
    ffn = "ref" if device == "cpu" else "kernel"
    return PrefillEngine(path, EngineConfig(vram=1 << 30, cache=24 * max_blob,
                                            max_prompt=64, device=device, ffn=ffn, chunk=CHUNK,
                                            ring=2, **kw))


class Spy:
    """Wraps eng.prompt_kv: what each prompt's PromptKV held (bytes, weak refs to its tensors)."""

    def __init__(self, eng, monkeypatch):
        self.real, self.made = eng.prompt_kv, []
        monkeypatch.setattr(eng, "prompt_kv", self)

    def __call__(self, n, stages):
        kv = self.real(n, stages)
        self.made.append(dict(vram=kv.vram_bytes, host=kv.host_bytes, n=n,
                              refs=[weakref.ref(t) for p in kv.hosted + kv.resident for t in p]))
        return kv


def streamed_bytes(shape, kv, resident, n=N_TOK, chunk=CHUNK):
    host = max(0, n - resident)
    return sum(min(P, host) for P in range(0, n, chunk)) * shape.kv_bytes(1, kv) * shape.n_layer


@pytest.mark.parametrize("kv", ["bf16", "int8"])
def test_streamed_equals_resident(pack, tokens, kv, monkeypatch):
    """Windows of 7 (host part 0..15: chunks at 0, 5, 10 start in it, the one at 15 ends past
    it, the one at 20 reads the window) and 13 (host part 0..9: the chunk at 10 starts at its
    end); every token resident as the reference."""
    whole = engine(pack, kv=kv, kv_resident=64).run(tokens)
    assert whole.kv_streamed == 0
    for resident in (7, 13):
        eng = engine(pack, kv=kv, kv_resident=resident)
        spy = Spy(eng, monkeypatch)
        part = eng.run(tokens)
        names = [n for n, _, _ in part.memory[0].placements]
        assert "kv_stage" in names and "mla_c" in names
        assert part.kv_streamed == streamed_bytes(DS_TINY, kv, resident) > 0
        assert torch.equal(part.logits, whole.logits), resident
        # what the prompt's KV held is what the plan charged: resident per layer, host in all
        (m,) = spy.made
        layers = range(DS_TINY.n_layer)
        assert m["vram"] == eng.sizes.kv_vram(N_TOK, layers) == \
            DS_TINY.n_layer * DS_TINY.kv_bytes(min(resident, N_TOK), kv)
        assert m["host"] == eng.sizes.kv_host_all(N_TOK) == \
            DS_TINY.n_layer * DS_TINY.kv_bytes(N_TOK - resident, kv)
        gc.collect()
        assert all(r() is None for r in m["refs"]), "host/resident KV kept after the prompt"
    if kv == "int8":    # the model's own int8 MLACache (all resident) holds the same codes
        assert torch.equal(engine(pack, kv="int8").run(tokens).logits, whole.logits)


@pytest.mark.parametrize("kv", ["bf16", "int8"])
def test_the_blocked_path_in_the_carve_streams_the_same_bits(pack, tokens, kv, monkeypatch):
    """CUDA's path on the CPU: bf16 dense math and the blocked attention (sdpa=True) in the
    scratch the engine carves from the loan (mla_k / mla_v / mla_state / mla_c, the plan's
    sizes: a block spanning the staged and resident keys is gathered into mla_c). Streamed
    against the same engine and plan read with every token in the model's own MLACache (the
    same loan, so the same expert passes): the same bits."""
    import strata.models.mla as mla
    real, seen = mla.mla_chunk_attention, []

    def blocked(*a, **kw):
        seen.append((kw["scratch"] is not None, len(kw["prefix"])))
        return real(*a, **{**kw, "sdpa": True})
    monkeypatch.setattr(mla, "mla_chunk_attention", blocked)
    eng = engine(pack, kv=kv, kv_resident=7, dtype=torch.bfloat16)
    part = eng.run(tokens)
    assert set(seen) == {(True, 0), (True, 1)}     # the carve's scratch; staged prefixes
    monkeypatch.setattr(eng.cfg, "kv_resident", None)   # the plan stays; the KV all resident
    whole = eng.run(tokens, plan=part.plan)
    assert whole.kv_streamed == 0 < part.kv_streamed
    assert torch.isfinite(part.logits).all() and torch.equal(part.logits, whole.logits)


def test_kv_released_and_cache_restored(pack, tokens, monkeypatch):
    eng = engine(pack, kv="int8", kv_resident=3)
    snap = eng.cache.buffer.clone()
    spy = Spy(eng, monkeypatch)
    res = eng.run(tokens, logits="last")
    gc.collect()
    assert spy.made[0]["refs"] and all(r() is None for r in spy.made[0]["refs"])
    assert torch.equal(eng.cache.buffer, snap) and res.kv_streamed > 0


def test_host_kv_that_does_not_fit_is_refused_before_pinning(pack, monkeypatch):
    """The GQA check's own test, on the latent's bytes (ModelShape.kv_bytes)."""
    refused_before_pinning(monkeypatch, DS_TINY, lambda: engine(pack, kv_resident=4))


def test_cli_refuses_with_one_line(pack, monkeypatch, capsys):
    from strata.cli import main
    monkeypatch.setattr(budget, "host_available", lambda: 1000)
    rc = main(["prefill", str(pack[0]), "--prompt-tokens", "40", "--kv-resident", "4",
               "--device", "cpu", "--chunk", "8"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "KV" in err, err


@pytest.mark.parametrize("kv", ["bf16", "int8"])
def test_prefill_cli_reads_with_a_host_held_window(pack, kv, capsys):
    from strata.cli import main
    assert main(["prefill", str(pack[0]), "--prompt-tokens", str(N_TOK), "--kv", kv,
                 "--kv-resident", "4", "--device", "cpu", "--chunk", str(CHUNK), "--experts",
                 "ref", "--max-prompt", "64"]) == 0
    assert "strata prefill: 23 tokens" in capsys.readouterr().out


def test_plan_shows_mla_host_kv(capsys):
    """strata plan --preset deepseek-v3 --kv-resident: the KV line's resident and host bytes
    are the preset's own per-token count (1,152 B bf16, 584 B int8) times the split."""
    import json
    from strata.cli import main
    from strata.shapes import get_preset
    ds = get_preset("deepseek-v3")
    for kv in ("bf16", "int8"):
        assert main(["plan", "--preset", "deepseek-v3", "--vram", "80GiB", "--max-prompt",
                     "131072", "--kv", kv, "--kv-resident", "32768", "--json"]) == 0
        got = json.loads(capsys.readouterr().out)["kv"]
        assert got["vram_bytes"] == ds.n_layer * 32768 * ds.kv_bytes(1, kv)
        assert got["host_bytes"] == ds.n_layer * (131072 - 32768) * ds.kv_bytes(1, kv)


@pytest.mark.parametrize("preset,vram,rows", [
    ("deepseek-v3", ["24GiB"] * 2, {("--kv-resident", "all"): 1536,
                                    ("--kv-resident", "32768"): 10496,
                                    ("--kv", "int8", "--kv-resident", "32768"): 12288, (): 13568}),
    ("kimi-k2", ["12GiB"] * 4, {("--kv-resident", "all"): 1024, ("--kv-resident", "32768"): 4864,
                                ("--kv", "int8", "--kv-resident", "32768"): 5888, (): 6400})])
def test_a_host_held_window_buys_a_long_document_its_chunk(capsys, preset, vram, rows):
    """docs/families.md's table: 131,072 tokens at Q4_K, the chunk with every latent token
    resident, with 32K a layer resident, and the default (auto: all resident would read 86 / 128
    chunks, so it spills to the window that keeps the spilled plan's chunk)."""
    import json
    from strata.cli import main
    for extra, chunk in rows.items():
        argv = ["plan", "--preset", preset, "--quant", "Q4_K", "--max-prompt", "131072",
                *extra, "--json"]
        for v in vram:
            argv += ["--vram", v]
        assert main(argv) == 0
        d = json.loads(capsys.readouterr().out)
        assert d["fits"] and d["chunk"] == chunk, (extra, d["chunk"])


# -- plan == PromptKV, any MLA shape ------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(L=st.integers(1, 40), R=st.sampled_from([2, 4, 8, 64]), n_layer=st.integers(1, 4),
       kv=st.sampled_from(KV_DTYPES), n=st.integers(1, 300),
       resident=st.one_of(st.none(), st.integers(1, 300)))
@example(L=512, R=64, n_layer=2, kv="int8", n=300, resident=100).via("DeepSeek-V3's widths")
@example(L=3, R=2, n_layer=1, kv="int8", n=7, resident=7).via(
    "the window holds the prompt: no host KV, no stage")
def test_plan_counts_what_prompt_kv_allocates(L, R, n_layer, kv, n, resident):
    shape = ModelShape("deepseek2", n_layer=n_layer, d_model=32, n_expert=4, top_k=2,
                       d_expert=16, n_head=2, n_kv_head=2, head_dim=4 + R, vocab=64,
                       mla=Mla(0, L, R, 4))
    pol = KVPolicy(kv, resident, n)
    sizes = model_sizes(shape, kv=pol)
    layout = PromptLayout(sizes, 1024, layout_spec(ffn_named("kernel"), pol, shape))
    bufs = {p.name: p.nbytes for p in layout.placements(1, 0)}
    held = sizes.kv_host(n, 0)
    assert ("kv_stage" in bufs) == (held > 0) and ("mla_c" in bufs) == (kv == "int8" or held > 0)
    stages = {l: torch.empty(bufs["kv_stage"], dtype=torch.uint8) for l in range(n_layer)} \
        if held else None
    heads, key_dim, value_dim = shape.kv_heads
    pk = PromptKV(n_layer, heads, key_dim, n, kv=kv, resident=resident,
                  devices=["meta"] * n_layer, stages=stages, value_dim=value_dim)
    assert pk.vram_bytes == sizes.kv_vram(n)
    assert pk.host_bytes == sizes.kv_host_all(n)
    for l, views in pk.stages.items():   # the stage's views are the host part's bytes, exactly
        assert sum(t.numel() * t.element_size() for t in views) == bufs["kv_stage"] == held
    if resident is None:   # all resident: the model's own MLACache keeps the same dtype and bytes
        cache = MLACache(n_layer, L, R, capacity=n, kv=kv)
        assert sum(t.numel() * t.element_size() for store in cache._stores()
                   for t in store) == sizes.kv_vram(n)


# -- CUDA ---------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("kv", ["bf16", "int8"])
def test_streamed_equals_resident_on_the_gpu(pack, tokens, kv, monkeypatch):
    """CUDA: pinned host KV staged on the copy lane, the blocked attention (every key block here
    spans the staged and resident keys: gathered into mla_c, or dequantized there piece by
    piece), the Triton expert GEMM. Against the same engine and plan — the same loan, slots, ring
    and carve, so the same experts stream in the same passes — reading with every token in the
    model's own MLACache (bf16 in the model's dtype on CUDA, or the same int8 codes): the same
    kernels on the same values, bit for bit."""
    for resident in (1, 7, 13):
        eng = engine(pack, device="cuda", kv=kv, kv_resident=resident)
        part = eng.run(tokens)
        assert eng.host.pinned and part.kv_streamed == streamed_bytes(DS_TINY, kv, resident)
        with monkeypatch.context() as m:
            m.setattr(eng.cfg, "kv_resident", None)    # the plan stays; the KV all resident
            whole = eng.run(tokens, plan=part.plan)
        assert whole.kv_streamed == 0 and torch.isfinite(part.logits).all()
        assert torch.equal(part.logits, whole.logits), (resident, float(
            (part.logits - whole.logits).abs().max() / whole.logits.abs().max()))


@pytest.mark.gpu
@pytest.mark.parametrize("kv", ["bf16", "int8"])
def test_segmented_at_deepseek_widths_on_the_gpu(kv):
    """CUDA, bf16 q, 8 of DeepSeek-V3's heads, its latent (512 + 64), blocks of 256 over a
    prefix cut off the block grid: [staged prefix, resident run] against one run, bit for bit."""
    got, whole, out, _ = segmented_against_one_run(8, 300, 900, 128, 64, 128, 512, 256, 11, 613,
                                                   kv, torch.bfloat16, device="cuda")
    assert torch.isfinite(got).all() and torch.equal(got, whole)
