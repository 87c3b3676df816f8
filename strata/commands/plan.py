"""`strata plan`: the chunk and ring a prompt would run with on a rig, as a table or JSON.

    strata plan --preset qwen3-30b-a3b --quant Q8_0 --vram 12GiB
    strata plan --preset seed-512e --quant Q2_0 --vram 8GiB --vram 8GiB --scan legacy --json
    strata plan --preset qwen3-30b-a3b --vram 6GiB --chunk 16384     # forced: does it fit?

    strata plan --preset qwen3-30b-a3b --vram 12GiB --prompt-tokens 15 --json   # one prompt

A plan that cannot fit prints one line naming the bytes needed and the room, and exits 2.

`--prompt-tokens N` plans one prompt of N tokens exactly as `strata prefill` runs it: a prompt
shorter than the chunk is one chunk of N (its ring re-resolved: STAGE under stream_all_min), the
KV of N tokens (or --max-prompt) leaves the cache, and the JSON's participants carry what the
engine borrows (`borrow`, `loan_slots`) and carves (`placements`, ending at `bytes_needed`).
`--experts` names the expert FFN (auto and decoded add the per-pass decode buffer, as the engine
does); with STRATA_MMQ_SLAB=1 and `--experts kernel` the slab's reserve is borrowed too.

`--pack PATH` plans a pack's own shape, per-layer blob sizes and nativeness (strata.packs.Pack).
"""
from __future__ import annotations

import argparse
import json
import sys

from strata import config
from strata.blob import BlobLayout
from strata.errors import StrataError
from strata.memory.loan import LEND_CAP
from strata.memory.rig import RESERVE, participants
from strata.memory.ring import use_fused
from strata.memory.scan import SCAN_MAX, plan_prefill
from strata.planning import default_devices, layout_spec, model_sizes, prompt_layout, \
    scratch_reserve
from strata.shapes import PRESETS, get_preset
from strata.units import fmt_bytes, parse_size


def _size(text: str) -> int:
    try:
        n = parse_size(text)
    except StrataError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive, got {text!r}")
    return n


def _prefill(text: str) -> int:
    """'auto' or 'auto:MAX' -> MAX."""
    head, _, tail = text.partition(":")
    if head != "auto":
        raise argparse.ArgumentTypeError(f"--prefill takes auto or auto:MAX, got {text!r} "
                                         f"(use --chunk N to force a chunk)")
    if not tail:
        return SCAN_MAX
    try:
        return int(tail)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--prefill auto:MAX needs a whole number MAX, "
                                         f"got {tail!r}") from None


def _lend_cap(text: str) -> float:
    try:
        f = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--lend-cap takes a fraction like 0.9, got {text!r}") \
            from None
    if not 0.0 < f <= 1.0:
        raise argparse.ArgumentTypeError(f"--lend-cap must be in (0, 1], got {f}")
    return f


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("plan", help="plan the chunk and ring for a model on a rig",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--preset", choices=sorted(PRESETS), help="a preset model shape")
    src.add_argument("--pack", metavar="PATH", help="a strata pack (its shape and blob sizes)")
    p.add_argument("--quant", default="Q8_0", metavar="TYPE",
                   help="expert block format with --preset, or GATE,UP,DOWN (default Q8_0)")
    p.add_argument("--vram", type=_size, action="append", metavar="SIZE",
                   help="VRAM of one GPU (repeat for several GPUs); default 12GiB")
    p.add_argument("--cache", type=_size, metavar="SIZE",
                   help=f"expert cache per GPU (default: VRAM - dense weights - "
                        f"{fmt_bytes(RESERVE)} reserve)")
    p.add_argument("--lend-cap", type=_lend_cap, default=LEND_CAP, metavar="F",
                   help=f"most of the cache a prompt may borrow (default {LEND_CAP})")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--prefill", type=_prefill, default=None, metavar="auto[:MAX]",
                     help=f"scan chunks 256..MAX on the 256 grid (default auto:{SCAN_MAX})")
    how.add_argument("--chunk", type=int, metavar="N", help="force a chunk of N tokens")
    p.add_argument("--scan", choices=("auto", "legacy"), default="auto",
                   help="auto: largest chunk that leaves the ring full; legacy: the old list")
    p.add_argument("--unpinned", action="store_true", help="pageable host memory (smaller ring)")
    p.add_argument("--fused", action="store_true",
                   help="fused path (fused ring budget); default: STRATA_PF_FUSED, else "
                        "non-native packs")
    p.add_argument("--ring", type=_positive("--ring", "slot"), metavar="N",
                   help="an explicit ring of N slots (wins over STRATA_PREFILL_RING, as in "
                        "strata prefill)")
    p.add_argument("--prompt-tokens", type=_positive("--prompt-tokens"), metavar="N",
                   help="plan one prompt of N tokens as the engine runs it (default: a prompt "
                        "at least one chunk long)")
    p.add_argument("--max-prompt", type=_positive("--max-prompt"), metavar="N",
                   help="KV reserved for prompts up to N tokens, taken from the cache "
                        "(default: --prompt-tokens, else none)")
    p.add_argument("--experts", choices=EXPERT_FFNS, default="kernel",
                   help="expert FFN the prompt runs through (default kernel; auto and decoded "
                        "add the decode buffer to the layout)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    return p


EXPERT_FFNS = ("auto", "kernel", "decoded", "torch", "ref")   # strata.models.moe.FFN_CHOICES


def _positive(flag: str, unit: str = "token"):
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} takes a whole number of {unit}s, got "
                                             f"{text!r}") from None
        if n < 1:
            raise argparse.ArgumentTypeError(f"{flag} must be at least 1 {unit}, got {n}")
        return n
    return parse


