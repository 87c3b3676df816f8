"""What the engine borrows and carves is what `strata plan` reported, byte for byte.

- `PrefillEngine.run` borrows and carves through `borrow_and_carve`, once per participant, and
  records what the Loan and the Carve actually took (`PrefillResult.memory`); the record equals
  the plan's JSON (bug (a): a short STAGE prompt on a fallback ring once carved every routed
  expert's slot, past the plan's ring; tests/engine/test_streaming.py watches the carve itself).
- A property: for any model shape (small random ones and the presets), rig (VRAM per GPU,
  cache, lend cap, pinned, ring override, fused, expert FFN, slab, MLA backend) and prompt length,
  `borrow_and_carve` over a real cache (or a meta-device one where the cache is large) takes
  exactly the loan slots, loan bytes, ring slots, placements, stop and tail the plan names; for
  the presets the plan is `strata plan --json`'s own output.
"""
from __future__ import annotations

import contextlib
import json
import os

import pytest
import torch
from hypothesis import HealthCheck, assume, event, example, given, settings, strategies as st

from strata.blob import BlobLayout
from strata.cli import main
from strata.engine import session as engine_session
from strata.engine.prefill import EngineConfig, PrefillEngine
from strata.engine.prompt_plan import plan_inputs, plan_prompt, resolve_kv
from strata.engine.session import borrow_and_carve
from strata.errors import PlanError, StrataError
from strata.kernels.moe.tiles import pin_tile
from strata.memory import ExpertCache, Loan, PromptLayout, plan_prefill, use_fused
from strata.memory.rig import RESERVE, participants
from strata.engine.load import load_model, resident_provider
from strata.models.mla_launch import BACKENDS, mla_launch, pin_mla_launch
from strata.models.moe import expert_ffn
from strata.packs.synth import ExpertFormats, synth_pack
from strata.planning import default_devices, layout_spec, model_sizes, scratch_reserve
from strata.shapes import PRESETS, DenseFfn, Mla, ModelShape, Router

# 64 experts, top-4: stream_all_min = 16, so a 15-token prompt stages up to 60 routed experts.
SHAPE = ModelShape(n_layer=4, d_model=64, n_expert=64, top_k=4, d_expert=32, n_head=4,
                   n_kv_head=2, head_dim=16, vocab=256)
TIGHT = 126     # cache blobs whose room holds the smallest chunk beside about 24 ring slots
ENV = ("STRATA_PREFILL_RING", "STRATA_STREAM_ALL_MIN", "STRATA_PF_FUSED", "STRATA_MMQ_SLAB",
       "STRATA_RING_AHEAD")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for k in ENV:
        monkeypatch.delenv(k, raising=False)


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    return synth_pack(tmp_path_factory.mktemp("p") / "e64.pack", SHAPE, ExpertFormats.of("Q8_0"),
                      progress=False)


