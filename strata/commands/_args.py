"""The flags `strata plan` and `strata prefill` share: one parser, one set of defaults, one
EngineConfig built from them, so the same arguments give the same plan in both commands.

    add_budget_flags(p)            --vram --cache --lend-cap --prefill|--chunk --scan --ring
                                   --unpinned --fused --max-prompt --kv --kv-resident
                                   --layer-split --batch
                                   --experts --device
    cfg = engine_config(args, n_tokens)     # -> strata.engine.engine_config.EngineConfig

Values are checked where argparse reads them (a size must be positive, --batch >= 1, ...), and
the cross-flag rules (--cache within --vram) in `check_budget_flags`.
"""
from __future__ import annotations

import argparse

import torch

from strata.errors import StrataError
from strata.memory.loan import LEND_CAP
from strata.memory.rig import RESERVE
from strata.memory.scan import SCAN_MAX
from strata.models.moe import FFN_CHOICES, ExpertFFNs, ffn_named
from strata.units import fmt_bytes, parse_size

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_VRAM = 12 << 30   # one GPU of 12 GiB when no --vram is given (plan and prefill alike)


def size(text: str) -> int:
    try:
        n = parse_size(text)
    except StrataError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive, got {text!r}")
    return n


def positive(flag: str):
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} takes a whole number, got {text!r}") \
                from None
        if n < 1:
            raise argparse.ArgumentTypeError(f"{flag} must be at least 1, got {n}")
        return n
    return parse


def prefill_max(text: str) -> int:
    """'auto' or 'auto:MAX' -> MAX (the scan checks MAX against its 256 grid)."""
    head, _, tail = text.partition(":")
    if head != "auto":
        raise argparse.ArgumentTypeError(f"--prefill takes auto or auto:MAX, got {text!r} "
                                         f"(use --chunk N to force a chunk)")
    if not tail:
        return SCAN_MAX
    try:
        n = int(tail)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--prefill auto:MAX needs a whole number MAX, "
                                         f"got {tail!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"--prefill auto:MAX needs MAX >= 256, got {n}")
    return n


def lend_cap(text: str) -> float:
    try:
        f = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--lend-cap takes a fraction like 0.9, got {text!r}") \
            from None
    if not 0.0 < f <= 1.0:
        raise argparse.ArgumentTypeError(f"--lend-cap must be in (0, 1], got {f}")
    return f


