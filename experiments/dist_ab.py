"""The distributed layer split against the one-process split: what a hand-off per chunk costs.

qwen3-30b-a3b with Q8_0 experts (a full-size synthetic MemoryPack; every process builds the same
one from the same seed), --vram 12GiB per participant, a 32K prompt:

- one process: PrefillEngine with two participants (both on the one GPU), the hidden state
  moving participant to participant inside the process;
- two ranks (strata.engine.distributed over gloo on localhost, both ranks sharing the one GPU:
  NCCL refuses two ranks on one device), each with its own half of the pack pinned, its own
  cache, loan and ring, the hidden states [T, D] bf16 handed over through host memory per
  chunk, under the sequential and the pipelined schedule.

The plan is the same on both paths (the agreed chunk is the single-process plan), so the
difference in tokens/s is the hand-off (send/recv through gloo) and the schedule; the rows
also give the measured hand-off seconds and bytes per chunk per rank and the idle fraction.

    python experiments/dist_ab.py                       # one GPU (nvidia-h200), < 8 min
    python experiments/dist_ab.py --backend nccl --prompts 32768,131072   # nvidia-h200-x2
    python experiments/dist_ab.py --smoke               # CPU: tiny model, two gloo ranks
"""
from __future__ import annotations

import json
import socket
import tempfile
import sys
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

from strata import bench

ROOT = Path(__file__).resolve().parents[1]
GIB = 1 << 30
SCHEDULES = ("sequential", "pipelined")


def main(argv=None) -> int:
    ap = bench.parser(__doc__, out=ROOT / "experiments" / "results")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--prompts", default="32768")
    ap.add_argument("--backend", choices=["gloo", "nccl"], default="gloo",
                    help="gloo (two ranks may share one GPU) or nccl (one GPU per rank)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds the ranks may take")
    args = ap.parse_args(argv)
    tag = "smoke" if args.smoke else bench.gpu_name().replace(" ", "_")
    return bench.main(args, "dist_ab", measure, script=__file__, argv=argv,
                      stem=f"dist_ab-{tag}-{args.backend}", summary=lambda rows: None)


def setup(smoke: bool, prompts: str):
    """(shape, quant, vram, cache, prompts, ffn, scan_max) of the run."""
    from strata.shapes import get_preset
    if smoke:
        return get_preset("demo"), "Q8_0", 1 << 30, "20%", [600], "torch", 256
    return (get_preset("qwen3-30b-a3b"), "Q8_0", 12 * GIB, None,
            [int(p) for p in prompts.split(",")], "auto", 32768)


def config(smoke: bool, prompts, vram, cache, ffn, scan_max, pack, *, world: int, devices=None):
    from strata.engine.prefill import EngineConfig
    if cache == "20%":
        cache = int(pack.expert_bytes * 0.2)
    return EngineConfig(vram=[vram] * world, cache=cache, devices=devices,
                        max_prompt=max(prompts), scan_max=scan_max, ffn=ffn)


def make_pack(shape, quant):
    from strata.packs.memory import MemoryPack
    from strata.packs.synth import ExpertFormats
    return MemoryPack(shape, ExpertFormats.of(quant), seed=0)


def tokens(shape, T):
    return torch.randint(0, shape.vocab, (T,), generator=torch.Generator().manual_seed(T))


def measure(args, rec: bench.Recorder) -> None:
    from strata.engine.prefill import PrefillEngine
    cuda = torch.cuda.is_available()
    shape, quant, vram, cache, prompts, ffn, scan_max = setup(args.smoke, args.prompts)
    model = f"{shape.n_layer}L-{quant}"
    # the one-process split: two participants (on the one GPU, or cuda:0/cuda:1 under nccl)
    pack = make_pack(shape, quant)
    devices = (["cuda:0", "cuda:1"] if args.backend == "nccl" else ["cuda:0"] * 2) if cuda \
        else ["cpu"] * 2
    eng = PrefillEngine(pack, config(args.smoke, prompts, vram, cache, ffn, scan_max, pack,
                                     world=2, devices=devices))
    one = {}
    for T in prompts:
        with torch.inference_mode():
            eng.run(tokens(shape, T), logits="none")          # the first read compiles the tiles
            res = eng.run(tokens(shape, T), logits="last")
        one[T] = res
        rec.add("tokens_per_s", res.stats.tokens_per_s, "tok/s", timer=bench.WALL_TIMER,
                run="one process", model=model, prompt=T, chunk=res.chunk, ring=str(res.ring))
        print(f"one process T={T}: chunk {res.chunk} ring {res.ring} "
              f"{res.stats.tokens_per_s:,.0f} tok/s", flush=True)
        rec.flush()
    eng.host.close()
    del eng, pack
    if cuda:
        torch.cuda.empty_cache()
    # two ranks
    with tempfile.TemporaryDirectory() as tmp:
        _two_ranks(args, rec, Path(tmp), prompts, one, model)


