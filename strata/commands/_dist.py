"""`strata prefill ... --distributed`: one rank of the layer-split pipeline (under torchrun).

Every rank reads the same flags; the last rank prints the report (every rank's compute,
hand-off and bubble) and writes --dump-logits. An error on any rank is the same one line on
every rank (exit 2, strata.cli).
"""
from __future__ import annotations

import json

import torch

from strata.errors import StrataError


def add_flags(p) -> None:
    g = p.add_argument_group("distributed (under torchrun: one process per GPU or host)")
    g.add_argument("--distributed", action="store_true",
                   help="this process is one rank of a layer-split pipeline; --vram once (every "
                        "rank) or once per rank")
    g.add_argument("--distributed-backend", choices=["nccl", "gloo"], default=None,
                   help="collectives backend (default nccl on CUDA, gloo on CPUs; gloo lets two "
                        "ranks share one GPU)")
    g.add_argument("--dist-schedule", choices=["sequential", "pipelined"], default="sequential",
                   help="sequential: one chunk in flight; pipelined: chunk c on rank r+1 while "
                        "chunk c+1 runs on rank r (default sequential)")
    g.add_argument("--dist-timeout", type=float, default=None, metavar="S",
                   help="seconds any collective or hand-off may wait before the prompt fails "
                        "(default 600)")


def run(args) -> int:
    from strata.cli import skip_interpreter_teardown
    from strata.commands._args import engine_config
    from strata.commands._prompt import (check_context, dump_path, open_checked, prompt_ids,
                                         save_logits)
    from strata.engine import distributed as D

    if not (args.vram or args.cache is not None):
        raise StrataError("--distributed runs the streaming engine; give --vram (every rank, "
                          "or one per rank)")
    if getattr(args, "devices", None):
        raise StrataError("--devices does not go with --distributed: each rank takes "
                          "cuda:LOCAL_RANK; launch one rank per GPU with torchrun")
    for flag in ("prompts_file", "trace"):
        if getattr(args, flag, None):
            raise StrataError(f"--{flag.replace('_', '-')} does not go with --distributed yet: "
                              f"the ranks read one prompt (--prompt, --prompt-file, --tokens "
                              f"or --prompt-tokens)")
    dcfg = D.DistConfig(schedule=args.dist_schedule, backend=args.distributed_backend,
                        timeout_s=args.dist_timeout or D.TIMEOUT_S)
    rank, world, device = D.init(dcfg.backend, dcfg.timeout_s)
    # gloo aborted ~1 rank exit in 16 in the interpreter's teardown even after a clean
    # destroy_process_group (SIGABRT, no Python frame): this process leaves by os._exit
    skip_interpreter_teardown()
    try:
        rc = _run(args, dcfg, rank, world, device, D, engine_config, check_context, dump_path,
                  open_checked, prompt_ids, save_logits)
    except BaseException:
        # a rank that raises leaves at once (its peers' hand-offs time out or see it gone): no
        # barrier it could hang in
        torch.distributed.destroy_process_group()
        raise
    # every rank returned: meet once before tearing the group down, so no rank's teardown
    # closes a connection a peer is still using (gloo then aborted a rank at exit, ~1 run in 3)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return rc


def _run(args, dcfg, rank, world, device, D, engine_config, check_context, dump_path,
         open_checked, prompt_ids, save_logits) -> int:
    import time
    last = rank == world - 1
    dump = dump_path(args) if last else None
    pack = open_checked(args)
    tokens, text = prompt_ids(args, pack)   # text through the pack's tokenizer, or ids
    check_context(len(tokens), pack.shape)
    args.device = str(device)
    cfg = engine_config(args, len(tokens), progress=False)
    check_context(cfg.max_prompt, pack.shape, "--max-prompt")
    t0 = time.perf_counter()
    eng = D.StageEngine(pack, cfg, dcfg, rank=rank, world=world, device=device)
    startup = time.perf_counter() - t0
    warm = 0.0 if args.no_warmup else eng.warmup(len(tokens))
    with torch.inference_mode():
        res = eng.run(torch.tensor(tokens, dtype=torch.int64), logits="all" if dump else "last")
    mine = stage_report(res)
    every = [None] * world
    torch.distributed.all_gather_object(every, mine)
    if not last:
        return 0
    report = pipeline_report(every, res, str(args.pack), pack.shape.arch, dcfg, startup)
    report["warmup_s"], report["warmed"] = warm, not args.no_warmup
    if text:
        report["prompt"] = text
    if dump:
        report["logits_path"] = save_logits(dump, res.logits)
    print(json.dumps(report) if args.json else summary(report))
    return 0