def _source(args):
    """(name, shape, per-layer blob bytes, native) from --preset/--quant or --pack."""
    if args.pack:
        from strata.packs import Pack
        pack = Pack.open(args.pack)
        shape = pack.shape
        layer_blob = {i: pl.blob_size for i, pl in enumerate(pack.layers)}
        native = pack.native
        return args.pack, shape, dict(layer_blob), bool(native), [pl.layout for pl in pack.layers]
    shape = get_preset(args.preset or "qwen3-30b-a3b")
    fmts = [q.strip() for q in args.quant.split(",")]
    if len(fmts) not in (1, 3):
        raise StrataError(f"--quant takes one TYPE or GATE,UP,DOWN, got {args.quant!r}")
    layout = BlobLayout.make(shape.d_model, shape.d_expert, *fmts)
    name = f"{args.preset or 'qwen3-30b-a3b'} {args.quant.upper()}"
    return name, shape, {l: layout.size for l in range(shape.n_layer)}, True, [layout]


def make_plan(args):
    """The plan, built the way the prefill engine builds its own (strata.planning's sizes and
    layout, strata.memory's rig and scan), so what it reports is what the engine takes."""
    name, shape, layer_blob, native, layouts = _source(args)
    vram = args.vram or [12 << 30]
    sizes = model_sizes(shape)
    kv_tokens = args.max_prompt or args.prompt_tokens or 0
    parts, bud = participants(sizes, layer_blob, vram, cache=args.cache, lend_cap=args.lend_cap,
                              kv_tokens=kv_tokens)
    fused = use_fused(native, True if args.fused else None)
    layout = prompt_layout(shape, max(layer_blob.values()), spec=layout_spec(args.experts),
                           sizes=sizes)
    reserve = scratch_reserve(shape, default_devices([p.name for p in parts]), args.experts,
                              config.mmq_slab(), layouts)
    plan = plan_prefill(layout, parts, scan=args.scan,
                        scan_max=args.prefill or SCAN_MAX, chunk=args.chunk,
                        pinned=not args.unpinned, fused=fused, native=native, ring=args.ring,
                        n_tokens=args.prompt_tokens, scratch_reserve=reserve)
    return name, plan, bud, dict(pinned=not args.unpinned, fused=fused, native=native,
                                 experts=args.experts, kv_tokens=kv_tokens), shape


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
        f"max_blob {plan.max_blob:,} B; STAGE under {plan.stream_all_min} tokens)",
        f"  needed    {plan.bytes_needed:,} B ({fmt_bytes(plan.bytes_needed)}) of room "
        f"{plan.room:,} B ({fmt_bytes(plan.room)})",
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


def run(args) -> int:
    name, plan, bud, flags, shape = make_plan(args)
    if args.json:
        d = plan.to_dict()
        d.update(model=name, **flags)
        for b, p in zip(bud, d["participants"]):
            p.update(vram=b.vram, layers=[b.layers.start, b.layers.stop], dense=b.dense)
        print(json.dumps(d, indent=2))
    else:
        print(render(name, plan, bud, flags, shape.n_expert))
    if not plan.fits:
        print(f"strata plan: does not fit: {plan.short_of()}", file=sys.stderr)
        return 2
    return 0