def _two_ranks(args, rec, work: Path, prompts, one, model) -> None:
    port = free_port()
    ctx = mp.start_processes(_rank, args=(2, port, args.smoke, args.prompts, args.backend,
                                          str(work), torch.get_num_threads()),
                             nprocs=2, join=False, start_method="spawn")
    t0 = time.time()
    while not ctx.join(timeout=5):
        if time.time() - t0 > args.timeout:
            for p in ctx.processes:
                p.kill()
            raise RuntimeError(f"the ranks did not finish within {args.timeout:.0f} s")
    reports = [json.loads((work / f"rank{r}.json").read_text()) for r in range(2)]
    for T in prompts:
        ref = one[T].logits
        for sched in SCHEDULES:
            ranks = [r[f"{sched}-{T}"] for r in reports]
            seconds = max(r["seconds"] for r in ranks)
            n_chunks = ranks[-1]["n_chunks"]
            got = torch.load(work / f"logits-{sched}-{T}.pt")
            cfg = dict(run=f"2 ranks {sched}", model=model, prompt=T, chunk=ranks[0]["chunk"],
                       backend=args.backend)
            rec.add("tokens_per_s", T / seconds, "tok/s", timer=bench.WALL_TIMER,
                    bound="the one-process split", bound_value=one[T].stats.tokens_per_s, **cfg)
            rec.add("logits_identical", int(torch.equal(got, ref.cpu())), "bool",
                    bound="1 (the one-process read)", **cfg)
            rec.add("logits_max_abs_diff", float((got - ref.cpu()).abs().max()), "abs", **cfg)
            for r in ranks:
                per = dict(cfg, rank=r["rank"], layers=r["layers"], ring=str(r["ring"]))
                rec.add("handoff_s_per_chunk", r["handoff_s"] / n_chunks, "s", **per)
                rec.add("handoff_bytes_per_chunk", r["handoff_bytes"] / n_chunks, "bytes", **per)
                rec.add("idle_fraction", max(0.0, 1 - (r["compute_s"] + r["handoff_s"]) / seconds),
                        "fraction", **per)
            print(f"2 ranks {sched} T={T}: chunk {ranks[0]['chunk']} {T / seconds:,.0f} tok/s "
                  f"(one process {one[T].stats.tokens_per_s:,.0f}); hand-off per chunk "
                  + ", ".join(f"rank {r['rank']} {1e3 * r['handoff_s'] / n_chunks:.1f} ms"
                              for r in ranks)
                  + f"; logits identical {torch.equal(got, ref.cpu())}", flush=True)
            rec.flush()


def _rank(rank, world, port, smoke, prompts_arg, backend, work, threads):
    """One rank: its half of the pack, its participant; every prompt under both schedules."""
    from dataclasses import replace

    from strata.engine.distributed import DistConfig, StageEngine, init, leave
    torch.set_num_threads(threads)   # the parent's: CPU sums split by thread count
    shape, quant, vram, cache, prompts, ffn, scan_max = setup(smoke, prompts_arg)
    r, w, dev = init(backend, 600, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world=world)
    if backend == "gloo" and dev.type == "cuda":
        dev = torch.device("cuda", 0)   # both ranks share the one GPU
    pack = make_pack(shape, quant)
    eng = StageEngine(pack, config(smoke, prompts, vram, cache, ffn, scan_max, pack, world=w),
                      DistConfig(), rank=r, world=w, device=dev)
    report = {}
    for T in prompts:
        with torch.inference_mode():
            eng.run(tokens(shape, T), logits="none")
            for sched in SCHEDULES:
                eng.dcfg = replace(eng.dcfg, schedule=sched)
                res = eng.run(tokens(shape, T), logits="last")
                report[f"{sched}-{T}"] = dict(
                    rank=r, layers=[res.layers.start, res.layers.stop], chunk=res.chunk,
                    ring=res.ring, seconds=res.stats.seconds, compute_s=res.compute_s,
                    handoff_s=res.handoff_s, handoff_bytes=res.handoff_bytes,
                    n_chunks=len(res.stats.chunks))
                if res.logits is not None:
                    torch.save(res.logits.cpu(), Path(work) / f"logits-{sched}-{T}.pt")
    (Path(work) / f"rank{r}.json").write_text(json.dumps(report))
    leave()   # no interpreter teardown: gloo aborted a rank there after its report was written


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    sys.exit(main())
