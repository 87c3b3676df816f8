"""`strata prefill PACK (--tokens 1,2,3 | --prompt-tokens N) [--vram SIZE ...] [...]`

Reads a prompt through a pack and reports tokens/s.

- Without --vram every expert is resident (one arena on the device, `ResidentProvider`).
- With --vram (one per GPU) the streaming engine reads it: expert cache filled to the budget,
  plan from the auto scan (or --chunk), loan + carve + ring, copies overlapped with compute
  (strata.engine). It prints the plan, `prefill_chunk` and `prefill_ring` (the resolved ring: a
  slot count or STAGE), bytes streamed, the achieved host->device rate, cache hits and the time
  compute waited on copies.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from strata.errors import StrataError
from strata.models.moe import FFN_CHOICES
from strata.units import fmt_bytes

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("prefill", help="read a prompt through a pack; print tokens/s",
                       description="Read a prompt (token ids) through a pack: with --vram/--cache "
                                   "the streaming engine (expert cache + loan + ring, copies "
                                   "overlapped with compute) prints the plan, prefill_chunk, "
                                   "prefill_ring, bytes streamed, H2D rate, cache hits and waits; "
                                   "without them every expert is resident. Optionally dumps the "
                                   "logits of every position.")
    p.add_argument("pack", help="a pack file (strata pack / strata synth)")
    src = p.add_argument_group("prompt")
    one = src.add_mutually_exclusive_group(required=True)
    one.add_argument("--tokens",
                     help="token ids, comma separated (e.g. 1,2,3); no tokenizer is involved")
    one.add_argument("--prompt-tokens", type=int, metavar="N",
                     help="a prompt of N random token ids (seeded by --seed)")
    src.add_argument("--seed", type=int, default=0, help="seed of --prompt-tokens (default 0)")
    eng = p.add_argument_group("streaming (any of these turns the streaming engine on)")
    eng.add_argument("--vram", action="append", metavar="SIZE",
                     help="VRAM budget of a GPU (e.g. 12GiB); repeat it for a layer split over "
                          "several GPUs")
    eng.add_argument("--cache", metavar="SIZE", help="expert cache bytes per GPU (default: "
                     "VRAM - dense weights - KV of --max-prompt - 1 GiB reserve)")
    eng.add_argument("--lend-cap", type=float, default=0.9,
                     help="most of the cache a prompt may borrow (default 0.9)")
    eng.add_argument("--prefill", default="auto", metavar="auto[:MAX]",
                     help="auto scan up to MAX tokens per chunk (default auto:32768)")
    eng.add_argument("--scan", choices=["auto", "legacy"], default="auto",
                     help="auto: largest chunk that leaves the ring full; legacy: fixed ring, "
                          "first fitting chunk of the old list (A/B)")
    eng.add_argument("--ring", type=int, metavar="N",
                     help="force the ring to N slots (as STRATA_PREFILL_RING=N)")
    eng.add_argument("--unpinned", action="store_true",
                     help="do not pin the host blobs (pageable copies, the unpinned ring budget)")
    eng.add_argument("--max-prompt", type=int, default=None, metavar="N",
                     help="KV reserved for prompts up to N tokens (default: this prompt)")
    eng.add_argument("--layer-split", default=None, metavar="auto|N,N,...",
                     help="layers per GPU (default auto: in proportion to --vram)")
    eng.add_argument("--devices", default=None, metavar="D,D,...",
                     help="devices of the participants (default cuda:0.. or cpu)")
    eng.add_argument("--batch", type=int, default=None,
                     help="experts per streamed batch (default ring/2)")
    p.add_argument("--chunk", type=int, default=None,
                   help="tokens per chunk (default: the whole prompt in one chunk)")
    p.add_argument("--device", default=None, help="cpu or cuda[:N] (default: cuda if available)")
    p.add_argument("--dtype", choices=["auto", *DTYPES], default="auto",
                   help="dense compute dtype (auto: bfloat16 on cuda, float32 on cpu)")
    p.add_argument("--experts", choices=list(FFN_CHOICES), default="auto",
                   help="expert FFN: kernel (fused Triton GEMM on the blocks), decoded (decode "
                        "a pass's experts once, then the BF16 GEMM), torch (plain-torch twin, "
                        "bf16), ref (fp32 reference); auto: on cuda decoded for long chunks and "
                        "kernel for short ones, on cpu the torch/ref twins (the Triton "
                        "interpreter is slow)")
    p.add_argument("--dump-logits", metavar="PATH", default=None,
                   help="write the logits of every position as float32 [T, vocab] .npy")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    return p


def parse_tokens(text: str) -> list[int]:
    parts = [t for t in text.replace(" ", "").split(",") if t != ""]
    if not parts:
        raise StrataError("--tokens is empty; give comma-separated token ids, e.g. --tokens 1,2,3")
    try:
        return [int(t, 10) for t in parts]
    except ValueError:
        bad = next(t for t in parts if not t.lstrip("-").isdigit())
        raise StrataError(f"--tokens: {bad!r} is not a token id; give comma-separated integers") from None


@dataclass
class PrefillResult:
    """What one prompt reports (the streaming engine adds its plan/ring/bytes fields here)."""
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
    logits_path: str | None = None
    stats: dict = field(default_factory=dict)   # the provider's stats()

    def summary(self) -> str:
        lines = [f"strata prefill: {self.n_tokens} tokens in {self.n_chunks} chunk(s) of "
                 f"{self.chunk} through {self.pack} ({self.arch})",
                 f"  device {self.device}, dtype {self.dtype}, experts via {self.experts}, "
                 f"provider {self.provider}",
                 f"  {self.seconds * 1e3:.1f} ms, {self.tokens_per_s:.1f} tokens/s, "
                 f"next token {self.next_token}"]
        lines += [f"  {k}: {fmt_bytes(v) if k.endswith('_bytes') else v}"
                  for k, v in self.stats.items()]
        if self.logits_path:
            lines.append(f"  logits float32 [{self.n_tokens}, vocab] -> {self.logits_path}")
        return "\n".join(lines)


def make_provider(args, pack, device):
    """The expert provider for this run. The streaming engine (--vram ...) will branch here."""
    from strata.models.load import resident_provider
    return "resident", resident_provider(pack, device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _streaming(args) -> bool:
    return bool(args.vram) or args.cache is not None


def prompt_tokens(args, vocab: int) -> list[int]:
    if args.tokens is not None:
        return parse_tokens(args.tokens)
    if args.prompt_tokens < 1:
        raise StrataError(f"--prompt-tokens must be at least 1, got {args.prompt_tokens}")
    g = torch.Generator().manual_seed(args.seed)
    return torch.randint(0, vocab, (args.prompt_tokens,), generator=g).tolist()


def run(args) -> int:
    from strata.models.load import load_model, open_pack, resolve_device
    from strata.models.moe import expert_ffn

    if _streaming(args):
        return run_streaming(args)
    if args.tokens is None:
        pack = open_pack(args.pack)
        args.tokens = ",".join(map(str, prompt_tokens(args, pack.shape.vocab)))
    tokens = parse_tokens(args.tokens)
    if args.chunk is not None and args.chunk < 1:
        raise StrataError(f"--chunk must be at least 1 token, got {args.chunk}")
    if args.dump_logits and not Path(args.dump_logits).parent.resolve().is_dir():
        raise StrataError(f"--dump-logits: directory {Path(args.dump_logits).parent} does not exist")
    pack = open_pack(args.pack)
    vocab = pack.shape.vocab
    bad = [(i, t) for i, t in enumerate(tokens) if not 0 <= t < vocab]
    if bad:
        i, t = bad[0]
        raise StrataError(f"--tokens: id {t} at position {i} is outside the vocabulary "
                          f"[0, {vocab}) of {args.pack}")
    device = resolve_device(args.device)
    dtype = (torch.bfloat16 if device.type == "cuda" else torch.float32) if args.dtype == "auto" \
        else DTYPES[args.dtype]
    ffn_name = args.experts if args.experts != "auto" else \
        ("auto" if device.type == "cuda" else "ref")
    ffn = expert_ffn(ffn_name)
    model = load_model(pack, device=device, dtype=dtype, ffn=ffn)
    provider_name, provider = make_provider(args, pack, device)

    T = len(tokens)
    chunk = min(args.chunk or T, T)
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
    _sync(device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        # [T, V] only when dumped: at V = 151936 a long prompt's logits would not fit in memory
        logits = model.prefill(tok, provider, chunk=chunk, progress=progress,
                               logits="all" if args.dump_logits else "last")
    _sync(device)
    seconds = time.perf_counter() - t0
    if bar is not None:
        bar.close()

    res = PrefillResult(pack=str(args.pack), arch=pack.shape.arch, device=str(device),
                        dtype=str(dtype).replace("torch.", ""),
                        experts=ffn_name, provider=provider_name,
                        n_tokens=T, chunk=chunk, n_chunks=n_chunks, seconds=seconds,
                        tokens_per_s=T / seconds if seconds > 0 else float("inf"),
                        stats=provider.stats(),
                        next_token=int(logits[-1].argmax()))
    if args.dump_logits:
        out = np.ascontiguousarray(logits.float().cpu().numpy())   # [T, V] float32
        path = str(args.dump_logits)
        path = path if path.endswith(".npy") else path + ".npy"   # what np.save writes
        np.save(path, out)
        res.logits_path = path
    print(json.dumps(asdict(res)) if args.json else res.summary())
    return 0


def parse_prefill(text: str) -> int:
    """`auto` or `auto:MAX` -> MAX (default 32768)."""
    text = text.strip()
    if text == "auto":
        return 32768
    if text.startswith("auto:"):
        try:
            n = int(text[5:])
        except ValueError:
            n = 0
        if n >= 256:
            return n
    raise StrataError(f"--prefill {text!r}: write auto or auto:MAX with MAX >= 256 "
                      f"(e.g. auto:32768)")


def engine_config(args, n_tokens: int):
    """The EngineConfig the flags describe."""
    from strata.engine.prefill import EngineConfig
    from strata.units import parse_size

    vram = [parse_size(v) for v in (args.vram or ["80GiB"])]
    split = None
    if args.layer_split not in (None, "auto"):
        try:
            split = [int(x) for x in args.layer_split.split(",")]
        except ValueError:
            raise StrataError(f"--layer-split {args.layer_split!r}: write auto or layer counts "
                              f"per GPU, e.g. 24,24") from None
    if args.chunk is not None and args.chunk < 1:
        raise StrataError(f"--chunk must be at least 1 token, got {args.chunk}")
    if args.ring is not None and args.ring < 1:
        raise StrataError(f"--ring must be at least 1 slot, got {args.ring}")
    dev = args.device
    devices = args.devices.split(",") if args.devices else None
    ffn = args.experts if args.experts != "auto" else \
        ("auto" if (dev or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
         else "torch")
    return EngineConfig(
        vram=vram, cache=parse_size(args.cache) if args.cache else None, lend_cap=args.lend_cap,
        scan=args.scan, scan_max=parse_prefill(args.prefill), chunk=args.chunk, ring=args.ring,
        pin=not args.unpinned, max_prompt=args.max_prompt or n_tokens, device=dev,
        devices=devices, layer_split=split,
        dtype=None if args.dtype == "auto" else DTYPES[args.dtype], ffn=ffn, batch=args.batch,
        progress=not args.json)


def run_streaming(args) -> int:
    """The streaming engine's read of one prompt, reported."""
    from strata.engine.prefill import PrefillEngine
    from strata.models.load import open_pack

    if args.dump_logits and not Path(args.dump_logits).parent.resolve().is_dir():
        raise StrataError(f"--dump-logits: directory {Path(args.dump_logits).parent} does not exist")
    pack = open_pack(args.pack)
    tokens = prompt_tokens(args, pack.shape.vocab)
    cfg = engine_config(args, len(tokens))
    engine = PrefillEngine(pack, cfg)
    with torch.inference_mode():
        res = engine.run(torch.tensor(tokens, dtype=torch.int64),
                         logits="all" if args.dump_logits else "last")
    report = streaming_report(engine, res, str(args.pack))
    if args.dump_logits:
        path = str(args.dump_logits)
        path = path if path.endswith(".npy") else path + ".npy"
        np.save(path, np.ascontiguousarray(res.logits.float().cpu().numpy()))
        report["logits_path"] = path
    print(json.dumps(report) if args.json else streaming_summary(report))
    return 0