def stage_report(res) -> dict:
    st = res.stats
    return {"rank": res.rank, "layers": [res.layers.start, res.layers.stop],
            "prefill_chunk": res.chunk, "prefill_ring": res.ring, "seconds": st.seconds,
            "compute_s": res.compute_s, "handoff_s": res.handoff_s,
            "handoff_bytes": res.handoff_bytes, "bytes_streamed": st.bytes_streamed,
            "h2d_gbps": st.h2d_gbps, "wait_s": st.wait_s, "cache_hits": st.cache_hits,
            "routed": st.routed, "n_chunks": len(st.chunks)}


def pipeline_report(every: list[dict], res, pack: str, arch: str, dcfg, startup: float) -> dict:
    """The last rank's view: the prompt's wall time is the slowest rank's; a rank's measured
    bubble is the part of that time it spent neither computing nor handing off."""
    from strata.engine.distributed import bubble
    seconds = max(r["seconds"] for r in every)
    n = res.stats.tokens
    for r in every:
        r["idle_fraction"] = max(0.0, 1.0 - (r["compute_s"] + r["handoff_s"]) / seconds) \
            if seconds > 0 else 0.0
    n_chunks = every[-1]["n_chunks"]
    return {"pack": pack, "arch": arch, "world": len(every), "schedule": dcfg.schedule,
            "n_tokens": n, "seconds": seconds,
            "tokens_per_s": n / seconds if seconds > 0 else float("inf"),
            "prefill_chunk": res.chunk, "n_chunks": n_chunks,
            "bubble_model": bubble(dcfg.schedule, n_chunks, len(every)),
            "startup_s": startup, "ranks": every,
            "next_token": int(res.logits[-1].argmax()) if res.logits is not None else None}


def summary(r: dict) -> str:
    from strata.commands._prompt import prompt_line
    from strata.units import fmt_bytes
    lines = [prompt_line(r["prompt"])] if r.get("prompt") else []
    lines += [f"strata prefill --distributed: {r['n_tokens']:,} tokens through {r['pack']} "
              f"({r['arch']}) on {r['world']} ranks, {r['schedule']} schedule",
              f"  INFO      prefill_chunk={r['prefill_chunk']} ({r['n_chunks']} chunks)",
              f"  speed     {r['tokens_per_s']:,.1f} tokens/s ({r['seconds']:.3f} s, "
              + (f"after a {r['warmup_s']:.3f} s warm-up)" if r.get("warmed") else
                 "cold: --no-warmup)"),
              f"  bubble    {100 * r['bubble_model']:.1f}% by the schedule's count"]
    for s in r["ranks"]:
        lines.append(f"  rank {s['rank']}    layers {s['layers'][0]}-{s['layers'][1] - 1}, ring "
                     f"{s['prefill_ring']}, compute {s['compute_s']:.3f} s, hand-off "
                     f"{s['handoff_s']:.3f} s ({fmt_bytes(s['handoff_bytes'])} sent), idle "
                     f"{100 * s['idle_fraction']:.1f}%, streamed {fmt_bytes(s['bytes_streamed'])}")
    if r["next_token"] is not None:
        lines.append(f"  next token {r['next_token']}")
    if r.get("logits_path"):
        lines.append(f"  logits float32 [{r['n_tokens']}, vocab] -> {r['logits_path']}")
    return "\n".join(lines)
