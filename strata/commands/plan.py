"""`strata plan`: the chunk and ring a prompt would run with on a rig, as a table or JSON.

    strata plan --preset qwen3-30b-a3b --quant Q8_0 --vram 12GiB
    strata plan --preset seed-512e --quant Q2_0 --vram 8GiB --vram 8GiB --scan legacy --json
    strata plan --preset qwen3-30b-a3b --vram 6GiB --chunk 16384     # forced: does it fit?

    strata plan --preset qwen3-30b-a3b --vram 12GiB --prompt-tokens 15 --json   # one prompt
    strata plan --preset qwen3-30b-a3b --vram 12GiB --prompt-tokens 131072   # KV spilled (auto)

A plan that cannot fit prints one line naming the bytes needed and the room, and exits 2.

`--prompt-tokens N` plans one prompt of N tokens exactly as `strata prefill` runs it: a prompt
shorter than the chunk is one chunk of N (its ring re-resolved: STAGE under stream_all_min), the
KV of N tokens (or --max-prompt) leaves the cache, and the JSON's participants carry what the
engine borrows (`borrow`, `loan_slots`) and carves (`placements`, ending at `bytes_needed`).
`--experts` names the expert FFN (auto and decoded add the per-pass decode buffer, as the engine
does); with STRATA_MMQ_SLAB=1 and `--experts kernel` the slab's reserve is borrowed too.

`--pack PATH` plans a pack's own shape, per-layer blob sizes and nativeness (strata.packs.Pack).
The budget flags are strata prefill's own (strata.commands._args): the same flags give the same
plan. strata plan plans CUDA devices unless --device cpu (the CPU engine's capped cache).
"""
from __future__ import annotations

import argparse
import json
import sys

from strata.blob import BlobLayout
from strata.commands._args import (add_budget_flags, device_type, engine_config, positive,
                                   unfit_line)
from strata.errors import StrataError
from strata import config
from strata.planning import default_devices, scratch_reserve
from strata.shapes import PRESETS, get_preset
from strata.units import fmt_bytes

