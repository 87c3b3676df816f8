"""`strata prefill PACK (--prompt TEXT | --prompt-file F | --tokens 1,2,3 | --prompt-tokens N) [...]`

Reads a prompt through a pack and reports tokens/s. Text (--prompt / --prompt-file) is tokenized
with the tokenizer the pack carries from its GGUF or Hugging Face source (strata.tokenize).

- Without --vram every expert is resident (one arena on the device, `ResidentProvider`).
- With --vram (one per GPU) the streaming engine reads it: expert cache filled to the budget,
  plan from the auto scan (or --chunk), loan + carve + ring, copies overlapped with compute
  (strata.engine). It prints the plan, `prefill_chunk` and `prefill_ring` (the resolved ring: a
  slot count or STAGE), bytes streamed, the achieved host->device rate, cache hits and the time
  compute waited on copies. Before the prompt is timed the engine warms up (PrefillEngine.warmup:
  one dry prompt through the prompt's plan compiles and loads every kernel variant it launches;
  `--no-warmup` skips it), and startup, warm-up and prompt time are reported apart.
- `--prompts-file F` reads many prompts in one session (one engine, loaded once); with
  `--resume STATE` (or `--reuse`) each is read after the saved prompt, restored for each: many
  questions on one saved document in one process; `--trace
  out.json` writes the copy and compute lanes of every pass as a Chrome/Perfetto trace, and
  out.png one chunk's lanes (strata.engine.trace).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from strata.atomic import check_output
from strata.bench.peaks import Peaks, past_budget
from strata.commands._args import (DTYPES, add_budget_flags, check_budget_flags, engine_config,
                                   refuse_unfit_plan, resolve_experts)
from strata.commands._prompt import (check_context, dump_path, open_checked, parse_tokens,
                                     prompt_ids, prompt_line, prompts_summary, read_prompts_file,
                                     save_logits)
from strata.commands._packing import batch_room, read_batches
from strata.errors import StrataError
from strata.kernels.attention.kv_int8 import resolve_kv
from strata.kernels.deltanet.launch import delta_spec
from strata.models.kv import kv_windows, layer_kv_tokens
from strata.units import fmt_bytes


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("prefill", help="read a prompt through a pack; print tokens/s",
                       description="Read a prompt (text through the pack's tokenizer, or token "
                                   "ids) through a pack: with --vram/--cache "
                                   "the streaming engine (expert cache + loan + ring, copies "
                                   "overlapped with compute) prints the plan, prefill_chunk, "
                                   "prefill_ring, bytes streamed, H2D rate, cache hits and waits; "
                                   "without them every expert is resident. Optionally dumps the "
                                   "logits of every position.")
    p.add_argument("pack", help="a pack file (strata pack / strata synth)")
    src = p.add_argument_group("prompt")
    one = src.add_mutually_exclusive_group(required=True)
    one.add_argument("--prompt", metavar="TEXT",
                     help="prompt text, tokenized with the tokenizer the pack carries")
    one.add_argument("--prompt-file", metavar="PATH",
                     help="a UTF-8 text file as the prompt (tokenized like --prompt)")
    one.add_argument("--tokens",
                     help="token ids, comma separated (e.g. 1,2,3); no tokenizer is involved")
    one.add_argument("--prompt-tokens", type=int, metavar="N",
                     help="a prompt of N random token ids (seeded by --seed)")
    one.add_argument("--prompts-file", metavar="F",
                     help="many prompts in one session (needs --vram/--cache): one per line, "
                          "either comma-separated token ids (`1,2,3`; one token: `5,`) or a "
                          "length `N` alone (N random ids, seeded by --seed + the line number) "
                          "or `text: ...` (text, by the pack's tokenizer); blank lines and # "
                          "lines are skipped; with --resume / --reuse each follows the saved one")
    src.add_argument("--pack-prompts", action="store_true",
                     help="--prompts-file: read consecutive prompts together as one batch of "
                          "packed sequences, up to the planned chunk (the experts stream once "
                          "a batch); a report a batch")
    src.add_argument("--seed", type=int, default=0, help="seed of --prompt-tokens (default 0)")
    add_budget_flags(p)    # --vram/--cache/... turn the streaming engine on; --chunk both paths
    eng = p.add_argument_group("streaming")
    eng.add_argument("--devices", default=None, metavar="D,D,...",
                     help="devices of the participants (default cuda:0.. or cpu)")
    p.add_argument("--dtype", choices=["auto", *DTYPES], default="auto",
                   help="dense compute dtype (auto: bfloat16 on cuda, float32 on cpu)")
    p.add_argument("--dump-logits", metavar="PATH", default=None,
                   help="write the logits of every position as float32 [T, vocab] .npy "
                        "(written whole or not at all; the path is checked before the prompt)")
    p.add_argument("--force", action="store_true",
                   help="let --dump-logits replace an existing file of another kind")
    p.add_argument("--verify", action="store_true",
                   help="check every tensor's checksum before reading (reads the whole pack)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    from strata.commands import _dist
    _dist.add_flags(p)     # --distributed (torchrun): strata.commands._dist
    add_run_flags(p)
    from strata.commands._kv import add_kv_flags
    add_kv_flags(p)        # --save-kv / --resume / --reuse: strata.commands._kv
    return p


def add_run_flags(p) -> None:
    """Flags `strata prefill` and `strata bench` share: the warm-up and the lanes' trace."""
    p.add_argument("--no-warmup", action="store_true",
                   help="time the first prompt cold: skip the warm-up that compiles and loads "
                        "every kernel variant the plan launches before the prompt is timed")
    p.add_argument("--trace", metavar="OUT.json", default=None,
                   help="write the copy and compute lanes of every pass (streaming engine) as a "
                        "Chrome/Perfetto trace, and OUT.png: one chunk's lanes")


