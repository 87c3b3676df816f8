"""`--kv-resident auto` (strata.memory.kv_window): the default KV placement.

What holds, by the planner's own count (plan_inputs + plan_prompt, the calls the engine and
`strata plan` make; no ring growth, as auto compares the scan's own ring):

- When the all-resident plan fits and reads the prompt in as few chunks as the target (the plan
  with the KV spilled to the grid's first window), auto is all resident and the plan is that
  plan, number for number (the same dict).
- When it does not fit, or fits only by reading more chunks ("squeezed"), and the target fits,
  the chosen window W:
  - fits, with the chunk, rule and every participant's ring of the target (the plan with the
    KV spilled to the grid's first window), and the budget adds up exactly: dense + KV of W +
    reserve + cache = VRAM, bytes_needed of that chunk and ring <= the cache's room, the host
    holds the full layers' other tokens;
  - is the largest such window on the grid whenever raising W costs the room more than it
    gives back (lend cap x full layers > 1, module docstring): no explicit N above W keeps the
    target's chunk and ring, and no explicit N that fits reads a larger chunk than auto's.
- When even the spilled plan does not fit, auto is all resident and fails as that plan does.
- The CLI: a tiny pack under a --vram where only a spilled plan fits reads its prompt, says
  what auto chose and why (prefill's report and `strata plan` name the same window), and reads
  what an explicit --kv-resident of that window reads; bad values are one line, exit 2.
"""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from strata import budget
from strata.blob import BlobLayout
from strata.cli import main
from strata.engine import prefill as engine_prefill
from strata.engine.engine_config import EngineConfig
from strata.engine.prefill import PrefillEngine
from strata.engine.prompt_plan import plan_inputs, plan_prompt, resolve_kv
from strata.errors import StrataError
from strata.memory import RingPolicy
from strata.memory.kv_window import plan_key, windows
from strata.memory.rig import RESERVE
from strata.memory.ring import RING_MIN
from strata.models.kv import kv_windows
from strata.models.moe import ffn_named
from strata.packs.synth import ExpertFormats, synth_pack
from strata.shapes import ModelShape, Window, get_preset

PLAIN = RingPolicy(grow=False)    # the scan's own ring, as auto compares it

shapes = st.builds(
    lambda L, E, K, Hkv, hd, slide: ModelShape(
        n_layer=L, d_model=64, n_expert=E, top_k=min(K, E), d_expert=32, n_head=4,
        n_kv_head=Hkv, head_dim=hd, vocab=64,
        window=Window(64, 2) if slide else None),
    L=st.integers(2, 6), E=st.sampled_from([4, 16, 64]), K=st.integers(1, 4),
    Hkv=st.integers(1, 2), hd=st.sampled_from([8, 16]), slide=st.booleans())


def plan_at(shape, blobs, cfg, window):
    """(plan, budgets, layout) of a prompt of cfg.max_prompt tokens with this window, or None
    when the KV leaves no room for a cache."""
    c = replace(cfg, kv_resident=window)
    try:
        parts, bud, layout, fused = plan_inputs(shape, blobs, True, c, "cuda", PLAIN)
        plan = plan_prompt(layout, parts, c, pinned=True, fused=fused, native=True,
                           n_tokens=c.max_prompt, policy=PLAIN)
    except StrataError:
        return None, None, None
    return plan, bud, layout


def fits(plan) -> bool:
    return plan is not None and plan.fits


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), shape=shapes, max_prompt=st.sampled_from([200, 1000, 4096, 20000]),
       share=st.floats(0.0, 1.2), work=st.floats(0.9, 2.5),
       lend_cap=st.sampled_from([0.9, 1.0, 0.5]), kv=st.sampled_from(["bf16", "int8"]))