# why a plan's ring grew (strata.memory.scan.Plan.growth), as its line says it
GROWN = {"room": "into the chunk's leftover room",
         "ahead": "to run ahead of a layer's non-expert work (STRATA_RING_AHEAD)"}


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("plan", help="plan the chunk and ring for a model on a rig",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--preset", choices=sorted(PRESETS), help="a preset model shape")
    src.add_argument("--pack", metavar="PATH", help="a strata pack (its shape and blob sizes)")
    p.add_argument("--quant", default=None, metavar="TYPE",
                   help="with --preset: an expert block format, GATE,UP,DOWN, or a stock mix "
                        "(Q4_K_M, Q5_K_M, ...: each layer's expert formats as llama.cpp's "
                        "mix lays them, as strata synth --mix writes them) (default Q8_0)")
    p.add_argument("--layers", type=positive("--layers"), default=None,
                   help="with --preset: keep only the first N layers (a model whose dense "
                        "weights alone pass the VRAM, as DeepSeek-V3's under 24 GiB: as many "
                        "layers as fit)")
    p.add_argument("--prompt-tokens", type=positive("--prompt-tokens"), default=None,
                   metavar="N", help="the prompt's length: KV for N tokens (as strata prefill "
                                     "--prompt-tokens N reserves; default none)")
    add_budget_flags(p)
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    return p


def _source(args):
    """(name, shape, per-layer blob bytes, native, layouts, the pack or None) from
    --preset/--quant or --pack."""
    if args.pack:
        if args.quant is not None or getattr(args, "layers", None) is not None:
            raise StrataError("--quant and --layers apply to --preset; a pack keeps its own "
                              "formats and layers (drop them)")
        from strata.packs import Pack
        pack = Pack.open(args.pack)
        shape = pack.shape
        layer_blob = {i: pl.blob_size for i, pl in enumerate(pack.layers)}
        native = pack.native
        return (args.pack, shape, dict(layer_blob), bool(native),
                [pl.layout for pl in pack.layers], pack)
    shape = get_preset(args.preset or "qwen3-30b-a3b")
    if getattr(args, "layers", None) is not None:
        shape = shape.with_(n_layer=min(args.layers, shape.n_layer))
    quant = args.quant or "Q8_0"
    name = f"{args.preset or 'qwen3-30b-a3b'} {quant.upper()}" + (
        f" (first {shape.n_layer} layers)" if getattr(args, "layers", None) else "")
    from strata.packs.mixes import MIXES
    if quant.strip().upper() in MIXES:     # per-layer expert formats (a mix bumps some layers)
        from strata.packs.synth_draws import Mix
        lays = [e.layout(shape) for e in Mix.stock(quant, shape).experts]
        return name, shape, {l: lays[l].size if shape.is_moe_layer(l) else 0
                             for l in range(shape.n_layer)}, True, list(dict.fromkeys(lays)), None
    fmts = [q.strip() for q in quant.split(",")]
    if len(fmts) not in (1, 3):
        raise StrataError(f"--quant takes one TYPE or GATE,UP,DOWN, got {quant!r}")
    layout = BlobLayout.for_shape(shape, *fmts)
    # a leading dense layer (DeepSeek-V3's first 3, GLM-4.5's first 3) has no blobs
    return name, shape, {l: layout.size if shape.is_moe_layer(l) else 0
                         for l in range(shape.n_layer)}, True, [layout], None


def _kept(args, shape, pack, dev: str, cfg) -> dict[str, int]:
    """The bytes of the dense matrices the engine keeps as blocks on its GPU: the pack's
    (strata.engine.load.kept_bytes), or, for a preset in a stock mix, those synth lays out as
    blocks (the mix's types for them, strata.packs.mixes; kept as the reader keeps them,
    strata.packs.qdense.kept_rows)."""
    from strata.engine.engine_config import dense_dtype, layer_blocks
    from strata.engine.load import kept_as_blocks, kept_bytes
    dtype, blocks = dense_dtype(cfg, dev), layer_blocks(cfg)
    if pack is not None:
        return kept_bytes(pack, dev, dtype, layer_blocks=blocks)
    from strata.packs.mixes import MIXES
    quant = (args.quant or "").strip().upper()
    if dev != "cuda" or quant not in MIXES:
        return {}
    from strata.archs.names import dense_specs
    from strata.archs.registry import get_arch
    from strata.models.block_weight import block_matrix_bytes
    from strata.packs.mixes import dense_types
    from strata.packs.qdense import kept_rows
    arch, types, out = get_arch(shape.arch), dense_types(quant, shape), {}
    for n, shp in dense_specs(shape).items():
        if not kept_as_blocks(n, blocks) or n not in types or arch.gguf_split(n, shp, shape):
            continue       # not kept, or stored as parts the reader joins (decoded)
        kept = kept_rows(types[n], shp, lambda x, n=n: arch.gguf_dense(n, x, shape))
        if kept is not None:
            R, C = shp
            out[n] = block_matrix_bytes(n, kept[0].nbytes(R, C), R, C, dtype.itemsize)
    return out


def make_plan(args):
    """The plan `strata prefill` would make with the same flags: the same EngineConfig
    (strata.commands._args) through the engine's own plan inputs (plan_inputs), for the read's
    device whatever this host has (the delta rule's auto backend and the prefix blocks' kernel
    resolved for it: strata.kernels.pins.planning_for)."""
    from strata.kernels.pins import planning_for
    dev = device_type(args) if args.device else "cuda"   # strata plan plans GPUs by default
    with planning_for(dev):
        return _make_plan(args, dev)


def _make_plan(args, dev: str):
    from strata.engine.prompt_plan import (check_delta_pin, check_prefix_pin, plan_inputs,
                                           plan_prompt, resolve_kv)
    name, shape, layer_blob, native, layouts, pack = _source(args)
    check_delta_pin(shape)
    blobs = [layer_blob[l] for l in range(shape.n_layer)]
    cfg = engine_config(args, args.prompt_tokens, dev_type=dev)
    if args.prompt_tokens and args.prompt_tokens > shape.max_pos:
        raise StrataError(f"--prompt-tokens {args.prompt_tokens} is longer than the model's "
                          f"context of {shape.max_pos} tokens")
    policy = config.ring_policy()     # the STRATA_* ring and slab knobs, read once
    kept = _kept(args, shape, pack, dev, cfg)
    cfg = resolve_kv(shape, blobs, native, cfg, dev, policy, kept=kept)   # kv-resident auto
    check_prefix_pin(shape, cfg, dev)
    parts, bud, layout, fused = plan_inputs(shape, blobs, native, cfg, dev, policy, kept=kept)
    pinned = not args.unpinned or dev != "cuda"
    reserve = scratch_reserve(shape, default_devices([p.name for p in parts]), cfg.ffn,
                              policy.slab, layouts)
    plan = plan_prompt(layout, parts, cfg, pinned=pinned, fused=fused, native=native,
                       n_tokens=args.prompt_tokens, scratch_reserve=reserve, policy=policy)
    why = None if plan.fits else unfit_line(plan, layout, parts)
    # the delta rule's scratch as the carve places it at the plan's chunk (its dn_* buffers)
    dn = sum(p.nbytes for p in layout.placements(plan.chunk, 0) if p.name.startswith("dn_"))
    flags = dict(pinned=pinned, fused=fused, native=native,
                 kv=kv_summary(layout.sizes, cfg, bud, shape, delta_scratch=dn, dev=dev))
    if pack is not None and pinned and dev == "cuda":
        flags["host"] = host_summary(pack)
    if kept:     # bytes on the GPU of each matrix kept as blocks (its blocks + the head's slice)
        flags["blocks"] = kept    # and the most a layer's turn holds decoded at once
        flags["decode_scratch"] = max(layout.sizes.dense_scratch, default=0)
    return name, plan, bud, flags, shape, why


def host_summary(pack) -> dict:
    """How the engine would pin `pack`'s experts on this host, decided by the engines' own call
    (strata.engine.host.host_pinning at the host memory available now): the method, the bytes
    its pinned blobs take beyond the pack (0 locked in place), the memory available."""
    from strata.engine.host import expert_bytes, host_pinning
    from strata.hostmem import host_available
    host_blobs = expert_bytes(pack)
    method, extra = host_pinning(pack, host_blobs, True, True, say=False)
    return {"experts_bytes": host_blobs, "method": method.source, "extra_bytes": extra,
            "available_bytes": host_available()}


def kv_summary(sizes, cfg, bud, shape, *, delta_scratch: int = 0, dev: str = "cuda") -> dict:
    """The KV of the longest prompt as the budgets charge it: dtype, window, bytes (all layers)
    resident in VRAM and held in pinned host memory; with sliding layers (GPT-OSS), how many,
    the tokens each keeps (W - 1) and their share of the VRAM bytes; with linear-attention
    layers (Qwen3-Next, Qwen3.5-MoE), how many, the full layers beside them, the recurrent
    states' share (which the VRAM bytes include: a linear layer keeps no KV), and the delta
    rule's launch backend with `delta_scratch`, the bytes of the planned layout's dn_* buffers
    at the plan's chunk (what the carve places in the attention phase)."""
    from strata.models.kv import kv_windows
    out = {"dtype": cfg.kv, "resident_tokens": cfg.kv_resident, "tokens": cfg.max_prompt,
           "vram_bytes": sum(b.kv for b in bud),
           "host_bytes": sizes.kv_host_all(cfg.max_prompt),
           "auto": cfg.kv_choice.to_dict() if cfg.kv_choice is not None else None,
           "auto_line": cfg.kv_choice.line() if cfg.kv_choice is not None else None}
    linear = [l for l in range(shape.n_layer) if shape.layer_kind(l) == "linear"]
    if linear:
        from strata.engine.engine_config import dense_dtype
        from strata.kernels.deltanet.launch import delta_launch
        act = dense_dtype(cfg, dev).itemsize     # the layout's and model_sizes' act
        out.update(linear_layers=len(linear), full_layers=shape.n_layer - len(linear),
                   state_bytes=sum(sizes.kv_bytes(cfg.max_prompt, l) for l in linear),
                   delta_backend=delta_launch().resolved(act), delta_scratch_bytes=delta_scratch)
    sliding = [(l, w) for l, w in enumerate(kv_windows(shape)) if w > 0]
    if sliding:
        out.update(sliding_layers=len(sliding),
                   sliding_tokens=max(min(cfg.max_prompt, w - 1) for _, w in sliding),
                   sliding_vram_bytes=sum(sizes.kv_bytes(cfg.max_prompt, l)
                                          for l, _ in sliding))
    return out


def render(name, plan, bud, flags, n_expert: int) -> str:
    path = ("pinned" if flags["pinned"] else "unpinned") + (", fused" if flags["fused"] else "")
    ring = plan.ring if plan.ring == "STAGE" else f"{plan.ring} slots"
    lines = [
        f"strata plan: {name}, {len(bud)} GPU(s), {path}, native={flags['native']}",
        f"  rule      {plan.rule} ({plan.probes} bytes_needed probes)",
        f"  chunk     {plan.chunk} tokens" + ("" if plan.fits else "  (DOES NOT FIT)")
        + (f" (a prompt of {plan.n_tokens}; the rule's chunk is {plan.scan_chunk})"
           if plan.n_tokens is not None and plan.chunk != plan.scan_chunk else ""),
        f"  ring      {ring}, {fmt_bytes(plan.ring_bytes)} (full ring {plan.full_ring} slots of "
        f"max_blob {plan.max_blob:,} B; STAGE under {plan.stream_all_min} tokens)"
        + (f"; grown {GROWN[plan.growth]} ({plan.grow_probes} probes), passes of "
           f"{plan.participants[0].batch} experts" if plan.growth else ""),
        f"  needed    {plan.bytes_needed:,} B ({fmt_bytes(plan.bytes_needed)}) of room "
        f"{plan.room:,} B ({fmt_bytes(plan.room)})",
        kv_line(flags["kv"]),
        *([mla_line(plan.participants[0].grown["MB"])] if "MB" in plan.participants[0].grown
          else []),
        *([host_line(flags["host"])] if flags.get("host") else []),
        *([blocks_line(flags["blocks"], flags["decode_scratch"])] if flags.get("blocks")
          else []),
        "",
        f"  {'gpu':<6}{'vram':>11}{'layers':>9}{'dense':>11}{'cache':>11}{'slots':>7}"
        f"{'room':>11}{'ring':>6}{'needed':>11}{'loan':>11}{'lent':>6}{'tail':>11}",
    ]
    for b, p in zip(bud, plan.participants):
        lines.append(
            f"  {p.name:<6}{fmt_bytes(b.vram):>11}{f'{b.layers.start}-{b.layers.stop - 1}':>9}"
            f"{fmt_bytes(b.dense):>11}{fmt_bytes(p.cache):>11}{p.cache_slots:>7}"
            f"{fmt_bytes(p.room):>11}{str(p.ring):>6}{fmt_bytes(p.bytes_needed):>11}"
            f"{fmt_bytes(p.loan):>11}{p.loan_slots:>6}{fmt_bytes(p.tail):>11}")
    for b, p in zip(bud, plan.participants):
        if p.cache_slots == len(b.layers) * n_expert:
            lines.append(f"  note: {p.name}'s cache holds every expert of its layers: nothing "
                         f"streams there, the ring only matters on GPUs that stream")
    return "\n".join(lines)


def mla_line(block: int) -> str:
    from strata.models.mla_launch import mla_launch
    return (f"  mla       attention in blocks of {block:,} tokens (the launch's "
            f"{mla_launch().block:,}, grown where the carve holds the scratch at no cost: the "
            f"feed-forward phase is the longer)")


def blocks_line(kept: dict, scratch: int) -> str:
    glob = [{"token_embd.weight": "embeddings", "output.weight": "LM head"}[n]
            for n in ("token_embd.weight", "output.weight") if n in kept]
    n_layer = sum(n.startswith("blk.") for n in kept)
    names = ", ".join(glob + ([f"{n_layer} layer matrices"] if n_layer else []))
    turn = (f"; a layer's decoded for its turn, {fmt_bytes(scratch)} at most" if scratch
            else "")
    return (f"  blocks    {names} kept as the pack's GGUF blocks on the GPU, decoded where read: "
            f"{fmt_bytes(sum(kept.values()))} with the head's decode slice{turn}; all in the "
            f"dense column")


def host_line(h: dict) -> str:
    avail = "the OS does not say" if h["available_bytes"] is None else \
        f"{fmt_bytes(h['available_bytes'])} available"
    how = ("locked in place where the pack lies (a tmpfs file; a copy would not fit): no second "
           "copy, but slower to lock" if h["method"] == "register" else
           f"a pinned copy in huge pages, {fmt_bytes(h['extra_bytes'])} beside the pack")
    return f"  host      experts {fmt_bytes(h['experts_bytes'])}: {how} (this host: {avail})"


def kv_line(kv: dict) -> str:
    layer = "a full layer" if kv.get("sliding_layers") else "a layer"
    window = ("all resident" if kv["resident_tokens"] is None
              else f"newest {kv['resident_tokens']:,} tokens {layer} resident")
    if kv.get("sliding_layers"):   # they keep their window's last W - 1 tokens, in VRAM
        window += (f" ({kv['sliding_layers']} sliding layers keep their last "
                   f"{kv['sliding_tokens']:,}, {fmt_bytes(kv['sliding_vram_bytes'])})")
    if kv.get("linear_layers"):    # KV in the full layers only; a fixed state in the others
        window += (f" in the {kv['full_layers']} full-attention layers; the "
                   f"{kv['linear_layers']} linear-attention layers keep a recurrent state "
                   f"instead ({fmt_bytes(kv['state_bytes'])}, whatever the prompt's length; "
                   f"their delta rule: "
                   f"{ {'fla': 'fla-core'}.get(kv['delta_backend'], kv['delta_backend'])}'s "
                   f"kernels, "
                   f"{fmt_bytes(kv['delta_scratch_bytes'])} of scratch a chunk)")
    return (f"  kv        {kv['dtype']}, {kv['tokens']:,} tokens, {window}: "
            f"{fmt_bytes(kv['vram_bytes'])} in VRAM, {fmt_bytes(kv['host_bytes'])} in pinned "
            f"host memory") + (f"\n            {kv['auto_line']}" if kv.get("auto_line") else "")


def run(args) -> int:
    name, plan, bud, flags, shape, why = make_plan(args)
    if args.json:
        d = plan.to_dict()
        d.update(model=name, **flags)
        for b, p in zip(bud, d["participants"]):
            p.update(vram=b.vram, layers=[b.layers.start, b.layers.stop], dense=b.dense)
        print(json.dumps(d, indent=2))
    else:
        print(render(name, plan, bud, flags, shape.n_expert))
    if not plan.fits:
        print(f"strata plan: {why}", file=sys.stderr)
        return 2
    return 0