def check_trace(args) -> Path | None:
    if not getattr(args, "trace", None):
        return None
    return check_output(args.trace, "--trace", inputs=[args.pack], force=True)


def write_trace(trace, path: Path | None) -> list[str]:
    """The trace's JSON and its PNG (beside it, .png): the paths written."""
    if trace is None or path is None:
        return []
    out = [str(trace.write(path))]
    png = trace.plot_chunk(path.with_suffix(".png"))
    if png is not None:
        out.append(str(png))
    return out


@dataclass
class ResidentReport:
    """What an all-resident read of one prompt reports (the streaming engine's is
    strata.engine.prefill.PrefillResult)."""
    pack: str
    arch: str
    device: str
    dtype: str
    experts: str                 # expert FFN implementation
    provider: str                # "resident" (streaming: the engine's name)
    n_tokens: int
    chunk: int
    n_chunks: int
    seconds: float
    tokens_per_s: float
    next_token: int              # argmax of the last position's logits
    kv: str = "fp32"             # the KV dtype every layer's cache keeps (--kv, resolved)
    kv_bytes: int = 0            # bytes the KV cache allocated
    kv_plan_bytes: int = 0       # bytes the shape counts for it (ModelShape.kv_bytes, per layer)
    logits_path: str | None = None
    stats: dict = field(default_factory=dict)   # the provider's stats()
    delta: str | None = None     # a hybrid's delta-rule launch (DeltaLaunch.spec), else None

    def summary(self) -> str:
        lines = [f"strata prefill: {self.n_tokens} tokens in {self.n_chunks} chunk(s) of "
                 f"{self.chunk} through {self.pack} ({self.arch})",
                 f"  device {self.device}, dtype {self.dtype}, KV {self.kv}, experts via "
                 f"{self.experts}, provider {self.provider}"
                 + (f", delta rule {self.delta}" if self.delta else ""),
                 f"  {self.seconds * 1e3:.1f} ms, {self.tokens_per_s:.1f} tokens/s, "
                 f"next token {self.next_token}"]
        lines += [f"  {k}: {fmt_bytes(v) if k.endswith('_bytes') else v}"
                  for k, v in self.stats.items()]
        if self.logits_path:
            lines.append(f"  logits float32 [{self.n_tokens}, vocab] -> {self.logits_path}")
        return "\n".join(lines)


