"""Cold vs warm: the first prompt of a fresh process against the same engine's later prompts,
and the time to ready (process start -> the first prompt's last-token logits) split by phase.

For each prompt length, a fresh Python process (a subprocess: nothing imported, no CUDA context,
the Triton cache as earlier runs left it) opens a pack file, pins its expert blobs, builds the
engine on the VRAM budget (the expert cache allocated and filled, dense weights loaded), warms up
(PrefillEngine.warmup: one dry prompt through the prompt's plan; the `nowarm` arm skips it) and
reads the prompt `--repeats` times. Per process:

    ready_s = import_s (interpreter + torch + the pack reader; torch_import_s: `import torch`
              alone; the read-ahead of the pack, strata.engine.early, runs beside it)
            + cuda_s (the CUDA context)
            + start_s (the rest of strata's imports, the host blobs pinning on a thread beside
              them: pin_s is that thread's own wall time, pin_gbps its rate)
            + fill_s (PrefillEngine.__init__: plan_s, cache_alloc_s, dense_upload_s and
              model_build_s, ffn_s (the FFN's kernel imports) still beside the pinning,
              pin_wait_s for what is left of it,
              cache_fill_s, other_s; from PrefillEngine.timings) + warmup_s (warmup_read_s: the
              dry prompt's tokens through its warmup_layers at the warm rate; warmup_load_s: the
              rest, the one-time kernel compile/load) + prompt_s (the first timed prompt)
    first_over_warm = tokens/s of the first prompt / mean tokens/s of the later ones

Targets (issue 17): first_over_warm >= 0.9 (the warm arm); ready_s <= 10 s for a 32 GB pack in
page cache. Beside them, the llama.cpp-style load figure measurable here: `page_cache_read_s`,
the pack file read once end to end from the page cache (an mmap loader's floor).

    python experiments/cold_warm.py                 # GPU: qwen3-30b-a3b Q8_0, --vram 12GiB, 8K/32K
    python experiments/cold_warm.py --smoke         # CPU: a tiny pack, seconds

The GPU pack is written once to /dev/shm by MemoryPack.save (the experts repeat a few distinct
blobs, which no pinning, copy or kernel cost depends on; `--synth` draws every expert with
`strata synth` instead, minutes). Its time is the `synth_s` figure; `--pack PATH` reuses a pack,
`--keep` leaves it.
Follows strata.bench: one long-format CSV (figures per arm and prompt, with commit and GPU) and a
PNG (stacked time-to-ready phases per run, first vs warm tokens/s).
"""
from __future__ import annotations

import time

_T0 = time.time()   # the child's import_s starts at its spawn (passed in) and ends below

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GIB = 1 << 30
TAG = "COLDWARM "