def cli_plan(capsys, *argv) -> dict:
    rc = main(["plan", *argv, "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return json.loads(out.out)


def as_plan(b) -> dict:
    """An engine record (Borrowed) in the plan JSON's terms."""
    return {"name": b.name, "loan_slots": b.loan_slots, "loan": b.loan,
            "ring_slots": b.ring_slots, "bytes_needed": b.stop, "tail": b.tail,
            "placements": [{"name": n, "offset": o, "nbytes": s} for n, o, s in b.placements]}


def planned(pp: dict) -> dict:
    return {k: pp[k] for k in ("name", "loan_slots", "loan", "ring_slots", "bytes_needed", "tail",
                               "placements")}


@pytest.mark.parametrize("n_tokens,blobs,vram,kw", [
    (20, 40, ["1GiB"], dict(chunk=16, ring=16)),            # forced chunk, last chunk short
    (15, 200, ["1GiB"], dict(scan_max=512)),                # STAGE beside a fallback ring
    (20, 100, ["1GiB", "1GiB"], dict(ring=2)),              # two participants, each its own loan
    (15, TIGHT, ["1GiB"], dict(scan_max=256)),              # bug (a): STAGE capped at ~24 slots
], ids=["forced", "stage", "two-gpus", "stage-capped"])
def test_run_records_what_the_plan_reported(pack, capsys, monkeypatch, n_tokens, blobs, vram,
                                            kw):
    calls = []
    real = engine_session.borrow_and_carve

    def spy(cache, layout, chunk, pp, lend_cap, loans):
        calls.append(pp.name)
        return real(cache, layout, chunk, pp, lend_cap, loans)

    monkeypatch.setattr(engine_session, "borrow_and_carve", spy)
    from strata.packs import Pack
    from strata.units import parse_size
    cache = blobs * Pack.open(pack).max_blob
    eng = PrefillEngine(pack, EngineConfig(vram=[parse_size(v) for v in vram], cache=cache,
                                           max_prompt=64, device="cpu", ffn="ref", **kw))
    res = eng.run(torch.arange(n_tokens) % SHAPE.vocab)
    assert calls == [p.name for p in eng.parts]
    argv = ["--pack", str(pack), "--cache", str(cache), "--prompt-tokens", str(n_tokens),
            "--max-prompt", "64", "--experts", "ref"]
    for v in vram:
        argv += ["--vram", v]
    if "chunk" in kw:
        argv += ["--chunk", str(kw["chunk"])]
    if "ring" in kw:
        argv += ["--ring", str(kw["ring"])]
    if "scan_max" in kw:
        argv += ["--prefill", f"auto:{kw['scan_max']}"]
    d = cli_plan(capsys, *argv)
    assert (d["chunk"], d["ring"]) == (res.chunk, res.ring)
    if blobs == TIGHT:
        assert d["ring"] == "STAGE" and d["ring_slots"] < 15 * SHAPE.top_k
    assert [planned(p) for p in d["participants"]] == [as_plan(b) for b in res.memory]


# -- the property ---------------------------------------------------------------------------

FORMATS = ("Q8_0", "Q4_0", "BF16")            # block 32: fits every preset and random shape
PRESET_NAMES = sorted(PRESETS)
REAL_BYTES = 8 << 20                          # caches up to this size get a real CPU buffer

small_shapes = st.builds(
    lambda L, D, E, K, F, H, Hkv, hd: ModelShape(
        n_layer=L, d_model=32 * D, n_expert=E, top_k=min(K, E), d_expert=32 * F, n_head=H,
        n_kv_head=Hkv, head_dim=hd, vocab=64),
    L=st.integers(1, 4), D=st.integers(1, 3), E=st.integers(1, 48), K=st.integers(1, 8),
    F=st.integers(1, 3), H=st.integers(1, 4), Hkv=st.integers(1, 2), hd=st.integers(1, 16))


@st.composite
def rigs(draw, shape, blob_scale, base=0):
    """A rig: VRAM per GPU (base + k * blob_scale), cache, lend cap, pinned, ring override,
    fused, expert FFN, slab (with every launch pinned to stream-k, so it asks scratch), a forced
    chunk or the scan's MAX, the prompt's length (short ones often: STAGE) and its KV."""
    n_gpu = draw(st.integers(1, min(3, shape.n_layer)))
    return dict(
        vram=[base + draw(st.integers(1, 96)) * blob_scale for _ in range(n_gpu)],
        cache=draw(st.one_of(st.none(), st.integers(1, 4000).map(lambda k: k * blob_scale // 64))),
        lend_cap=draw(st.sampled_from([0.9, 0.5, 1.0, 0.25])),
        pinned=draw(st.booleans()),
        ring=draw(st.one_of(st.none(), st.none(), st.integers(1, 64))),
        fused=draw(st.booleans()),
        ffn=draw(st.sampled_from(["kernel", "auto", "ref"])),
        slab=draw(st.booleans()),
        chunk=draw(st.one_of(st.none(), st.integers(1, 700))),
        scan_max=draw(st.sampled_from([256, 1024, 4096, 32768])),
        n_tokens=draw(st.one_of(st.none(), st.integers(1, 64), st.integers(1, 5000))),
        max_prompt=draw(st.sampled_from([0, 64, 4096])),
        kv=draw(st.sampled_from(["bf16", "int8"])),
        kv_resident=draw(st.one_of(st.none(), st.just("auto"), st.integers(1, 5000))),
        mla=draw(st.sampled_from(BACKENDS)),
        # the run-ahead rule (STRATA_RING_AHEAD): off, or bytes per FLOP that grow these shapes'
        # rings (their layers' work is a few MFLOP to GFLOP)
        ahead=draw(st.sampled_from([0.0, 0.0, 1e-3, 1.0])),
    )


STREAM_K = dict(schedule="stream_k", programs=3)   # pin_tile(**STREAM_K): launches ask scratch


@contextlib.contextmanager
def launches(rig):
    """The rig's pins: the kernel's tile (stream-k with the slab, so the reserve is not 0) and
    MLA's block launch (its backend sizes mla_v: strata.models.mla_launch)."""
    with contextlib.ExitStack() as pins:
        if rig["slab"]:
            pins.enter_context(pin_tile(**STREAM_K))
        pins.enter_context(pin_mla_launch(backend=rig.get("mla", mla_launch().backend)))
        pins.enter_context(env_set("STRATA_RING_AHEAD", str(rig.get("ahead", 0.0))))
        yield


@contextlib.contextmanager
def env_set(name: str, value: str):
    """`name` set to `value` inside the block (both sides of a check read the same knobs)."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


def slab_env(on: bool):
    return env_set("STRATA_MMQ_SLAB", "1" if on else "0")


def engine_side(shape, layer_blob, native, rig, layouts):
    """The engine's own path on a GPU, minus the pack: the plan_inputs and plan_prompt calls
    PrefillEngine makes (the delta rule's auto backend resolved for CUDA, as strata plan
    resolves it: planning_for), then the borrow and carve it runs (over real CPU caches where
    small, meta-device ones where large)."""
    from strata.kernels.pins import planning_for
    with planning_for("cuda"):
        return _engine_side(shape, layer_blob, native, rig, layouts)


def _engine_side(shape, layer_blob, native, rig, layouts):
    blobs = [layer_blob[l] for l in range(shape.n_layer)]
    cfg = EngineConfig(vram=rig["vram"], cache=rig["cache"], lend_cap=rig["lend_cap"],
                       scan_max=rig["scan_max"], chunk=rig["chunk"], ring=rig["ring"],
                       pin=rig["pinned"], fused=rig["fused"] or None, ffn=rig["ffn"],
                       max_prompt=rig["max_prompt"] or rig["n_tokens"] or 0,
                       kv=rig.get("kv", "bf16"), kv_resident=rig.get("kv_resident", "auto"))
    cfg = resolve_kv(shape, blobs, native, cfg, "cuda")     # auto: the window, as the engine
    parts, bud, layout, fused = plan_inputs(shape, blobs, native, cfg, "cuda")
    check_kv(shape, cfg, bud, layout)
    devices = default_devices([p.name for p in parts])    # as strata plan picks them
    plan = plan_prompt(layout, parts, cfg, pinned=rig["pinned"], fused=fused, native=native,
                       n_tokens=rig["n_tokens"],
                       scratch_reserve=scratch_reserve(shape, devices, cfg.ffn, rig["slab"],
                                                       layouts))
    if not plan.fits:
        event("does not fit")
        return plan, None
    got = []
    for p, pp in zip(parts, plan.participants):
        dev = "cpu" if p.cache.nbytes <= REAL_BYTES else "meta"
        cache = ExpertCache(p.cache, lambda l, e: None, dev, fill=False)
        loans = []
        _, bufs, rec = borrow_and_carve(cache, layout, plan.chunk, pp, rig["lend_cap"], loans)
        if dev == "cpu":   # real views, inside the loan
            for name, t in bufs.bufs.items():
                lo = loans[0].buffer.data_ptr()
                assert lo <= t.data_ptr() and t.data_ptr() + t.numel() * t.element_size() \
                    <= lo + loans[0].nbytes, name
        got.append(rec)
    return plan, got


def check_kv(shape, cfg, bud, layout):
    """The budgets charge each full layer the resident window's KV in the KV dtype and each
    sliding layer (window W, GPT-OSS) its last W - 1 tokens; the host holds the full layers'
    rest, and the layout stages one full layer's host-held KV exactly when there is some (the
    kernel's count)."""
    from strata.kernels.attention import kv_token_bytes
    n = cfg.max_prompt
    res = n if cfg.kv_resident is None else min(n, cfg.kv_resident)
    # MLA (deepseek2) caches the latent and the rope key: (kv_lora + qk_rope) * 2 a token in
    # bf16, kv_lora + qk_rope + 8 in int8 (one fp32 scale each)
    m = shape.mla
    tok = (((m.kv_lora + m.qk_rope) * 2 if cfg.kv == "bf16" else
            m.kv_lora + m.qk_rope + 8) if m
           else kv_token_bytes(cfg.kv, shape.n_kv_head, shape.head_dim))
    win = [shape.layer_window(l) for l in range(shape.n_layer)]
    kept = [min(n, w - 1) if w else res for w in win]
    # a linear-attention layer (Qwen3-Next, Qwen3.5) keeps no KV but its recurrent state: the
    # conv's last K-1 inputs of 2 Hk dk + Hv dv channels (bf16, fp32 beside fp32 KV) and S
    # [Hv, dk, dv] fp32, whatever the prompt's length
    lin = shape.linear
    state = 0 if lin is None else (
        (lin.conv_kernel - 1) * (2 * lin.n_k_head * lin.k_head_dim + lin.n_v_head * lin.v_head_dim)
        * (4 if cfg.kv == "fp32" else 2) + lin.n_v_head * lin.k_head_dim * lin.v_head_dim * 4)
    linear = [shape.layer_kind(l) == "linear" for l in range(shape.n_layer)]
    per = [state if linear[l] else kept[l] * tok for l in range(shape.n_layer)]
    for b in bud:
        assert b.kv == sum(per[l] for l in b.layers)
    for l, w in enumerate(win):
        assert layout.sizes.kv_host(n, l) == (0 if w or linear[l] else (n - res) * tok)
    stage = [p for p in layout.placements(1, 0) if p.name == "kv_stage"]
    assert [p.nbytes for p in stage] == ([(n - res) * tok] if n > res else [])
    from strata.kernels.attention import expand_rows     # the int8 attention's scratch
    rows = expand_rows(n) if cfg.kv == "int8" and not shape.mla else 0   # MLA: its mla_c
    expand = [p.nbytes for p in layout.placements(1, 0) if p.name.startswith("kv_expand_")]
    assert expand == ([rows * shape.n_kv_head * shape.head_dim * 2] * 2 if rows else [])
    event(f"kv {cfg.kv}, {'streams' if n > res else 'resident'}")


def check(plan, got, plan_dict=None):
    event(f"rule {plan.rule}, ring {'STAGE' if plan.ring == 'STAGE' else 'slots'}, "
          f"{len(got)} GPU(s), reserve {any(p.scratch_reserve for p in plan.participants)}, "
          f"borrowed it {any(p.borrow > p.bytes_needed for p in plan.participants)}, "
          f"grown {plan.growth or 'no'}")
    want = [planned(p) for p in (plan_dict or plan.to_dict())["participants"]]
    assert [as_plan(b) for b in got] == want
    for b, pp in zip(got, plan.participants):
        assert b.stop == pp.bytes_needed <= pp.borrow and b.loan >= pp.borrow
        assert b.ring_slots == pp.ring_slots


@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow,
                                                  HealthCheck.function_scoped_fixture])
@given(data=st.data(), shape=small_shapes, fmts=st.lists(st.sampled_from(FORMATS), min_size=4,
                                                          max_size=4))
@example(data=None, shape=SHAPE, fmts=["Q8_0"] * 4).via("bug (a): STAGE capped at a small ring")
def test_engine_takes_what_the_plan_names_small_shapes(data, shape, fmts):
    layouts = [BlobLayout.make(shape.d_model, shape.d_expert, fmts[l])
               for l in range(shape.n_layer)]
    layer_blob = {l: lay.size for l, lay in enumerate(layouts)}
    blob = max(layer_blob.values())
    if data is None:    # the pinned example: a 24-slot fallback ring, 15 tokens, 64 experts
        rig = dict(vram=[1 << 30], cache=60 * blob, lend_cap=0.9, pinned=True, ring=None,
                   fused=False, ffn="ref", slab=False, chunk=None, scan_max=256, n_tokens=15,
                   max_prompt=64)
    else:
        rig = data.draw(rigs(shape, blob * 64, base=RESERVE))
    try:
        with launches(rig):
            plan, got = engine_side(shape, layer_blob, True, rig, layouts)
    except (PlanError, StrataError):
        assume(False)
    if data is None:
        assert plan.rule == "fallback" and plan.ring == "STAGE" and plan.ring_slots < 60
    if got is not None:
        check(plan, got)


family_shapes = st.builds(
    lambda L, lead, D, E, G, K, F, shared, arch: ModelShape(
        arch=arch, n_layer=L, d_model=32 * D, n_expert=E * G, top_k=min(K, E * G), d_expert=32 * F,
        n_head=4, n_kv_head=4 if arch == "deepseek2" else 2, head_dim=24 if arch == "deepseek2"
        else 16, vocab=64, dense=DenseFfn(min(lead, L - 1), 96, shared),
        router=Router("sigmoid", G, G), mla=Mla(32, 32, 8, 16) if arch == "deepseek2" else None),
    L=st.integers(2, 5), lead=st.integers(1, 3), D=st.integers(1, 3), E=st.integers(1, 12),
    G=st.sampled_from([1, 2, 4]), K=st.integers(1, 8), F=st.integers(1, 3),
    shared=st.integers(0, 2), arch=st.sampled_from(["glm4moe", "deepseek2"]))


@settings(max_examples=30, suppress_health_check=[HealthCheck.too_slow,
                                                  HealthCheck.function_scoped_fixture])
@given(data=st.data(), shape=family_shapes, fmts=st.lists(st.sampled_from(FORMATS), min_size=5,
                                                           max_size=5))
def test_engine_takes_what_the_plan_names_dense_leading_shapes(data, shape, fmts):
    """Shapes whose first layers are dense (no blobs, no cache slots; their FFN in their dense
    bytes) and whose MoE layers carry shared experts: the engine still takes exactly what the
    plan names, and no cache slot belongs to a dense layer."""
    layouts = [BlobLayout.make(shape.d_model, shape.d_expert, fmts[l]) if shape.is_moe_layer(l)
               else None for l in range(shape.n_layer)]
    layer_blob = {l: lay.size if lay is not None else 0 for l, lay in enumerate(layouts)}
    rig = data.draw(rigs(shape, max(layer_blob.values()) * 64, base=RESERVE))
    rig["kv"] = "bf16" if shape.mla else rig["kv"]       # MLA KV is bf16 only
    try:
        with launches(rig):
            plan, got = engine_side(shape, layer_blob, True, rig, layouts)
    except (PlanError, StrataError):
        assume(False)
    cfg = EngineConfig(vram=rig["vram"], cache=rig["cache"], lend_cap=rig["lend_cap"],
                       max_prompt=rig["max_prompt"] or rig["n_tokens"] or 0)
    parts, _, _, _ = plan_inputs(shape, [layer_blob[l] for l in range(shape.n_layer)], True,
                                 cfg, "cuda")
    assert all(shape.is_moe_layer(l) for p in parts for l, _ in p.cache.slot_owner)
    # the dense FFN in the dense layer's bytes, the router, bias and shared experts in a MoE
    # layer's (the attention and the two norms the same in both)
    D, E, Fs = shape.d_model, shape.n_expert, shape.dense.shared * shape.d_expert
    sizes = model_sizes(shape)
    assert sizes.dense_layers[0] - sizes.dense_layers[-1] == (3 * D * shape.dense.d_ff - E * D - E
                                                              - 3 * D * Fs) * 2
    if got is not None:
        check(plan, got)


@settings(max_examples=25, suppress_health_check=[HealthCheck.too_slow,
                                                  HealthCheck.function_scoped_fixture])
@given(data=st.data(), name=st.sampled_from(PRESET_NAMES), fmt=st.sampled_from(FORMATS))
@example(data=None, name="qwen3-30b-a3b", fmt="Q8_0").via("the issue's case: 15 tokens, 105 slots")
@example(data=None, name="deepseek-v3", fmt="Q4_K").via("the run-ahead rule's grown ring at 8K")
def test_engine_takes_what_strata_plan_reports_presets(capsys, data, name, fmt):
    shape = PRESETS[name]
    layout = BlobLayout.for_shape(shape, fmt)   # biases too (GPT-OSS), as strata plan
    blob = layout.size
    if data is None and name == "deepseek-v3":    # STRATA_RING_AHEAD=2.3e-4 at 8K, 24 GiB
        rig = dict(vram=[24 << 30], cache=None, lend_cap=0.9, pinned=True, ring=None,
                   fused=False, ffn="auto", slab=False, chunk=None, scan_max=32768,
                   n_tokens=8192, max_prompt=0, ahead=2.3e-4)
    elif data is None:
        rig = dict(vram=[12 << 30], cache=None, lend_cap=0.9, pinned=True, ring=None,
                   fused=False, ffn="kernel", slab=False, chunk=None, scan_max=32768,
                   n_tokens=15, max_prompt=0)
    else:
        rig = data.draw(rigs(shape, 1 << 30))
    argv = ["--preset", name, "--quant", fmt, "--lend-cap", str(rig["lend_cap"]),
            "--experts", rig["ffn"]]
    argv += ["--prefill", f"auto:{rig['scan_max']}"] * (rig["chunk"] is None)
    argv += [a for v in rig["vram"] for a in ("--vram", str(v))]
    for flag, key in (("--cache", "cache"), ("--ring", "ring"), ("--chunk", "chunk"),
                      ("--prompt-tokens", "n_tokens"), ("--max-prompt", "max_prompt"),
                      ("--kv", "kv"), ("--kv-resident", "kv_resident")):
        if rig.get(key):
            argv += [flag, str(rig[key])]
    argv += ["--kv-resident", "all"] * ("kv_resident" in rig and rig["kv_resident"] is None)
    argv += ["--unpinned"] * (not rig["pinned"]) + ["--fused"] * rig["fused"]
    with slab_env(rig["slab"]), launches(rig):
        rc = main(["plan", *argv, "--json"])
        out = capsys.readouterr()
        if (rig["n_tokens"] or 0) > shape.max_pos:    # a tiny preset's context: refused first
            assert rc == 2 and "longer than the model's context" in out.err
            assume(False)
        try:
            # a leading dense layer (deepseek-v3, kimi-k2, glm-4.5) has no blobs
            plan, got = engine_side(shape, {l: blob if shape.is_moe_layer(l) else 0
                                            for l in range(shape.n_layer)}, True, rig, [layout])
        except (PlanError, StrataError):
            assert rc == 2
            assume(False)
    d = json.loads(out.out)
    assert rc == (0 if plan.fits else 2) and d["fits"] == plan.fits
    if data is None and name == "deepseek-v3":    # a pass of 9 and 6.6 TFLOP of copies ahead
        assert d["growth"] == "ahead" and d["full_ring"] == 18 < d["ring"] == d["ring_slots"]
        assert d["participants"][0]["batch"] == 9
    elif data is None:
        assert d["ring"] == "STAGE" and d["ring_slots"] == 105
        assert d["bytes_needed"] == 530_612_992                      # 530.6 MB
    if got is not None:
        check(plan, got, d)


@pytest.mark.gpu
def test_on_the_gpu_the_slab_reserve_is_borrowed_as_planned(pack, capsys, monkeypatch):
    """On CUDA with the slab on and every launch pinned to stream-k: the loan includes the
    slab's reserve sized by the device's own SM count, exactly as `strata plan` reports it."""
    from strata.packs import Pack
    monkeypatch.setenv("STRATA_MMQ_SLAB", "1")
    cache = 100 * Pack.open(pack).max_blob
    with pin_tile(**STREAM_K):
        eng = PrefillEngine(pack, EngineConfig(vram=1 << 30, cache=cache, max_prompt=64,
                                               ffn="kernel", chunk=16, ring=8))
        res = eng.run(torch.arange(20) % SHAPE.vocab, logits="none")
        d = cli_plan(capsys, "--pack", str(pack), "--vram", "1GiB", "--cache", str(cache),
                     "--chunk", "16", "--ring", "8", "--prompt-tokens", "20", "--max-prompt",
                     "64", "--experts", "kernel")
    (pp,) = d["participants"]
    assert pp["scratch_reserve"] > 0 and pp["borrow"] == pp["bytes_needed"] + pp["scratch_reserve"]
    assert [planned(p) for p in d["participants"]] == [as_plan(b) for b in res.memory]


@pytest.mark.parametrize("fmt", ["Q4_0", "Q2_K", "MXFP4"])
def test_the_fallback_ring_counts_what_a_slot_costs_beside_its_stride(fmt):
    """quant_quality's first GPU run (qwen3-30b-a3b, 8 layers, --vram 4GiB, the expert FFN the
    GPU picks): where even the smallest chunk leaves no full ring, the fallback once took
    room / slot stride slots, but a slot also grows the passes' buffers (a decoded expert is
    2 B a weight beside a 0.56 B Q4_0 blob), so "nothing fits" where a smaller ring did. The
    fallback's ring is the most slots that fit beside the smallest chunk: one more does not."""
    from strata.commands._args import resolve_experts
    from strata.memory.ring import RING_MIN
    shape = PRESETS["qwen3-30b-a3b"].with_(n_layer=8)
    size = ExpertFormats.of(fmt).layout(shape).size
    cfg = EngineConfig(vram=[4 << 30], max_prompt=8192, ffn=resolve_experts("auto", "cuda"))
    parts, _, layout, fused = plan_inputs(shape, [size] * shape.n_layer, True, cfg, "cuda")
    plan = plan_prompt(layout, parts, cfg, pinned=True, fused=fused, native=True, n_tokens=8192)
    room = parts[0].room
    assert plan.rule == "fallback" and plan.fits and plan.bytes_needed <= room
    assert plan.ring >= RING_MIN and layout.bytes_needed(256, plan.ring + 1) > room
    by_stride = (room - layout.bytes_needed(256, 0)) // layout.slot_stride
    assert by_stride > plan.ring and layout.bytes_needed(256, by_stride) > room   # the old count