def make_provider(args, pack, device):
    """The expert provider of an all-resident read (the streaming engine brings its own)."""
    from strata.engine.load import resident_provider
    return "resident", resident_provider(pack, device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _streaming(args) -> bool:
    """The streaming engine reads the prompt when a budget or a KV choice is given (the
    resident reader keeps the model's own KV cache)."""
    return (bool(args.vram) or args.cache is not None or args.kv == "int8"
            or args.kv_resident is not None)


# flags that shape only the streaming engine (its loan, ring, scan, pinned host memory, a layer
# split): given to an all-resident read they would change nothing, so they are refused
STREAMING_ONLY = (("--lend-cap", "lend_cap"), ("--prefill", "prefill"), ("--scan", "scan"),
                  ("--ring", "ring"), ("--unpinned", "unpinned"), ("--fused", "fused"),
                  ("--max-prompt", "max_prompt"), ("--layer-split", "layer_split"),
                  ("--batch", "batch"), ("--prefix-attention", "prefix_attention"))


def resident_device(args) -> str | None:
    """The device of an all-resident read, after refusing the flags it cannot honour (one line
    each): the streaming-only ones (set to anything but their default), and --devices naming
    more than one device or another than --device. One --devices entry is the read's device."""
    from strata.engine.load import resolve_device
    defaults = argparse.ArgumentParser()
    add_budget_flags(defaults)      # the defaults the flags were declared with, not a copy
    for flag, dest in STREAMING_ONLY:
        if getattr(args, dest) != defaults.get_default(dest):
            raise StrataError(f"{flag} shapes the streaming engine, but this read keeps every "
                              f"expert resident: give --vram SIZE (or --cache) to stream, or "
                              f"drop {flag}")
    if not args.devices:
        return args.device
    devs = [d.strip() for d in args.devices.split(",") if d.strip()]
    if len(devs) != 1:
        raise StrataError(f"--devices {args.devices}: an all-resident read runs on one device; "
                          f"a layer split over several needs the streaming engine (give --vram "
                          f"SIZE once per device)")
    if args.device is not None and resolve_device(args.device) != resolve_device(devs[0]):
        raise StrataError(f"--device {args.device} and --devices {args.devices} disagree; give "
                          f"one of them")
    return devs[0]


def run(args) -> int:
    from strata.engine.engine_config import layer_blocks
    from strata.engine.finite import FiniteGuard
    from strata.engine.load import load_model, resolve_device
    from strata.models.moe import ffn_named

    if args.pack_prompts and (not args.prompts_file or args.distributed):
        raise StrataError("--pack-prompts packs the prompts of --prompts-file in one engine; "
                          "give --prompts-file (and no --distributed)")
    if args.distributed:
        from strata.commands import _dist
        from strata.commands._kv import uses_kv_state
        if uses_kv_state(args):
            raise StrataError("--save-kv, --resume and --reuse are the single-process "
                              "engine's; drop --distributed")
        return _dist.run(args)
    if _streaming(args):
        return run_streaming(args)
    if args.prompts_file or args.trace:
        flag = "--prompts-file" if args.prompts_file else "--trace"
        raise StrataError(f"{flag} needs the streaming engine: give --vram SIZE (or --cache)")
    if ffn_named(args.experts).lands:   # the blobs are re-laid as they land in the engine's cache
        raise StrataError(f"--experts {args.experts} needs the streaming engine: give --vram "
                          f"SIZE (or --cache)")
    check_budget_flags(args)
    args.device = resident_device(args)
    resolve_device(args.device)     # a device this machine lacks: one line, before the pack
    dump = dump_path(args)
    pack = open_checked(args)
    text = None
    if args.tokens is None:
        ids, text = prompt_ids(args, pack)
        args.tokens = ",".join(map(str, ids))
    tokens = parse_tokens(args.tokens)
    check_context(len(tokens), pack.shape)
    vocab = pack.shape.vocab
    bad = [(i, t) for i, t in enumerate(tokens) if not 0 <= t < vocab]
    if bad:
        i, t = bad[0]
        raise StrataError(f"--tokens: id {t} at position {i} is outside the vocabulary "
                          f"[0, {vocab}) of {args.pack}")
    device = resolve_device(args.device)
    dtype = (torch.bfloat16 if device.type == "cuda" else torch.float32) if args.dtype == "auto" \
        else DTYPES[args.dtype]
    from strata.commands._kv import kv_io, kv_line
    io = kv_io(args, pack, tokens, from_text=text is not None)
    kv = resolve_kv(args.kv, dtype)      # the one KV dtype the streamed read would keep too
    io.check_kv(kv)
    tokens = io.new
    ffn = resolve_experts(args.experts, device.type)
    guard = FiniteGuard()
    model = load_model(pack, device=device, dtype=dtype, ffn=guard.wrap(ffn.forward()),
                       layer_blocks=layer_blocks(args))
    provider_name, provider = make_provider(args, pack, device)

    T = len(tokens)
    chunk = min(args.chunk or T, T) or 1
    n_chunks = -(-T // chunk)
    bar = None
    if n_chunks > 1 and not args.json:
        from tqdm import tqdm
        bar = tqdm(total=T, unit="tok", file=sys.stderr, desc="prefill", leave=False)
    done = [0]

    def progress(n):
        if bar is not None:
            bar.update(n - done[0])
        done[0] = n

    tok = torch.tensor(tokens, dtype=torch.int64)
    cache = model.new_cache(capacity=io.total, kv=kv)
    io.restore(cache)
    _sync(device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        # [T, V] only when dumped: at V = 151936 a long prompt's logits would not fit in memory
        logits = io.state.logits() if not T else model.prefill(
            tok, provider, chunk=chunk, progress=progress, cache=cache,
            logits="all" if dump else "last", observer=guard.begin(pack.shape.n_layer))
    _sync(device)
    seconds = time.perf_counter() - t0
    io.write(cache, logits)
    if bar is not None:
        bar.close()

    res = ResidentReport(pack=str(args.pack), arch=pack.shape.arch, device=str(device),
                         dtype=str(dtype).replace("torch.", ""), kv=kv, kv_bytes=cache.vram_bytes,
                         kv_plan_bytes=sum(pack.shape.kv_bytes(
                             layer_kv_tokens(T, w)[0], kv) for w in kv_windows(pack.shape)),
                         experts=ffn.name, provider=provider_name,
                         delta=delta_spec(pack.shape, dtype.itemsize),
                         n_tokens=T, chunk=chunk, n_chunks=n_chunks, seconds=seconds,
                         tokens_per_s=T / seconds if seconds > 0 else float("inf"),
                         stats=provider.stats(),
                         next_token=int(logits[-1].argmax()))
    if dump:
        res.logits_path = save_logits(dump, logits)
    out = asdict(res)
    if text:
        out["prompt"] = text
    out["kv_state"] = io.report()
    print(json.dumps(out) if args.json else
          (prompt_line(text) + "\n" if text else "") + res.summary()
          + ("\n" + kv_line(out["kv_state"]) if io.state or io.save else ""))
    return 0


def run_streaming(args) -> int:
    """The streaming engine's read of one prompt (or of every prompt of --prompts-file, one
    engine loaded once), reported: startup, warm-up and prompt time apart."""
    t_start = time.perf_counter()
    from strata.engine.prefill import PrefillEngine
    from strata.engine.trace import LaneTrace

    dump = dump_path(args)
    trace_path = check_trace(args)
    pack = open_checked(args)
    text = None
    from strata.commands._kv import KVIO, kv_io, kv_line, uses_kv_state
    io = KVIO(pack)
    if args.prompts_file:
        if dump:
            raise StrataError("--dump-logits writes one prompt's logits; drop it with "
                              "--prompts-file")
        if args.save_kv or (uses_kv_state(args) and args.pack_prompts):
            raise StrataError("--save-kv and --pack-prompts take one prompt's KV; with "
                              "--prompts-file give --resume or --reuse alone (each prompt is "
                              "read after the saved one)")
        prompts, texts = read_prompts_file(args.prompts_file, pack, args.seed)
        # many questions on one saved document: each prompt restores it and reads its own tokens
        ios = [io] * len(prompts)
        if uses_kv_state(args):
            ios = [kv_io(args, pack, t, from_text=x) for t, x in zip(prompts, texts)]
            prompts = [i.new for i in ios]
    else:
        tokens, text = prompt_ids(args, pack)
        io = kv_io(args, pack, tokens, from_text=text is not None)
        prompts, ios = [io.new], [io]
    total = max(i.total for i in ios)
    check_context(max(max(len(t) for t in prompts), total), pack.shape)
    room = max(batch_room(args, prompts), total)
    cfg = engine_config(args, room, progress=not args.json)
    check_context(cfg.max_prompt, pack.shape, "--max-prompt")
    for t in {len(t) for t in prompts if t} | {room}:   # before the engine pins or allocates
        refuse_unfit_plan(pack, cfg, t)
    t0 = time.perf_counter()
    engine = PrefillEngine(pack, cfg, early=getattr(args, "_early", None))  # pinned, cache filled
    startup = time.perf_counter() - t0
    trace = LaneTrace(str(args.pack)) if trace_path else None
    for i in ios:
        i.check_kv(engine.kv.dtype)
    reports = []
    batches = read_batches(engine, prompts, room if args.pack_prompts else 0)
    for k, (tokens, packed, plan) in enumerate(batches):
        io = ios[k] if packed is None else ios[0]   # packed: no saved state (refused above)
        start = io.n if packed is None else 0     # a resumed read: after the restored positions
        warm = (0.0 if args.no_warmup or not len(tokens) else
                engine.warmup(start + len(tokens), start=start, packed=packed))
        if trace is not None and trace not in engine.observers:
            engine.observers.append(trace)
        held = Peaks([p.device for p in engine.parts])   # its sync outside the question's time
        t_run = time.perf_counter()
        with torch.inference_mode():
            res = engine.run(torch.tensor(tokens, dtype=torch.int64),
                             logits="all" if dump else "last", packed=packed, plan=plan,
                             **io.engine_kw())
        run_s = time.perf_counter() - t_run
        report = streaming_report(engine, res, str(args.pack))
        # what each GPU held live at the read's peak (None off CUDA), beside its --vram
        report["peak_vram_bytes"] = held.read()
        for line in past_budget([p.name for p in engine.parts], report["peak_vram_bytes"],
                                cfg.vram, "this prompt's read"):
            print(f"strata prefill: {line}", file=sys.stderr)
        report["run_s"] = run_s     # set-up, restore, read, tear-down: a question's ttft
        report["kv_state"] = io.report(res)
        if packed is not None:
            report["sequences"] = len(packed.lengths)
            report["next_tokens"] = res.logits.argmax(-1).tolist()
        report["startup_s"] = startup if not reports else 0.0
        report["prepare_s"] = t0 - t_start if not reports else 0.0
        report["warmup_s"] = warm
        report["warmed"] = not args.no_warmup
        report["cache_bytes"] = sum(p.cache.buffer.numel() for p in engine.parts)
        reports.append(report)
    if dump:
        reports[0]["logits_path"] = save_logits(dump, res.logits)
    if text:
        reports[0]["prompt"] = text
    written = write_trace(trace, trace_path)
    for r in reports:
        r["trace"] = written
    if args.json:
        print(json.dumps(reports[0] if not args.prompts_file else reports))
    elif len(reports) == 1:
        print((prompt_line(text) + "\n" if text else "") + streaming_summary(reports[0])
              + ("\n" + kv_line(reports[0]["kv_state"]) if io.state or io.save else ""))
    else:
        print(prompts_summary(streaming_summary(reports[0]), reports))
    return 0


def streaming_report(engine, res, pack_name: str) -> dict:
    """Everything one streamed prompt reports, as plain data (the --json output)."""
    st = res.stats
    fr = [f for c in st.chunks for f in c.hit_fraction]
    return {
        "pack": pack_name, "arch": engine.shape.arch, "devices": [str(p.device) for p in engine.parts],
        "layers": [len(p.layers) for p in engine.parts],
        "dtype": str(engine.dtype).replace("torch.", ""),
        "experts": engine.cfg.ffn.name,
        "delta": delta_spec(engine.shape, engine.dtype.itemsize),
        "pinned": engine.host.pinned,
        "n_tokens": st.tokens, "seconds": st.seconds, "tokens_per_s": st.tokens_per_s,
        "setup_s": res.setup_s, "teardown_s": res.teardown_s,
        "prefill_chunk": res.chunk, "prefill_ring": res.ring,
        "plan": res.plan.to_dict(),
        "bytes_streamed": st.bytes_streamed, "h2d_gbps": st.h2d_gbps,
        "copy_s": st.copy_s, "wait_s": st.wait_s,
        "cache_hits": st.cache_hits, "routed": st.routed,
        "hit_fraction_min": min(fr) if fr else None,
        "hit_fraction_mean": sum(fr) / len(fr) if fr else None,
        "next_token": int(res.logits[-1].argmax()) if res.logits is not None else None,
        "kv": {"dtype": res.kv, "resident_tokens": engine.cfg.kv_resident,
               "vram_bytes": res.kv_bytes[0], "host_bytes": res.kv_bytes[1],
               "plan_vram_bytes": engine.sizes.kv_vram(st.tokens + res.restored),
               "plan_host_bytes": engine.sizes.kv_host_all(st.tokens + res.restored),
               "streamed_bytes": res.kv_streamed,
               "auto": (engine.cfg.kv_choice.to_dict() if engine.cfg.kv_choice is not None
                        else None),
               "auto_line": (engine.cfg.kv_choice.line() if engine.cfg.kv_choice is not None
                             else None)},
        "chunks": st.to_dict()["chunks"],
    }


def streaming_summary(r: dict) -> str:
    p, kv = r["plan"], r["kv"]
    ring = r["prefill_ring"]
    hits = (f"{r['cache_hits']:,} of {r['routed']:,} routed experts served from the cache "
            f"({100 * r['cache_hits'] / r['routed']:.1f}%)" if r["routed"] else "no experts routed")
    lines = [
        f"strata prefill: {r['n_tokens']:,} tokens through {r['pack']} ({r['arch']}) on "
        f"{', '.join(r['devices'])}, experts via {r['experts']}",
        f"  plan      rule {p['rule']}, chunk {p['chunk']}, ring {p['ring']} "
        f"({fmt_bytes(p['ring_bytes'])}), needs {fmt_bytes(p['bytes_needed'])} of room "
        f"{fmt_bytes(p['room'])}, {p['probes']} probes",
        f"  INFO      prefill_chunk={r['prefill_chunk']} prefill_ring={ring}",
        f"  speed     {r['tokens_per_s']:,.1f} tokens/s ({r['seconds']:.3f} s"
        + (", warm" if r.get("warmed") else ", cold: --no-warmup") + ")",
        f"  startup   {r.get('prepare_s', 0):.3f} s to open the pack and plan, "
        f"{r.get('startup_s', 0):.3f} s to load the host blobs and allocate and fill {fmt_bytes(r.get('cache_bytes', 0))} of expert "
        f"cache, {r.get('warmup_s', 0):.3f} s warm-up (one-time: kernel compile/load + a dry "
        f"read of the plan's chunk sizes)",
        f"  streamed  {fmt_bytes(r['bytes_streamed'])} host->device at {r['h2d_gbps']:.1f} GB/s "
        f"while copying " + (f"({'pinned' if r['pinned'] else 'pageable'}; ceiling 55.4 GB/s "
                             f"pinned PCIe 5 x16, 8.3 GB/s pageable)"
                             if any(d.startswith("cuda") for d in r["devices"])
                             else "(CPU: a memory copy standing in for PCIe)"),
        f"  waits     compute waited {r['wait_s'] * 1e3:.1f} ms on copies",
        f"  cache     {hits}",
        f"  kv        {kv['dtype']}, {fmt_bytes(kv['vram_bytes'])} on the device"
        + (f" + {fmt_bytes(kv['host_bytes'])} in host memory (the newest "
           f"{kv['resident_tokens']:,} tokens of a layer resident; "
           f"{fmt_bytes(kv['streamed_bytes'])} streamed back)" if kv["host_bytes"] else "")
        + (f"\n            {kv['auto_line']}" if kv.get("auto_line") else ""),
    ]
    if r["hit_fraction_mean"] is not None:
        lines.append(f"  routing   a chunk hit {100 * r['hit_fraction_mean']:.1f}% of a layer's "
                     f"experts on average (min {100 * r['hit_fraction_min']:.1f}%)")
    if r["next_token"] is not None:
        lines.append(f"  next token {r['next_token']}")
    if r.get("logits_path"):
        lines.append(f"  logits float32 [{r['n_tokens']}, vocab] -> {r['logits_path']}")
    if r.get("trace"):
        lines.append(f"  trace     {', '.join(r['trace'])}")
    return "\n".join(lines)