# -- the child: one fresh process ---------------------------------------------------------------
def child(a) -> int:
    # as the CLI does (strata.cli.main): the pack's experts start coming off the page cache
    # before torch is imported; HostExperts adopts them (a pin method's early=1; the default reads nothing ahead)
    from strata.engine.early import EarlyRead, PinMethod
    auto = a.pin_method == "auto"      # the engine's own choice (host_pinning), made below
    method = PinMethod() if auto else PinMethod.parse(a.pin_method)
    early = None if not method.early or method.source != "pread" else \
        EarlyRead.start(a.child, threads=method.threads)
    t_torch = time.time()
    import torch
    t_torch = time.time() - t_torch
    from strata.engine.host import HostExperts
    from strata.packs import Pack
    t_import = time.time()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.init()
        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
    t_cuda = time.time()
    # the blobs pin on a thread while the rest of strata (the engine, Triton, the kernels)
    # imports and the engine allocates its cache and uploads the dense weights
    pack = Pack.open(a.child)
    sizes = [pl.blob_size for pl in pack.layers]
    if auto:   # as strata prefill picks: a copy where it fits, else the pages locked in place
        from strata.engine.host import expert_bytes, host_pinning
        method = host_pinning(pack, expert_bytes(pack), True, cuda)[0]
    host = HostExperts(pack.experts, sizes, pin=True, background=True, spans=pack.expert_span,
                       method=method, early=early)
    from strata.commands._args import resolve_experts
    from strata.engine.prefill import EngineConfig, PrefillEngine
    import strata.kernels.moe.decoded  # noqa: F401 (the FFN's modules, beside the pinning)
    import strata.kernels.moe.ffn  # noqa: F401
    t_pin = time.time()
    cfg = EngineConfig(vram=a.vram, cache=a.cache, chunk=a.chunk, ring=a.ring,
                       max_prompt=a.prompt, reserve=a.reserve if a.reserve is not None else
                       EngineConfig.reserve, ffn=resolve_experts("auto", "cuda" if cuda else "cpu"))
    eng = PrefillEngine(pack, cfg, host=host)
    t_fill = time.time()
    warm = 0.0 if a.no_warmup else eng.warmup(a.prompt, seed=1, full=a.full_warmup)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, pack.shape.vocab, (a.prompt,), generator=g, dtype=torch.int64)
    tps, first_ready = [], None
    for r in range(a.repeats):
        with torch.inference_mode():
            res = eng.run(tokens, logits="last")
        if r == 0:
            first_ready = time.time()
        tps.append(res.stats.tokens_per_s)
    out = {"import_s": t_import - a.spawn, "torch_import_s": t_torch, "cuda_s": t_cuda - t_import,
           "start_s": t_pin - t_cuda, "pin_s": host.load_s, "fill_s": t_fill - t_pin,
           "warmup_s": warm,
           "prompt_s": first_ready - t_fill - warm, "ready_s": first_ready - a.spawn,
           "first_tokens_per_s": tps[0],
           "warm_tokens_per_s": sum(tps[1:]) / max(len(tps) - 1, 1),
           "pinned": host.pinned, "pack_bytes": sum(sizes) * pack.shape.n_expert,
           "pin_end_s": host.loaded_at - a.spawn, "pin_lock_s": host.lock_s,
           "early_layers": host.early_layers, "pin_source": method.source,
           "chunk": res.chunk, "ring": res.ring, "bytes_streamed": res.stats.bytes_streamed}
    out["first_over_warm"] = out["first_tokens_per_s"] / out["warm_tokens_per_s"]
    # fill_s split (PrefillEngine.timings), and the warm-up's read vs its one-time load: the
    # dry prompt's read is its tokens through its layers at the warm rate
    for k in ("plan_s", "cache_alloc_s", "cache_fill_s", "other_s", "dense_upload_s",
              "model_build_s", "pin_wait_s", "ffn_s", "dense_s", "sync_s"):
        out[k] = eng.timings.get(k, 0.0)
    C = res.chunk
    dry = a.prompt if a.prompt <= C else C + (a.prompt % C or C)
    n_warm = eng.timings.get("warmup_layers", 0)
    out["warmup_layers"] = n_warm
    read = dry * n_warm / pack.shape.n_layer / out["warm_tokens_per_s"] if warm else 0.0
    out["warmup_read_s"] = min(read, warm)   # an estimate: at most the whole warm-up
    out["warmup_load_s"] = warm - out["warmup_read_s"]
    out["cache_bytes"] = sum(p.cache.layout.nbytes for p in eng.parts)
    out["cache_fill_gbps"] = out["cache_bytes"] / max(out["cache_fill_s"], 1e-9) / 1e9
    out["pin_gbps"] = out["pack_bytes"] / max(out["pin_s"], 1e-9) / 1e9
    print(TAG + json.dumps(out), flush=True)
    return 0


def spawn(pack: Path, prompt: int, arm: str, a, extra: list[str]) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(pack), "--prompt",
           str(prompt), "--repeats", str(a.repeats), *extra]
    if arm == "nowarm":
        cmd.append("--no-warmup")
    elif arm == "fullwarm":
        cmd.append("--full-warmup")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd += ["--spawn", repr(time.time())]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    line = next((l for l in p.stdout.splitlines() if l.startswith(TAG)), None)
    if p.returncode or line is None:
        tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"cold_warm child ({arm}, {prompt}) failed: {' | '.join(tail)}")
    return json.loads(line[len(TAG):])