def add_budget_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("budget and plan (shared by strata plan and strata prefill)")
    g.add_argument("--vram", type=size, action="append", metavar="SIZE",
                   help=f"VRAM of one GPU (repeat for a layer split over several GPUs); default "
                        f"{fmt_bytes(DEFAULT_VRAM)}. On the CPU a budget, not an allocation: the "
                        f"cache is capped at every expert plus the prompt's working set")
    g.add_argument("--cache", type=size, metavar="SIZE",
                   help=f"expert cache per GPU (default: VRAM - dense weights - KV of "
                        f"--max-prompt - {fmt_bytes(RESERVE)} reserve)")
    g.add_argument("--lend-cap", type=lend_cap, default=LEND_CAP, metavar="F",
                   help=f"most of the cache a prompt may borrow (default {LEND_CAP})")
    how = g.add_mutually_exclusive_group()
    how.add_argument("--prefill", type=prefill_max, default=None, metavar="auto[:MAX]",
                     help=f"scan chunks 256..MAX on the 256 grid (default auto:{SCAN_MAX})")
    how.add_argument("--chunk", type=int, metavar="N",
                     help="force a chunk of N tokens (resident reads: tokens per chunk, default "
                          "the whole prompt)")
    g.add_argument("--scan", choices=("auto", "legacy"), default="auto",
                   help="auto: largest chunk that leaves the ring full; legacy: the old list (A/B)")
    g.add_argument("--ring", type=positive("--ring"), metavar="N",
                   help="force the ring to N slots (as STRATA_PREFILL_RING=N)")
    g.add_argument("--unpinned", action="store_true",
                   help="pageable host memory (the unpinned ring budget)")
    g.add_argument("--fused", action="store_true", default=None,
                   help="fused path (fused ring budget); default: STRATA_PF_FUSED, else "
                        "non-native packs")
    g.add_argument("--max-prompt", type=positive("--max-prompt"), default=None, metavar="N",
                   help="KV reserved for prompts up to N tokens (default: the prompt's length; "
                        "strata plan: --prompt-tokens, else none)")
    g.add_argument("--kv", choices=("auto", "bf16", "fp32", "int8"), default="auto",
                   help="KV cache dtype, kept alike on every path (resident, streamed, host-held "
                        "window): bf16, fp32, or int8 with one fp32 scale per token per kv head "
                        "(2·Hkv·(hd+4) bytes a token per layer); default auto: the dense dtype's "
                        "(bf16 on CUDA, fp32 with the CPU's fp32 math)")
    g.add_argument("--kv-resident", type=kv_resident, default=None, metavar="auto|all|N",
                   help="at most N tokens of KV per layer in VRAM (the newest); the older KV "
                        "lives in pinned host memory and streams back on the copy lane for "
                        "each later chunk's attention. all: every token resident. Default "
                        "auto: all resident when that plan fits, else the largest window that "
                        "keeps the chunk and ring of the plan with the KV spilled (the plan "
                        "says which and why)")
    g.add_argument("--layer-split", default=None, metavar="auto|N,N,...",
                   help="layers per GPU (default auto: in proportion to --vram)")
    g.add_argument("--batch", type=positive("--batch"), default=None,
                   help="experts per streamed batch (default ring/2)")
    g.add_argument("--experts", choices=list(FFN_CHOICES), default="auto",
                   help="expert FFN: kernel (fused Triton GEMM on the blocks), decoded (decode a "
                        "pass's experts once, then the BF16 GEMM), int8 (activations "
                        "quantized to q8_1, int8 tensor cores, as llama.cpp's MMQ; opt-in), "
                        "plane (Q8_0/Q4_0/Q4_K re-laid as code and scale planes as they land), "
                        "plane-int8 (int8's numbers on Q8_0/Q4_0/Q4_K planes, a Q6_K down as it is), "
                        "torch (plain-torch twin, "
                        "bf16), ref (fp32 reference); auto: on cuda decoded for long chunks and "
                        "kernel for short ones, on the CPU ref (resident and streamed alike)")
    g.add_argument("--device", default=None, help="cpu or cuda[:N] (default: cuda if available)")
    g.add_argument("--dense-layers", choices=("blocks", "decoded"), default="blocks",
                   help="a layer's dense matrices the pack holds as GGUF blocks (attention, "
                        "MLA, shared experts, a leading dense FFN), on CUDA: blocks (kept so, "
                        "each layer's decoded for its turn, a phase at a time; the plan counts the "
                        "blocks and the largest phase decoded) or decoded (decoded once at load, "
                        "bf16). "
                        "Default blocks")
    g.add_argument("--delta", default=None, metavar="SPEC",
                   help="the linear-attention layers' delta-rule launch, as DeltaLaunch fields "
                        "(strata.kernels.deltanet.launch): backend=fla runs fla-core's kernels "
                        "(pip install 'strata[fla]'; bf16 intermediates, 8x faster at 32K on "
                        "the H100), backend=strata strata's own (fp32 state), e.g. "
                        "split,prec=tf32 its launch; the plan counts its buffers. Default: "
                        "backend=auto, fla-core's for a bf16 read on CUDA where it is installed, "
                        "else strata's")
    g.add_argument("--prefix-attention", default=None, choices=["triton", "flash", "cudnn"],
                   help="how a later chunk attends its bf16 prefix: triton (strata's "
                        "chunk_attention) or flash (FlashAttention-2 blocks merged by their "
                        "log-sum-exp, strata.kernels.attention.flash_prefix); the plan carves "
                        "the state flash needs; cudnn the same blocks through cuDNN's "
                        "attention. Default: cudnn from head width 128 on Hopper with cuDNN "
                        "9+, else flash from 129 (Qwen3.5, Qwen3-Next); triton below")


def kv_resident(text: str) -> int | str | None:
    """--kv-resident: auto, all or N >= 1 (strata.memory.kv_window.parse); "all" stays a word
    here, as None is the flag not given (auto)."""
    from strata.memory.kv_window import parse
    try:
        n = parse(text)
    except StrataError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return "all" if n is None else n


def device_type(args) -> str:
    dev = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    return "cuda" if str(dev).startswith("cuda") else "cpu"


def resolve_experts(name: str, dev_type: str) -> ExpertFFNs:
    """The expert FFN `--experts` names on this device, as its object (read once, here): auto is
    "auto" on cuda and "ref" on the CPU, one path for resident and streamed reads (the Triton
    interpreter would take minutes)."""
    return ffn_named(name).on(dev_type)


