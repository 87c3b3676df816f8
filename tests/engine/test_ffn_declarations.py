"""Each expert FFN is an object that declares its layout buffers, its slab scratch and its
landing (strata.models.moe.EXPERT_FFNS); the planner reads the declaration and the engine takes
exactly those bytes (the one-source rule), for every FFN of the registry:

- the planner's placements hold the buffers the FFN declares (wdec: G x BB bytes) and no other
  FFN's, the slab reserve is borrowed exactly when the FFN declares fixup scratch, and the
  engine's borrow and carve take what the plan names, byte for byte;
- a real PrefillEngine run records (PrefillResult.memory) the plan it reports for that FFN.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from strata.blob import BlobLayout
from strata.engine.engine_config import engine_policy
from strata.engine.prefill import EngineConfig, PrefillEngine
from strata.errors import PlanError, StrataError
from strata.models.moe import DECODE_BUF, EXPERT_FFNS, FFN_CHOICES, ffn_named
from strata.planning import dims_for
from tests.engine.test_plan_equals_engine import (SHAPE, as_plan, check, engine_side, launches,
                                                  pack, planned)  # noqa: F401 (fixture)


@pytest.mark.parametrize("name", FFN_CHOICES)
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(slab=st.booleans(), n_tokens=st.integers(1, 200), chunk=st.sampled_from([None, 7, 16]),
       fmt=st.sampled_from(["Q8_0", "Q4_0"]), ring=st.sampled_from([3, 16]))
def test_the_engine_takes_what_the_ffn_declares(name, slab, n_tokens, chunk, fmt, ring):
    ffn = EXPERT_FFNS[name]
    layouts = [BlobLayout.make(SHAPE.d_model, SHAPE.d_expert, fmt)] * SHAPE.n_layer
    layer_blob = {l: lay.size for l, lay in enumerate(layouts)}
    rig = dict(vram=[1 << 30], cache=1000 * layouts[0].size, lend_cap=0.9, pinned=True,
               ring=ring, fused=False, ffn=name, slab=slab, chunk=chunk, scan_max=256,
               n_tokens=n_tokens, max_prompt=256)
    try:
        with launches(rig):   # the slab on: every launch pinned to stream-k, so it asks scratch
            plan, got = engine_side(SHAPE, layer_blob, True, rig, layouts)
    except PlanError:
        assume(False)
    assert got is not None and plan.fits
    check(plan, got)
    names = {n for b in got for n, _, _ in b.placements}
    declared = {b.name for b in ffn.buffers}
    assert declared <= names
    assert ("wdec" in names) == (DECODE_BUF in ffn.buffers)
    for b in got:
        dims = dims_for(SHAPE, plan.chunk, ring=b.ring_slots, batch=None)
        for n, _, nbytes in b.placements:
            if n == "wdec":
                assert nbytes == dims["G"] * dims["BB"]
    reserve = [pp.scratch_reserve for pp in plan.participants]
    assert any(reserve) == (slab and ffn.fixup_scratch)


def test_the_registry_reads_each_name_once():
    assert tuple(EXPERT_FFNS) == FFN_CHOICES
    for name, ffn in EXPERT_FFNS.items():
        assert ffn.name == name and ffn_named(name) is ffn and ffn_named(ffn) is ffn
        assert EngineConfig(vram=1 << 30, ffn=name).ffn is ffn
    assert [n for n, f in EXPERT_FFNS.items() if f.lands] == ["plane", "plane-int8"]
    assert ffn_named("auto").on("cpu") is EXPERT_FFNS["ref"]
    assert ffn_named("auto").on("cuda") is EXPERT_FFNS["auto"]
    with pytest.raises(StrataError, match="unknown expert FFN 'fast'"):
        ffn_named("fast")


@pytest.mark.parametrize("name", ["ref", "torch", "plane", "int8", "plane-int8"])
def test_a_run_records_the_plan_of_its_ffn(pack, name):   # noqa: F811 (the fixture)
    from strata.packs import Pack
    cache = 100 * Pack.open(pack).max_blob
    # two chunks, the last one short, over a streamed ring: the record and the plan do not
    # depend on the prompt's length, the interpreter's launches (one per routed expert block
    # and pass) do, so the prompt is a few tokens
    eng = PrefillEngine(pack, EngineConfig(vram=[1 << 30], cache=cache, max_prompt=64,
                                           device="cpu", ffn=name, chunk=4, ring=16))
    try:
        res = eng.run(torch.arange(6) % SHAPE.vocab)
        assert len(res.stats.chunks) == 2
        policy = engine_policy(eng.cfg)
        plan = eng.plan(6, slab=policy.slab, policy=policy)
    finally:
        eng.host.close()
    assert [planned(p) for p in plan.to_dict()["participants"]] == \
        [as_plan(b) for b in res.memory]
    assert (eng.cache.land is not None) == EXPERT_FFNS[name].lands


@settings(max_examples=25, deadline=None)
@given(d=st.integers(1, 96), f=st.integers(1, 96), bias=st.booleans(),
       fmt=st.sampled_from(["Q8_0", "Q4_0", "MXFP4", "BF16"]))
def test_the_planner_sizes_a_decoded_expert_as_the_decoded_ffn_does(d, f, bias, fmt):
    """BB (the planner's decode-buffer slot) is the size of the blob moe_ffn_decoded writes,
    bf16_layout of the layer's own layout: the bias slot counted for GPT-OSS's biased experts,
    every region 256-aligned, whatever the source format."""
    from dataclasses import replace
    from strata.blob import bf16_layout
    from strata.shapes import GptOssOptions
    shape = replace(SHAPE, d_model=32 * d, d_expert=32 * f, opts=GptOssOptions() if bias else None)
    lay = BlobLayout.for_shape(shape, fmt)
    bb = dims_for(shape, 8)["BB"]
    assert bb == bf16_layout(lay).size
    D, F = shape.d_model, shape.d_expert
    assert bb >= 3 * D * F * 2 + (4 * (2 * F + D) if bias else 0)
    assert (bf16_layout(lay).bias is not None) == bias == (lay.bias is not None)


@pytest.mark.parametrize("name", ["decoded", "auto"])
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n_tokens=st.integers(1, 200), chunk=st.sampled_from([None, 8]),
       ring=st.sampled_from([2, 5]))
def test_the_engine_carves_decode_room_for_biased_experts(name, n_tokens, chunk, ring):
    """GPT-OSS's experts (biases, swiglu_oai): the carve's wdec holds G whole BF16 blobs of the
    layer's bf16_layout, bias slots included, as the decoded FFN divides it (cap = bytes // BB)."""
    from strata.blob import bf16_layout
    from tests.models.hf_archs import GPT_OSS_TINY as shape
    layouts = [BlobLayout.for_shape(shape, "MXFP4")] * shape.n_layer
    layer_blob = {l: lay.size for l, lay in enumerate(layouts)}
    rig = dict(vram=[1 << 30], cache=100 * layouts[0].size, lend_cap=0.9, pinned=True,
               ring=ring, fused=False, ffn=name, slab=False, chunk=chunk, scan_max=256,
               n_tokens=n_tokens, max_prompt=256)
    try:
        plan, got = engine_side(shape, layer_blob, True, rig, layouts)
    except PlanError:
        assume(False)
    assert got is not None and plan.fits
    check(plan, got)
    bb = bf16_layout(layouts[0]).size
    assert layouts[0].bias is not None and bb > 3 * shape.d_model * shape.d_expert * 2
    for b in got:
        dims = dims_for(shape, plan.chunk, ring=b.ring_slots, batch=None)
        assert dims["BB"] == bb
        wdec = [s for n, _, s in b.placements if n == "wdec"]
        assert wdec == [dims["G"] * bb] and dims["G"] >= 1


def test_auto_runs_the_reference_on_the_cpu(tmp_path):
    """EngineConfig's default FFN (auto) resolves per device as --experts does: the reference on
    the CPU (no CUDA query: the engine API read a CPU prompt into torch.cuda before), auto on
    CUDA; an explicit choice stays as named."""
    from strata.engine.engine_config import resolved
    from strata.packs.synth import ExpertFormats, synth_pack
    from strata.shapes import get_preset
    assert resolved(EngineConfig(vram=1 << 30), "cpu").ffn is EXPERT_FFNS["ref"]
    assert resolved(EngineConfig(vram=1 << 30), "cuda").ffn is EXPERT_FFNS["auto"]
    assert resolved(EngineConfig(vram=1 << 30, ffn="kernel"), "cpu").ffn is EXPERT_FFNS["kernel"]
    path = synth_pack(tmp_path / "t.pack", get_preset("tiny"), ExpertFormats.of("Q8_0"),
                      progress=False)
    eng = PrefillEngine(path, EngineConfig(vram=1 << 30, cache=200 << 10, chunk=16, ring=2,
                                           max_prompt=40, device="cpu"))
    got = eng.run(torch.arange(40) % 50 + 1).logits
    assert eng.cfg.ffn.name == "ref" and torch.isfinite(got).all()
