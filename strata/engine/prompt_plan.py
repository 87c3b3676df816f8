"""A prompt's plan from the engine's config: the participants, budgets and prompt layout the
config gives (plan_inputs), and the plan of one prompt over them (plan_prompt). The engine,
a pipeline stage, `strata plan` and `strata prefill`'s early refusal all call these, so the same
config gives the same plan. `--kv-resident auto` becomes a window here (resolve_kv), from these
same two calls (strata.memory.kv_window has the rule).
"""
from __future__ import annotations

from strata.budget import check_room, cpu_cache_cap
from dataclasses import replace

from strata.engine.engine_config import (EngineConfig, dense_dtype, engine_policy, kv_policy,
                                         resolved)
from strata.engine.prompt_kv import uses_prompt_kv
from strata.errors import StrataError
from strata.kernels.attention.flash_prefix import pinned_prefix_route, prefix_route
from strata.memory import PromptLayout, RingPolicy, plan_prefill, use_fused
from strata.memory.kv_window import AUTO, choose
from strata.memory.rig import participants
from strata.models.kv import kv_windows
from strata.planning import layout_spec, model_sizes
from strata.units import fmt_bytes


def plan_inputs(shape, blob_sizes, native: bool, cfg: EngineConfig, device_type: str,
                policy: RingPolicy | None = None, *, kept: dict[str, int] | None = None):
    """(participants, budgets, prompt layout, fused) a plan is computed from: the engine and
    `strata plan` both call this, so the same config gives the same plan. On the CPU the cache
    is capped at what it can hold (strata.budget.cpu_cache_cap): --vram there is a budget, not
    an allocation. `policy`: the launch choices (None: the environment's, read now). `kept`:
    the bytes of the dense matrices the engine keeps as blocks (strata.engine.load.kept_bytes;
    None: every one as DENSE_BYTES a weight)."""
    policy = engine_policy(cfg) if policy is None else policy
    cfg = resolve_kv(shape, blob_sizes, native, cfg, device_type, policy, kept=kept)
    vram = cfg.vram
    for v in vram:
        if cfg.cache is not None and cfg.cache > v:
            raise StrataError(f"--cache {fmt_bytes(cfg.cache)} is more than --vram "
                              f"{fmt_bytes(v)}: the expert cache lives inside the GPU's "
                              f"memory; give a smaller --cache or more --vram")
    kv = kv_policy(cfg, device_type)
    shape.kv_bytes(1, kv.dtype)   # a KV dtype the architecture cannot hold: one line, now
    # the activations the engine computes in (its delta rule's buffers take their dtype)
    act = dense_dtype(cfg, device_type)
    sizes = model_sizes(shape, kv=kv, act=act, kept=kept)
    layout = PromptLayout(sizes, max(blob_sizes), layout_spec(cfg.ffn, kv, shape, act), cfg.batch)
    fused = use_fused(native, cfg.fused, policy)
    kw = dict(lend_cap=cfg.lend_cap, reserve=cfg.reserve, kv_tokens=cfg.max_prompt,
              split=cfg.layer_split)
    if cfg.cache is None and cfg.max_prompt:
        check_room(sizes, vram, reserve=cfg.reserve, kv_tokens=cfg.max_prompt,
                   split=cfg.layer_split)
    parts, budgets = participants(sizes, blob_sizes, vram, cache=cfg.cache, **kw)
    if device_type != "cuda":
        from strata.memory.scan import GRID, full_ring
        T = cfg.chunk or min(cfg.scan_max, -(-max(cfg.max_prompt, 1) // GRID) * GRID)
        # the full ring bounds any chunk's ring (STAGE carves no more), so the cap holds it
        ring = full_ring(layout, pinned=True, fused=fused, native=native, ring=cfg.ring,
                         policy=policy)
        cap = max(cpu_cache_cap(sizes, blob_sizes, b.layers, layout, chunk=T, ring_slots=ring,
                                lend_cap=cfg.lend_cap) for b in budgets)
        if cap < min(b.cache for b in budgets):
            parts, budgets = participants(sizes, blob_sizes, vram, cache=cap, **kw)
    return parts, budgets, layout, fused


def resolve_kv(shape, blob_sizes, native: bool, cfg: EngineConfig, device_type: str,
               policy: RingPolicy | None = None, *,
               kept: dict[str, int] | None = None) -> EngineConfig:
    """The config with `--kv-resident auto` resolved to a window (None: all resident) and
    `kv_choice` saying why (strata.memory.kv_window.choose, over the plans plan_inputs and
    plan_prompt make for a prompt of cfg.max_prompt tokens, the ring not grown); any other
    value is returned as it is. No KV reserve (max_prompt 0): all resident."""
    if cfg.kv_resident != AUTO:
        return cfg
    policy = engine_policy(cfg) if policy is None else policy
    plain = replace(policy, grow=False)
    pinned = cfg.pin or device_type != "cuda"

    def plan_at(window):
        c = replace(cfg, kv_resident=window)
        parts, _, layout, fused = plan_inputs(shape, blob_sizes, native, c, device_type, plain,
                                              kept=kept)
        return plan_prompt(layout, parts, c, pinned=pinned, fused=fused, native=native,
                           n_tokens=cfg.max_prompt, policy=plain)

    if not cfg.max_prompt:
        return replace(cfg, kv_resident=None)
    choice = choose(cfg.max_prompt, plan_at, spills=any(w == 0 for w in kv_windows(shape)))
    return replace(cfg, kv_resident=choice.window, kv_choice=choice)


def plan_prompt(layout, parts, cfg: EngineConfig, *, pinned: bool, fused: bool, native: bool,
                n_tokens: int | None = None, scratch_reserve=None,
                policy: RingPolicy | None = None):
    """The plan of one prompt from plan_inputs' participants and layout: the one call the
    engine, `strata plan` and `strata prefill`'s early refusal make. `policy`: the launch
    choices (None: the environment's, read now)."""
    if n_tokens is not None and cfg.max_prompt and n_tokens > cfg.max_prompt:
        raise StrataError(f"the prompt has {n_tokens} tokens but --max-prompt reserves KV for "
                          f"{cfg.max_prompt}; raise --max-prompt or shorten the prompt")
    return plan_prefill(layout, parts, scan=cfg.scan, scan_max=cfg.scan_max, chunk=cfg.chunk,
                        pinned=pinned, fused=fused, native=native, ring=cfg.ring,
                        n_tokens=n_tokens, scratch_reserve=scratch_reserve,
                        policy=engine_policy(cfg) if policy is None else policy)


def prefix_path(shape, cfg: EngineConfig, device_type: str) -> str | None:
    """How a later chunk of this engine read attends its prefix: the route of the engine's KV
    (PromptKV, strata.kernels.attention.flash_prefix.prefix_route) on CUDA; None where no route
    applies: the model's own KV cache (torch's flash op over all its keys), MLA's latent
    attention, the CPU (chunk_attention's torch twin). `cfg` resolved (resolve_kv)."""
    if shape.mla or device_type != "cuda" or not uses_prompt_kv(shape, cfg):
        return None
    return prefix_route(shape.head_dim, resolved(cfg, device_type).kv)


def check_delta_pin(shape) -> None:
    """--delta on a model without linear-attention layers: one line (it would change nothing),
    before any plan or load: `strata plan` and every command's pack opening (open_checked) ask
    it. The engines do not: an experiment's pin_delta_launch around a read of any model (a
    reference arm) is its own business."""
    from strata.kernels.deltanet.launch import pinned_delta_launch
    if pinned_delta_launch() is not None and getattr(shape, "linear", None) is None:
        raise StrataError(f"--delta does not apply to this read: {shape.arch} has no "
                          f"linear-attention (Gated DeltaNet) layers; drop the flag")


def check_prefix_pin(shape, cfg: EngineConfig, device_type: str) -> None:
    """--prefix-attention where it cannot take effect: one line, before any heavy work (the
    engines and `strata plan`, once the KV window is resolved)."""
    pin = pinned_prefix_route()
    if pin is None:
        return
    got = prefix_path(shape, cfg, device_type)
    if got == pin:
        return
    if got is None:
        why = ("MLA attends its latent, not bf16 segments" if shape.mla else
               "on the CPU the prefix goes through chunk_attention's torch twin"
               if device_type != "cuda" else
               "the read keeps the model's own KV cache (bf16, all resident), whose later "
               "chunks attend through torch's flash op; give --kv-resident N to read through "
               "the engine's KV")
    else:
        why = (f"the KV is {resolved(cfg, device_type).kv} at head width {shape.head_dim}, "
               f"which goes by {got}")
    raise StrataError(f"--prefix-attention {pin} does not apply to this read: {why}; or drop "
                      f"the flag")