def test_auto_window_fits_and_is_the_largest(data, shape, max_prompt, share, work, lend_cap,
                                             kv):
    """The VRAM: dense + reserve + `share` of the whole KV + `work` times the room the
    smallest chunk with the smallest ring and one layer's staged KV ask (so all three cases
    come up)."""
    blob = BlobLayout.make(shape.d_model, shape.d_expert, "Q8_0").size
    blobs = [blob] * shape.n_layer
    kv_all = shape.n_layer * shape.kv_bytes(max_prompt, kv)
    roomy = EngineConfig(vram=1 << 40, kv_resident=None, kv=kv, max_prompt=max_prompt)
    _, bud, layout, _ = plan_inputs(shape, blobs, True, roomy, "cuda", PLAIN)
    least = layout.bytes_needed(256, RING_MIN) / lend_cap
    stage = kv_all // shape.n_layer           # spilled: one layer's KV staged back
    vram = RESERVE + bud[0].dense + int(share * kv_all + work * (least + stage))
    cfg = EngineConfig(vram=vram, max_prompt=max_prompt, lend_cap=lend_cap, kv=kv, ffn="kernel")
    got = resolve_kv(shape, blobs, True, cfg, "cuda", PLAIN)
    choice = got.kv_choice
    event(choice.why)
    whole, _, _ = plan_at(shape, blobs, cfg, None)
    grid = windows(max_prompt)
    target, _, _ = plan_at(shape, blobs, cfg, grid[0])
    full = [l for l, w in enumerate(kv_windows(shape)) if not w]
    n_chunks = lambda p: -(-max_prompt // p.chunk)   # noqa: E731
    if fits(whole) and not (full and fits(target) and n_chunks(target) < n_chunks(whole)):
        assert choice.why == "fits" and got.kv_resident is None
        same, _, _ = plan_at(shape, blobs, got, got.kv_resident)
        assert same.to_dict() == whole.to_dict()
        return
    if not fits(target) or not full:
        assert choice.why == "no-help" and got.kv_resident is None
        return
    assert choice.why == ("squeezed" if fits(whole) else "spilled")
    W = got.kv_resident
    plan, bud, layout = plan_at(shape, blobs, cfg, W)
    assert fits(plan) and plan_key(plan) == plan_key(target)
    assert (choice.chunk, choice.ring, choice.rule) == (target.chunk, target.ring, target.rule)
    sizes = layout.sizes
    for b, p in zip(bud, plan.participants):     # the budget, exactly
        assert b.dense + b.kv + b.reserve + b.cache == b.vram
        assert b.kv == sizes.kv_vram(max_prompt, b.layers)
        assert p.bytes_needed == layout.bytes_needed(plan.chunk, p.ring_slots, p.batch) <= p.room
    assert sizes.kv_host_all(max_prompt) == len(full) * shape.kv_bytes(max_prompt - W, kv)
    if lend_cap * len(full) <= 1:
        event("the window costs the room no more than it gives back: maximality not claimed")
        return
    above = [w for w in grid if w > W]
    if above:
        n = data.draw(st.sampled_from(above))
        other, _, _ = plan_at(shape, blobs, cfg, n)
        assert not (fits(other) and plan_key(other) == plan_key(target)), n
    n = data.draw(st.sampled_from(grid))
    other, _, _ = plan_at(shape, blobs, cfg, n)
    if fits(other):
        assert other.chunk <= plan.chunk


def test_no_kv_reserve_is_all_resident():
    shape = get_preset("tiny")
    cfg = resolve_kv(shape, [4096] * shape.n_layer, True, EngineConfig(vram=2 << 30), "cuda")
    assert cfg.kv_resident is None


@pytest.mark.parametrize("bad", ["0", "-3", "nonsense", "1.5"])
def test_engine_config_refuses_a_bad_window(bad):
    with pytest.raises(StrataError) as e:
        EngineConfig(vram=1 << 30, kv_resident=bad)
    assert "--kv-resident" in str(e.value) and "\n" not in str(e.value)


# -- the CLI on a tiny pack ------------------------------------------------------------------
SHAPE = get_preset("tiny")        # L=2, fp32 KV on the CPU: 512 B a token
N = 200
# 1 GiB reserve + 700 KiB: the KV of 200 tokens leaves no chunk room, a 15-token window does
# (found by the planner: `strata plan --pack tiny.pack --device cpu --prompt-tokens 200`)
VRAM = str((1 << 30) + 700 * 1024)
RUN = ["--device", "cpu", "--prompt-tokens", str(N), "--vram", VRAM]


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    return synth_pack(tmp_path_factory.mktemp("p") / "tiny.pack", SHAPE,
                      ExpertFormats.of("Q8_0"), progress=False)


def run_json(capsys, *argv):
    rc = main([*argv, "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return json.loads(out.out)


def test_cli_auto_spills_and_says_so(pack, capsys, tmp_path):
    plan = run_json(capsys, "plan", "--pack", str(pack), *RUN)
    auto = plan["kv"]["auto"]
    assert auto["why"] == "spilled" and plan["fits"]
    W = plan["kv"]["resident_tokens"]
    assert W == auto["window"] and 1 <= W < N and plan["kv"]["host_bytes"] > 0
    assert main(["plan", "--pack", str(pack), *RUN]) == 0
    text = capsys.readouterr().out
    assert f"auto: the newest {W:,} tokens of each full layer in VRAM" in text
    assert main(["plan", "--pack", str(pack), *RUN, "--kv-resident", "all"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "fit" in err

    rep = run_json(capsys, "prefill", str(pack), *RUN, "--dump-logits",
                   str(tmp_path / "auto.npy"))
    assert rep["kv"]["resident_tokens"] == W and rep["kv"]["auto"] == auto
    assert rep["kv"]["host_bytes"] == plan["kv"]["host_bytes"] > 0
    assert rep["plan"]["chunk"] == plan["chunk"] and rep["plan"]["ring"] == plan["ring"]
    same = run_json(capsys, "prefill", str(pack), *RUN, "--kv-resident", str(W),
                    "--dump-logits", str(tmp_path / "explicit.npy"))
    assert same["kv"]["auto"] is None and same["plan"] == rep["plan"]
    a, b = (np.load(tmp_path / f"{n}.npy") for n in ("auto", "explicit"))
    assert np.isfinite(a).all() and np.array_equal(a, b)


@pytest.mark.parametrize("bad", ["0", "nonsense", "-1"])
@pytest.mark.parametrize("cmd", ["plan", "prefill"])
def test_cli_bad_window_is_one_line(pack, capsys, cmd, bad):
    argv = ["plan", "--pack", str(pack)] if cmd == "plan" else ["prefill", str(pack)]
    try:
        rc = main([*argv, *RUN, "--kv-resident", bad])
    except SystemExit as e:      # argparse's own exit (strata.cli's one-line parser error)
        rc = e.code
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "--kv-resident" in err, err


def test_host_short_for_the_spilled_kv_is_refused_before_pinning(pack, monkeypatch):
    """auto spills; a host one byte short of the spilled KV refuses in one line, before the
    host blobs load."""
    cfg = EngineConfig(vram=int(VRAM), max_prompt=N, device="cpu", ffn="ref")
    W = resolve_kv(SHAPE, [pl.blob_size for pl in engine_prefill.open_pack(pack).layers], True,
                   cfg, "cpu").kv_resident
    host_kv = SHAPE.n_layer * SHAPE.kv_bytes(N - W, "fp32")
    monkeypatch.setattr(budget, "host_available", lambda: host_kv - 1)

    def no_pinning(*a, **k):
        raise AssertionError("host blobs loaded before the KV check")
    monkeypatch.setattr(engine_prefill, "HostExperts", no_pinning)
    with pytest.raises(StrataError) as e:
        PrefillEngine(pack, cfg)
    msg = str(e.value)
    assert "\n" not in msg and f"KV cache of {N} tokens" in msg and "in host memory" in msg


def test_the_issues_long_prompt_plans_without_flags(capsys):
    """qwen3-30b-a3b, 131072 tokens under --vram 12GiB: all resident its bf16 KV (12 GiB) leaves
    no cache, so auto keeps a window and the plan is the spilled one's: 32K chunks beside the
    full 105-slot ring. The window is the largest on the grid that keeps them."""
    argv = ["plan", "--preset", "qwen3-30b-a3b", "--vram", "12GiB", "--prompt-tokens", "131072"]
    d = run_json(capsys, *argv)
    kv, auto = d["kv"], d["kv"]["auto"]
    assert d["fits"] and auto["why"] == "spilled" and (auto["chunk"], auto["ring"]) == (32768, 105)
    assert d["chunk"] == 32768 and kv["resident_tokens"] % 256 == 0 and kv["host_bytes"] > 0
    shape = get_preset("qwen3-30b-a3b")
    blobs = [BlobLayout.for_shape(shape, "Q8_0").size] * shape.n_layer
    cfg = EngineConfig(vram=12 << 30, max_prompt=131072, kv="bf16",
                       ffn=ffn_named("auto").on("cuda"))        # strata plan's, for CUDA
    W = kv["resident_tokens"]
    at, above = (plan_at(shape, blobs, cfg, w)[0] for w in (W, W + 256))
    assert fits(at) and (at.chunk, at.ring) == (32768, 105)
    assert not (fits(above) and (above.chunk, above.ring) == (32768, 105))


def test_a_spilled_choice_says_why_in_one_clean_line(capsys):
    """`strata plan` of a 262K-token prompt through Qwen3.5 Q4_K_M on 12 GiB (issue 38 item 5's
    rig, and 9.3 GiB): it plans, the KV spilled, and the auto line says why not all resident,
    in words (not a dangling comma). On 9.3 GiB all resident fits only beside the fallback
    ring's smallest chunk (the fallback counts a slot's whole cost since 6fcd32b; before, it
    found nothing fit); on 12 GiB, with the dense matrices kept as their Q4_K / Q6_K / Q8_0
    blocks (1.96 GiB of dense against 4.56 as bf16), beside a 26,880-token chunk."""
    from strata.cli import main
    for vram, why in (("9.3GiB", "1024 chunks of 256 tokens, not 8"),
                      ("12GiB", "10 chunks of 26880 tokens, not 8")):
        assert main(["plan", "--preset", "qwen3.5-35b-a3b", "--quant", "Q4_K_M", "--vram", vram,
                     "--prompt-tokens", "262144"]) == 0
        out = capsys.readouterr().out
        line = next(x for x in out.splitlines() if x.strip().startswith("auto:"))
        assert f"in pinned host memory: all resident would read {why}" in line
        assert " ," not in line