def layer_split(args) -> list[int] | None:
    if args.layer_split in (None, "auto"):
        return None
    try:
        return [int(x) for x in args.layer_split.split(",")]
    except ValueError:
        raise StrataError(f"--layer-split {args.layer_split!r}: write auto or layer counts "
                          f"per GPU, e.g. 24,24") from None


def check_budget_flags(args) -> None:
    """Rules argparse does not check, one line each."""
    if args.chunk is not None and args.chunk < 1:
        raise StrataError(f"--chunk must be at least 1 token, got {args.chunk}")


def engine_config(args, n_tokens: int | None, *, progress: bool = False,
                  dev_type: str | None = None):
    """The EngineConfig the flags describe (n_tokens: the prompt's length, the KV default;
    dev_type: the device `--experts auto` resolves for, default the one the run uses)."""
    from strata.engine.engine_config import EngineConfig, resolved

    check_budget_flags(args)
    max_prompt = args.max_prompt or n_tokens or 0
    if n_tokens is not None and max_prompt < n_tokens:
        raise StrataError(f"the prompt has {n_tokens} tokens but --max-prompt reserves KV for "
                          f"{max_prompt}; raise --max-prompt or shorten the prompt")
    devices = args.devices.split(",") if getattr(args, "devices", None) else None
    dtypes = getattr(args, "dtype", "auto")
    cfg = EngineConfig(
        vram=list(args.vram or [DEFAULT_VRAM]), cache=args.cache, lend_cap=args.lend_cap,
        scan=args.scan, scan_max=args.prefill or SCAN_MAX, chunk=args.chunk, ring=args.ring,
        pin=not args.unpinned, fused=args.fused, max_prompt=max_prompt, kv=args.kv,
        kv_resident="auto" if args.kv_resident is None else args.kv_resident,
        device=args.device,
        devices=devices, layer_split=layer_split(args),
        dtype=None if dtypes in (None, "auto") else DTYPES[dtypes],
        ffn=resolve_experts(args.experts, dev_type or device_type(args)), batch=args.batch,
        dense_layers=getattr(args, "dense_layers", "blocks"), progress=progress)
    return resolved(cfg, dev_type or device_type(args))   # --kv auto: the dense dtype's


def ring_that_fits(plan, layout, parts) -> int | None:
    """The most ring slots (<= the full ring) beside the plan's chunk that fit on every
    participant (bytes_needed is monotone in the ring); None when not even one slot does."""
    def fits(slots: int) -> bool:
        need = layout.bytes_needed(plan.chunk, slots)
        return all(need <= p.room for p in parts)
    lo, hi = 0, int(plan.full_ring)
    while lo < hi:   # largest fitting slot count in [0, full]
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo or None


def unfit_line(plan, layout, parts) -> str:
    """Why a plan does not fit, in one line; a forced chunk also names a ring that would fit."""
    line = f"does not fit: {plan.short_of()}"
    if plan.rule == "forced" and plan.ring != "STAGE":
        r = ring_that_fits(plan, layout, parts)
        if r:
            line += (f"; --chunk {plan.chunk} fits with --ring {r} (the full ring is "
                     f"{plan.full_ring} slots), or give a smaller --chunk or more --vram")
        else:
            line += f"; --chunk {plan.chunk} does not fit even with a 1-slot ring: give a " \
                    f"smaller --chunk or more --vram"
    return line


def refuse_unfit_plan(pack, cfg, n_tokens: int) -> None:
    """The engine's plan (its plan_inputs) before any allocation: refused in one line if unfit."""
    from strata.engine.engine_config import default_devices, dense_dtype, layer_blocks
    from strata.engine.prompt_plan import plan_inputs, plan_prompt
    from strata.engine.load import kept_bytes, resolve_device
    dev = resolve_device((cfg.devices or default_devices(cfg.device, len(cfg.vram)))[0])
    blobs = [pl.blob_size for pl in pack.layers]
    kept = kept_bytes(pack, dev.type, dense_dtype(cfg, dev.type), layer_blocks=layer_blocks(cfg))
    parts, _, layout, fused = plan_inputs(pack.shape, blobs, pack.native, cfg, dev.type, kept=kept)
    pinned = cfg.pin or dev.type != "cuda"
    plan = plan_prompt(layout, parts, cfg, pinned=pinned, fused=fused, native=pack.native,
                       n_tokens=n_tokens)
    if not plan.fits:
        raise StrataError(unfit_line(plan, layout, parts))