def streaming_report(engine, res, pack_name: str) -> dict:
    """Everything one streamed prompt reports, as plain data (the --json output)."""
    st = res.stats
    fr = [f for c in st.chunks for f in c.hit_fraction]
    return {
        "pack": pack_name, "arch": engine.shape.arch, "devices": [str(p.device) for p in engine.parts],
        "experts": engine.cfg.ffn, "pinned": engine.host.pinned,
        "n_tokens": st.tokens, "seconds": st.seconds, "tokens_per_s": st.tokens_per_s,
        "prefill_chunk": res.chunk, "prefill_ring": res.ring,
        "plan": res.plan.to_dict(),
        "bytes_streamed": st.bytes_streamed, "h2d_gbps": st.h2d_gbps,
        "copy_s": st.copy_s, "wait_s": st.wait_s,
        "cache_hits": st.cache_hits, "routed": st.routed,
        "hit_fraction_min": min(fr) if fr else None,
        "hit_fraction_mean": sum(fr) / len(fr) if fr else None,
        "next_token": int(res.logits[-1].argmax()) if res.logits is not None else None,
        "chunks": st.to_dict()["chunks"],
    }


def streaming_summary(r: dict) -> str:
    p = r["plan"]
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
        f"  speed     {r['tokens_per_s']:,.1f} tokens/s ({r['seconds']:.3f} s)",
        f"  streamed  {fmt_bytes(r['bytes_streamed'])} host->device at {r['h2d_gbps']:.1f} GB/s "
        f"while copying " + (f"({'pinned' if r['pinned'] else 'pageable'}; ceiling 55.4 GB/s "
                             f"pinned PCIe 5 x16, 8.3 GB/s pageable)"
                             if any(d.startswith("cuda") for d in r["devices"])
                             else "(CPU: a memory copy standing in for PCIe)"),
        f"  waits     compute waited {r['wait_s'] * 1e3:.1f} ms on copies",
        f"  cache     {hits}",
    ]
    if r["hit_fraction_mean"] is not None:
        lines.append(f"  routing   a chunk hit {100 * r['hit_fraction_mean']:.1f}% of a layer's "
                     f"experts on average (min {100 * r['hit_fraction_min']:.1f}%)")
    if r["next_token"] is not None:
        lines.append(f"  next token {r['next_token']}")
    if r.get("logits_path"):
        lines.append(f"  logits float32 [{r['n_tokens']}, vocab] -> {r['logits_path']}")
    return "\n".join(lines)
