"""`strata generate PACK (--prompt TEXT | --prompt-file F | --tokens 1,2,3 | --resume STATE) -n N`

Reads the prompt (all-resident, or streamed with --vram/--cache, as `strata prefill` does; a
saved prompt restored with --resume / --reuse), then decodes N tokens one at a time through the
model's chunk forward at T = 1 (strata.engine.generate): greedy, or sampled with --temperature
/ --top-k / --seed. The decode reads its experts as the prompt did: all resident, or through the
streaming engine's expert cache with a miss streamed through the ring. It prints the text
through the pack's tokenizer (when it has one), the token ids, and decode tokens/s beside its
bound. A checking and research loop, not a server.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from strata.commands._args import DTYPES, add_budget_flags, engine_config, resolve_experts
from strata.commands._kv import add_kv_flags, kv_io, kv_line
from strata.commands._prompt import check_context, open_checked, prompt_ids, prompt_line
from strata.errors import StrataError


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("generate", help="read a prompt, then decode N tokens (a checking loop)",
                       description="Read a prompt through a pack (resident, or streamed with "
                                   "--vram/--cache), then decode N tokens one at a time: greedy, "
                                   "or sampled with --temperature/--top-k/--seed. A checking and "
                                   "research loop, not a server.")
    p.add_argument("pack", help="a pack file (strata pack / strata synth)")
    src = p.add_argument_group("prompt")
    one = src.add_mutually_exclusive_group()
    one.add_argument("--prompt", metavar="TEXT", help="prompt text (the pack's tokenizer)")
    one.add_argument("--prompt-file", metavar="PATH", help="a UTF-8 text file as the prompt")
    one.add_argument("--tokens", help="token ids, comma separated")
    one.add_argument("--prompt-tokens", type=int, metavar="N",
                     help="a prompt of N random token ids (seeded by --seed)")
    g = p.add_argument_group("decode")
    g.add_argument("-n", "--max-new-tokens", dest="n", type=int, default=64, metavar="N",
                   help="tokens to generate (default 64)")
    g.add_argument("--temperature", type=float, default=0.0,
                   help="0 (the default): greedy; above 0: sample softmax(logits / T)")
    g.add_argument("--top-k", type=int, default=0, help="sample among the K likeliest (0: all)")
    g.add_argument("--seed", type=int, default=0,
                   help="seed of the sampling and of --prompt-tokens (default 0)")
    add_budget_flags(p)
    p.add_argument("--devices", default=None, metavar="D,D,...",
                   help="devices of the participants (streamed; default cuda:0.. or cpu)")
    p.add_argument("--dtype", choices=["auto", *DTYPES], default="auto",
                   help="dense compute dtype (auto: bfloat16 on cuda, float32 on cpu)")
    p.add_argument("--no-warmup", action="store_true", help="skip the streaming engine's warm-up")
    p.add_argument("--verify", action="store_true", help="check every tensor's checksum first")
    p.add_argument("--force", action="store_true", help="let --save-kv replace another file kind")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    add_kv_flags(p)
    return p


def _prompt(args, pack):
    """(ids, text info) of the prompt flags; ([], None) when none is given (--resume alone)."""
    if args.prompt is None and args.prompt_file is None and args.tokens is None \
            and args.prompt_tokens is None:
        return [], None
    if args.tokens is not None:
        from strata.commands._prompt import parse_tokens
        ids = parse_tokens(args.tokens)
        bad = [t for t in ids if not 0 <= t < pack.shape.vocab]
        if bad:
            raise StrataError(f"--tokens: id {bad[0]} is outside the vocabulary "
                              f"[0, {pack.shape.vocab}) of {args.pack}")
        return ids, None
    return prompt_ids(args, pack)


def run(args) -> int:
    from strata.commands.prefill import _streaming, resident_device
    from strata.engine.generate import Sampler
    if args.n < 1:
        raise StrataError(f"-n must be at least 1, got {args.n}")
    pick = Sampler(args.temperature, args.top_k, args.seed)
    pack = open_checked(args)
    ids, text = _prompt(args, pack)
    io = kv_io(args, pack, ids, from_text=text is not None, extra=args.n - 1)
    check_context(io.total, pack.shape, "the prompt and the generated tokens")
    if _streaming(args):
        r = _run_streamed(args, pack, io, pick)
    else:
        args.device = resident_device(args)
        r = _run_resident(args, pack, io, pick)
    r["kv_state"] = io.report()
    r["generated"] = r["decode"].pop("tokens")
    r["text"] = _detok(pack, r["generated"])
    if text:
        r["prompt"] = text
    print(json.dumps(r) if args.json else summary(r, text, io))
    return 0


def _detok(pack, ids: list[int]) -> str | None:
    if pack.tokenizer is None:
        return None
    from strata.tokenize import pack_tokenizer
    return pack_tokenizer(pack)._tok.decode(ids, skip_special_tokens=False)


def _run_resident(args, pack, io, pick) -> dict:
    from strata.engine.generate import decode, decode_bound
    from strata.kernels.attention.kv_int8 import resolve_kv
    from strata.engine.engine_config import layer_blocks
    from strata.engine.load import load_model, resident_provider, resolve_device
    device = resolve_device(args.device)
    dtype = ((torch.bfloat16 if device.type == "cuda" else torch.float32)
             if args.dtype == "auto" else DTYPES[args.dtype])
    kv = resolve_kv(args.kv, dtype)
    io.check_kv(kv)
    ffn = resolve_experts(args.experts, device.type)
    model = load_model(pack, device=device, dtype=dtype, ffn=ffn.forward(),
                       layer_blocks=layer_blocks(args))
    provider = resident_provider(pack, device)
    cache = model.new_cache(capacity=io.total, kv=kv)
    io.restore(cache)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else None
    with torch.inference_mode():
        t0 = time.perf_counter()
        logits = (model.prefill(torch.tensor(io.new), provider, chunk=args.chunk, cache=cache,
                                logits="last") if io.new else io.state.logits())
        if sync:
            sync()
        prompt_s = time.perf_counter() - t0
        io.write(cache, logits)
        out = decode(model, provider, cache, logits, args.n, pick, sync=sync)
    blobs = [pl.blob_size for pl in pack.layers]
    return {"pack": str(args.pack), "arch": pack.shape.arch, "device": str(device),
            "experts": ffn.name, "kv": kv, "prompt_tokens_read": len(io.new), "prompt_s": prompt_s,
            "decode": {"tokens": out.tokens, **decode_bound(out, pack.shape, blobs, None, True)}}


def _run_streamed(args, pack, io, pick) -> dict:
    from strata.engine.generate import decode, decode_bound
    from strata.engine.prefill import PrefillEngine
    cfg = engine_config(args, io.total, progress=False)
    engine = PrefillEngine(pack, cfg)
    io.check_kv(engine.kv.dtype)
    if not args.no_warmup and io.new:    # the read's own plan: the new tokens after the restored
        engine.warmup(io.n + len(io.new), start=io.n)

    def then(session, logits):
        provs = session.providers
        return decode(engine.model, session.provider, session.kv, logits, args.n, pick,
                      providers=provs, sync=engine._sync)

    with torch.inference_mode():
        res = engine.run(torch.tensor(io.new, dtype=torch.int64), logits="last",
                         **io.engine_kw(then))
    out = res.then
    io.restore_s = res.restore_s
    st = res.stats
    blobs = [pl.blob_size for pl in pack.layers]
    cuda = engine.device.type == "cuda"
    gbps = st.h2d_gbps if st.bytes_streamed and cuda else None
    return {"pack": str(args.pack), "arch": pack.shape.arch,
            "device": ", ".join(str(p.device) for p in engine.parts), "experts": engine.cfg.ffn.name,
            "kv": res.kv, "prompt_tokens_read": st.tokens, "prompt_s": st.seconds,
            "restore_s": res.restore_s, "prefill_chunk": res.chunk, "prefill_ring": res.ring,
            "decode": {"tokens": out.tokens, "bytes_streamed": out.bytes_streamed,
                       "kv_bytes_streamed": out.kv_bytes_streamed,
                       "routed": out.routed, "cache_hits": out.cache_hits,
                       **decode_bound(out, pack.shape, blobs, gbps, False)}}


def summary(r: dict, text, io) -> str:
    d = r["decode"]
    lines = [(prompt_line(text) if text else f"prompt: {io.n + len(io.new):,} tokens"),
             f"strata generate: {len(r['generated'])} tokens after {r['prompt_tokens_read']:,} "
             f"read ({r['prompt_s']:.3f} s) through {r['pack']} ({r['arch']}) on {r['device']}, "
             f"experts via {r['experts']}, KV {r['kv']}",
             f"  tokens    {','.join(map(str, r['generated']))}"]
    if r["text"] is not None:
        lines.append(f"  text      {r['text']!r}")
    rate = f"  decode    {d['tokens_per_s']:,.2f} tokens/s ({d['forwards']} forwards, " \
           f"{d['seconds']:.3f} s)"
    if d["bound"] == "resident":
        rate += "; experts resident: no PCIe traffic, bound by the device's compute/memory"
    elif not d["bytes_streamed_per_token"] and not d["kv_bytes_per_token"]:
        rate += (f"; every routed expert came from the cache: no PCIe traffic (empty cache: "
                 f"bound {d['empty_cache_bound_tokens_per_s']:,.1f} tokens/s at "
                 f"{d['pcie_gbps']:.1f} GB/s)")
    else:
        per, kv = d["bytes_streamed_per_token"], d["kv_bytes_per_token"]
        kv_text = f" and {kv / 1e6:,.2f} MB of host-held KV" if kv else ""
        bound = d["bound_tokens_per_s"] or float("inf")
        empty = d["empty_cache_bound_tokens_per_s"] or float("inf")
        rate += (f"; {per / 1e6:,.2f} MB of experts{kv_text} streamed a token at "
                 f"{d['pcie_gbps']:.1f} GB/s -> bound {bound:,.1f} tokens/s (empty cache: "
                 f"{empty:,.1f})")
    lines.append(rate)
    if io.state is not None or io.save is not None:
        lines.append(kv_line(r["kv_state"]))
    return "\n".join(lines)