def page_cache_read(path: Path) -> float:
    """Seconds to read the file once end to end (64 MiB reads): the pack from page cache."""
    buf = bytearray(64 << 20)
    view = memoryview(buf)
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.readinto(view):
            pass
    return time.perf_counter() - t0


FIGURES = {"ready_s": "s", "start_s": "s", "pin_wait_s": "s", "ffn_s": "s", "import_s": "s",
           "torch_import_s": "s",
           "cuda_s": "s",
           "pin_s": "s", "fill_s": "s",
           "warmup_s": "s", "prompt_s": "s", "first_tokens_per_s": "tok/s",
           "warm_tokens_per_s": "tok/s", "first_over_warm": "fraction", "pin_gbps": "GB/s",
           "bytes_streamed": "bytes", "plan_s": "s", "cache_alloc_s": "s", "cache_fill_s": "s",
           "other_s": "s", "dense_upload_s": "s", "model_build_s": "s", "warmup_read_s": "s",
           "warmup_load_s": "s", "warmup_layers": "layers", "cache_fill_gbps": "GB/s",
           "dense_s": "s", "sync_s": "s", "pin_end_s": "s", "pin_lock_s": "s",
           "early_layers": "layers"}


def measure(args, rec) -> None:
    from strata import bench
    if args.smoke:
        import tempfile
        from strata.packs.synth import ExpertFormats, synth_pack
        from strata.shapes import get_preset
        tmp = Path(tempfile.mkdtemp(prefix="cold_warm-"))
        pack = synth_pack(tmp / "tiny.pack", get_preset("tiny"), ExpertFormats.of("Q8_0"),
                          progress=False)
        extra = ["--vram", str(GIB), "--cache", str(90 << 10), "--chunk", "32", "--ring", "2"]
        prompts, made = [40, 100], True
    else:
        pack = Path(args.pack)
        made = not pack.exists()
        if made:
            t0 = time.perf_counter()
            if args.synth:
                subprocess.run([sys.executable, "-m", "strata.cli", "synth", "--preset",
                                args.preset, "--quant", args.quant, "--pack", "-o", str(pack)],
                               cwd=ROOT, check=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
            else:
                from strata.packs.memory import MemoryPack
                from strata.packs.synth import ExpertFormats
                from strata.shapes import get_preset
                MemoryPack(get_preset(args.preset), ExpertFormats.of(args.quant), seed=0,
                           device="cpu").save(pack, tokenizer=False)
            synth_s = time.perf_counter() - t0
            rec.add("synth_s", synth_s, "s", model=args.preset, quant=args.quant,
                    bytes=pack.stat().st_size, writer="strata synth" if args.synth
                    else "MemoryPack.save")
            print(f"wrote {pack} ({pack.stat().st_size / 1e9:.1f} GB) in {synth_s:.0f} s",
                  flush=True)
        extra = ["--vram", str(args.vram)]
        prompts = [int(p) for p in args.prompts.split(",")]
    size = pack.stat().st_size
    page_cache_read(pack)                       # into the page cache first (if it was not)
    rd = page_cache_read(pack)
    rec.add("page_cache_read_s", rd, "s", bound="llama.cpp-style load floor: the pack file "
            "read once from page cache", bound_value=rd, bytes=size)
    runs = [(T, arm, pm) for T in prompts for pm in args.pin_methods.split(";")
            for arm in args.arms.split(",")]
    if args.prime and runs:
        runs.insert(0, (runs[0][0], "prime", runs[0][2]))
    try:
        for T, arm, pm in runs:
            r = spawn(pack, T, "warm" if arm == "prime" else arm, args,
                      [*extra, "--pin-method", pm])
            cfg = dict(arm=arm, prompt=T, chunk=r["chunk"], ring=r["ring"],
                       pinned=r["pinned"], pack_bytes=r["pack_bytes"], pin_method=pm,
                       pin_source=r["pin_source"])
            for fig, unit in FIGURES.items():
                bound, bv = "", None
                if fig == "first_over_warm":
                    bound, bv = "target >= 0.9 (issue 17)", 0.9
                elif fig == "ready_s":
                    bound, bv = "target <= 10 s for a 32 GB pack in page cache", 10.0
                rec.add(fig, r[fig], unit, bound=bound, bound_value=bv,
                        timer=bench.WALL_TIMER, **cfg)
            rec.flush()
            print(f"{arm:6s} [{pm}: {r['pin_source']}] T={T}: ready {r['ready_s']:.2f} s (import {r['import_s']:.2f} "
                  f"[torch {r['torch_import_s']:.2f}], "
                  f"cuda {r['cuda_s']:.2f}, start {r['start_s']:.2f} [pinning beside it: "
                  f"{r['pin_s']:.2f} s at {r['pin_gbps']:.1f} GB/s (locking {r['pin_lock_s']:.2f}), "
                  f"done at {r['pin_end_s']:.2f} s, waited "
                  f"{r['pin_wait_s']:.2f}], "
                  f"fill {r['fill_s']:.2f} [plan {r['plan_s']:.2f}, cache alloc "
                  f"{r['cache_alloc_s']:.2f}, cache fill {r['cache_fill_s']:.2f} at "
                  f"{r['cache_fill_gbps']:.0f} GB/s, syncs {r['sync_s']:.2f}, dense {r['dense_s']:.2f} (upload "
                  f"{r['dense_upload_s']:.2f}), model "
                  f"{r['model_build_s']:.2f}, ffn imports {r['ffn_s']:.2f}], warm-up "
                  f"{r['warmup_s']:.2f} [{r['warmup_layers']} layers: read "
                  f"{r['warmup_read_s']:.2f}, load {r['warmup_load_s']:.2f}], prompt "
                  f"{r['prompt_s']:.2f}); first {r['first_tokens_per_s']:,.0f} tok/s vs warm "
                  f"{r['warm_tokens_per_s']:,.0f} -> {r['first_over_warm']:.2f}", flush=True)
    finally:
        if made and not args.keep:
            pack.unlink(missing_ok=True)
        if args.smoke and not args.keep:    # the smoke's own folder, not only its pack
            import shutil
            shutil.rmtree(pack.parent, ignore_errors=True)


def plot(rows: list[dict], png: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs: dict = {}
    for r in rows:
        c = r["config"]
        if "arm" in c:
            arm = c["arm"] if c.get("pin_method", "pread") in ("pread", "auto") else \
                f"{c['arm']} [{c['pin_method']}]"
            runs.setdefault((arm, c["prompt"]), {})[r["figure"]] = r["value"]
    keys = sorted(runs, key=lambda k: (k[1], k[0]))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.2))
    # fill_s and warmup_s drawn split into their parts (the rest of fill_s: "fill other")
    for r in runs.values():
        parts = ("plan_s", "cache_alloc_s", "cache_fill_s", "dense_upload_s", "model_build_s",
                 "pin_wait_s", "ffn_s")
        r["fill_other_s"] = max(r.get("fill_s", 0.0) - sum(r.get(k, 0.0) for k in parts), 0.0)
    phases = ["import_s", "cuda_s", "start_s", "plan_s", "cache_alloc_s", "ffn_s", "dense_upload_s",
              "model_build_s", "pin_wait_s", "cache_fill_s", "fill_other_s", "warmup_read_s",
              "warmup_load_s", "prompt_s"]
    x = range(len(keys))
    bottom = [0.0] * len(keys)
    colors = plt.get_cmap("tab20").colors
    for i, ph in enumerate(phases):
        v = [runs[k].get(ph, 0.0) for k in keys]
        a1.bar(x, v, bottom=bottom, label=ph[:-2].replace("_", " "), color=colors[i % 20])
        bottom = [b + y for b, y in zip(bottom, v)]
    a1.axhline(10, color="k", ls="--", lw=1)
    a1.set_xticks(list(x), [f"{arm}\nT={T}" for arm, T in keys], fontsize=8)
    a1.set_ylabel("seconds from process start (dashed: 10 s target)")
    a1.legend(fontsize=7)
    w = 0.38
    a2.bar([i - w / 2 for i in x], [runs[k]["first_tokens_per_s"] for k in keys], w,
           label="first prompt")
    a2.bar([i + w / 2 for i in x], [runs[k]["warm_tokens_per_s"] for k in keys], w,
           label="warm (later prompts)")
    a2.set_xticks(list(x), [f"{arm}\nT={T}" for arm, T in keys], fontsize=8)
    a2.set_ylabel("tokens/s")
    a2.legend(fontsize=7)
    fig.suptitle(f"cold vs warm, time to ready — {rows[0]['gpu']} @ {rows[0]['commit']}",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--child" in argv:
        ap = argparse.ArgumentParser()
        ap.add_argument("--child")
        ap.add_argument("--prompt", type=int)
        ap.add_argument("--repeats", type=int, default=4)
        ap.add_argument("--vram", type=int)
        ap.add_argument("--cache", type=int, default=None)
        ap.add_argument("--chunk", type=int, default=None)
        ap.add_argument("--ring", type=int, default=None)
        ap.add_argument("--reserve", type=int, default=None)
        ap.add_argument("--no-warmup", action="store_true")
        ap.add_argument("--full-warmup", action="store_true")
        ap.add_argument("--spawn", type=float, default=_T0)
        ap.add_argument("--pin-method", default="")
        return child(ap.parse_args(argv))
    from strata import bench
    ap = bench.parser(__doc__, out=ROOT / "experiments" / "results", warmup=0, repeats=4)
    ap.add_argument("--smoke", action="store_true", help="tiny pack on the CPU (checks the script)")
    ap.add_argument("--preset", default="qwen3-30b-a3b")
    ap.add_argument("--quant", default="Q8_0")
    ap.add_argument("--pack", default="/dev/shm/strata-coldwarm-qwen3-30b-a3b-Q8_0.pack",
                    help="the pack file (written by strata synth when missing)")
    ap.add_argument("--keep", action="store_true", help="leave a pack this run wrote")
    ap.add_argument("--synth", action="store_true",
                    help="write a missing pack with `strata synth` (every expert drawn: minutes) "
                         "instead of MemoryPack.save (repeated experts: seconds)")
    ap.add_argument("--vram", type=int, default=12 * GIB, help="bytes of VRAM (default 12 GiB)")
    ap.add_argument("--prompts", default="8192,32768")
    ap.add_argument("--arms", default="warm,nowarm",
                    help="warm: the engine's warm-up before the first prompt (its warm layers); "
                         "fullwarm: the warm-up through every layer; nowarm: without")
    ap.add_argument("--pin-methods", default="auto",
                    help="';'-separated PinMethod texts (strata.engine.pinning), each a run of "
                         "every arm, e.g. 'pread;map,overlap=0,switch=none'; auto (default): "
                         "the engine's own choice, a copy where it fits beside the pack, else "
                         "its pages locked in place (strata.engine.host.host_pinning)")
    ap.add_argument("--prime", action="store_true",
                    help="first one untimed child (its figures recorded as arm 'prime'), so the "
                         "arms start from a Triton cache that holds this plan's kernels")
    args = ap.parse_args(argv)
    from strata.engine.pinning import PinMethod
    for pm in args.pin_methods.split(";"):   # a bad one is one line now, not a child's traceback
        if pm == "auto":
            continue
        try:
            PinMethod.parse(pm)
        except (TypeError, ValueError) as e:
            ap.error(f"--pin-methods: {pm!r}: {e}")
    if args.repeats < 2:
        ap.error("--repeats must be at least 2 (the first prompt and a warm one)")
    tag = "smoke" if args.smoke else bench.gpu_name().replace(" ", "_")
    return bench.main(args, "cold_warm", measure, script=__file__, argv=argv,
                      stem=f"cold_warm-{tag}", plot=plot, summary=lambda rows: None)


if __name__ == "__main__":
    sys.exit(main())
