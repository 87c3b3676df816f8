"""llama-perplexity beside `strata perplexity` on the same GGUF, text and ctx under one VRAM budget
(issue 39 item 6): PPL of both (the same file and ctx must give close PPLs) and the tokens/s of
both, in one CSV and PNG.

    PYTHONPATH=. python experiments/ppl_side.py --gguf M.gguf --pack M.pack --bin BUILD/bin \\
        --budget 12GiB --tokens 300000 --ctx 512 [--ub 2048] [--ncmoe N] --out DIR

The text (strata.bench.text: the repository's perplexity text and standard-library docstrings,
repeated whole) is written once, long enough that the pack's tokenizer gives at least --tokens
tokens; both tools read that one file.

strata: `strata perplexity PACK --file TEXT --ctx C --vram BUDGET --json` (+ --strata-args).
tokens/s is its own figure: the windows' tokens over the seconds of its scoring loop (reads and
scoring; the pack's opening and the kernels' warm-up before it are not counted); the wall of
the whole command is recorded beside it.

llama.cpp: `llama-perplexity -m GGUF -f TEXT -c C -b UB -ub UB -ngl 99 -fa on -fit off -ncmoe N
-lm LM -lv 4` (+ --llama-args; -lv 4 has it log its buffers and timings; LM --load-mode, `none` by
default: the experts -ncmoe keeps in host memory read into pinned memory, where a mapped file
leaves them pageable and each batch's copies slow, as llama.cpp's own warning says). With -c C
and -b B it reads B // C windows as parallel sequences, so its KV holds max(1, B // C) * C
tokens. N starts at the smallest that fits the budget by the file's sizes (weights on the GPU +
f16 KV + --compute-margin, strata.bench.llama_cpp) and, while llama.cpp's own log says its GPU
buffers (model + KV + compute) pass the budget, moves to the smallest N whose weights drop by
the excess (ncmoe_after): the run is judged as soon as its context is made (before any text is
read) and killed there when over, so only the run that fits reads the text (a pinned --ncmoe runs
whole; the row says whether it fit). -fit off keeps llama.cpp from moving the flags it was given.
tokens/s is its own figure (llama_perf_context_print's prompt eval line: the tokens it evaluated
over their milliseconds; loading and tokenizing not counted); the wall is recorded beside it.
Its logger can lose its last lines at exit (a thread it never joins, ggml-org/llama.cpp#22142;
seen on a loaded CPU): a run that exits 0 without them is run again, up to LOST_RUNS times; when
the last one still lost only its perf line (its final PPL line came), the PPL is kept and its
tokens/s row and the speedup are left out, not made up.
Without a GPU its buffers are all in host memory: N is the first fit (0 under a large budget) and
the tokens/s mean nothing (the plot says CPU).

Rows (long format, strata.bench.record): ppl, ppl_err, tokens_per_s, wall_s per tool;
ppl_rel_diff = |PPL strata / PPL llama.cpp - 1|, judged against issue 39 item 4's 1e-3; speedup =
strata's tokens/s over llama.cpp's, judged against the issue's 3x target. Each row's config names
the GGUF, budget, ctx, tokens, windows, -ncmoe N, llama.cpp's GPU MiB and the command.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from strata import bench
from strata.bench.llama_cpp import (buffers_from_log, gguf_sizes, gpu_mib, fit_ncmoe,
                                    ncmoe_for_budget)
from strata.bench.plot import bars
from strata.bench.record import commit_of, gpu_name, utc_now, write_csv
from strata.bench.text import text_of_tokens
from strata.errors import StrataError
from strata.units import parse_size

ROOT = Path(__file__).resolve().parents[1]

TOOL = "llama-perplexity"
REL_BAR = 1e-3                  # issue 39 item 4: strata's PPL within 1e-3 of llama.cpp's
TARGET = 3.0                    # issue 39 item 6: >= 3x llama-perplexity's tokens/s
LOST_RUNS = 3                   # runs of one -ncmoe whose log may lose its end (LostTail)
_FINAL = re.compile(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)")
_EVAL = re.compile(r"prompt eval time =\s*([0-9.]+) ms /\s*(\d+) tokens")
_CHUNKS = re.compile(r"calculating perplexity over (\d+) chunks, n_ctx=(\d+), batch_size=(\d+), "
                     r"n_seq=(\d+)")
_READY = re.compile(r"perplexity: tokenizing the input")   # after the context is made


class LostTail(RuntimeError):
    """llama-perplexity exited 0 without its last lines: its logger (a thread it never joins,
    ggml-org/llama.cpp#22142) can lose what is queued when main returns. `got`: what the run's
    log did hold."""

    def __init__(self, message: str, got: dict):
        super().__init__(message)
        self.got = got


def llama_parse(log: str) -> dict:
    """llama-perplexity's figures from its log: ppl, ppl_err, windows, n_seq, eval_tokens,
    eval_ms, tokens_per_s (missing ones absent)."""
    out: dict = {}
    if m := _FINAL.search(log):
        out["ppl"], out["ppl_err"] = float(m.group(1)), float(m.group(2))
    if m := _CHUNKS.search(log):
        out["windows"], out["n_seq"] = int(m.group(1)), int(m.group(4))
    if m := _EVAL.search(log):
        out["eval_ms"], out["eval_tokens"] = float(m.group(1)), int(m.group(2))
        if out["eval_ms"] > 0:
            out["tokens_per_s"] = out["eval_tokens"] / out["eval_ms"] * 1e3
    return out


def llama_once(a, text: Path, n: int) -> dict:
    """One llama-perplexity run at -ncmoe n: {fits, gpu_mib, cmd, wall_s, log, **llama_parse}.
    Killed as soon as its buffers are known when they pass the budget (fits False)."""
    cmd = [str(a.bin / TOOL), "-m", str(a.gguf), "-f", str(text), "-c", str(a.ctx),
           "-b", str(a.ub), "-ub", str(a.ub), "-ngl", "99", "-fa", "on", "-fit", "off",
           "-ncmoe", str(n), "-lm", a.load_mode, "-lv", "4", *a.llama_args.split()]
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         errors="replace")
    late = threading.Event()
    timer = threading.Timer(a.timeout, lambda: (late.set(), p.kill()))
    timer.start()
    log, killed, mib = [], False, None
    try:
        for line in p.stdout:
            log.append(line)
            if mib is None and _READY.search(line):
                mib = gpu_mib(buffers_from_log("".join(log)))
                if mib * 2**20 > a.budget and a.ncmoe is None:   # a pinned N runs on
                    killed = True
                    p.kill()
                    break
        rc = p.wait()
    finally:
        timer.cancel()
        p.stdout.close()
    text_log = "".join(log)
    if mib is None:
        mib = gpu_mib(buffers_from_log(text_log))
    got = dict(fits=mib * 2**20 <= a.budget, gpu_mib=mib, cmd=" ".join(cmd[1:]), log=text_log,
               wall_s=time.perf_counter() - t0, **llama_parse(text_log))
    if late.is_set():
        raise RuntimeError(f"{TOOL} -ncmoe {n} killed after --timeout {a.timeout:g} s")
    if not killed and (rc != 0 or "ppl" not in got or "tokens_per_s" not in got):
        tail = " | ".join(text_log.strip().splitlines()[-3:])
        message = f"{TOOL} -ncmoe {n} failed (exit {rc}): {tail[-400:]}"
        if rc == 0:
            raise LostTail(message, got)
        raise RuntimeError(message)
    return got


def run_llama(a, sizes, text: Path) -> dict:
    """The run whose GPU buffers fit the budget: -ncmoe from the estimate by the sizes, then as
    strata.bench.llama_cpp.fit_ncmoe moves it by what llama.cpp logged (a pinned --ncmoe: once)."""
    n_seq = max(1, a.ub // a.ctx)
    runs = {}

    def run_at(n):
        for again in range(LOST_RUNS):
            try:
                got = llama_once(a, text, n)
                break
            except LostTail as e:
                if again == LOST_RUNS - 1:
                    if "ppl" not in e.got:
                        raise
                    # its PPL is whole (the final line came); only the perf line after it is
                    # lost: the row keeps the PPL and has no tokens/s (none is made up)
                    print(f"[llama.cpp] -ncmoe {n}: its log lost its perf line {LOST_RUNS} times "
                          f"(ggml-org/llama.cpp#22142): its PPL kept, its tokens/s missing",
                          flush=True)
                    got = dict(e.got, lost_tail=True)
                    break
                print(f"[llama.cpp] -ncmoe {n}: its log lost its last lines at exit "
                      f"(ggml-org/llama.cpp#22142); running it again", flush=True)
        print(f"[llama.cpp] -ncmoe {n}: GPU {got['gpu_mib']:.0f} MiB "
              f"({'fits' if got['fits'] else 'over'} the budget)", flush=True)
        runs[n] = got
        return int(got["gpu_mib"] * 2**20)

    if a.ncmoe is not None:
        run_at(a.ncmoe)
        return dict(runs[a.ncmoe], ncmoe=a.ncmoe)
    start = ncmoe_for_budget(sizes, a.budget, n_seq * a.ctx, a.compute_margin)
    n = fit_ncmoe(sizes, start, run_at, a.budget, n_seq * a.ctx)
    if n is None:
        raise StrataError(f"llama.cpp's GPU buffers pass {a.budget_text} even with every "
                          f"layer's experts in host memory (-ncmoe {sizes.n_layer}); give a "
                          f"larger budget")
    return dict(runs[n], ncmoe=n)


def run_strata(a, text: Path) -> dict:
    cmd = [sys.executable, "-m", "strata.cli", "perplexity", str(a.pack), "--file", str(text),
           "--ctx", str(a.ctx), "--vram", a.budget_text, "--json", *a.strata_args.split()]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout, cwd=ROOT)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"strata perplexity failed (exit {r.returncode}): "
                           f"{r.stderr.strip().splitlines()[-1:]}")
    out = json.loads(r.stdout)
    return dict(out, wall_s=wall, cmd=" ".join(cmd[2:]))


def write_text(a, folder: Path) -> tuple[Path, int, int]:
    """(the text file, its tokens by the pack's tokenizer, repeats of the sources)."""
    from strata.packs import Pack
    from strata.tokenize import pack_tokenizer
    tok = pack_tokenizer(Pack.open(a.pack))
    text, ids, reps = text_of_tokens(lambda t: tok.encode(t, specials=False), a.tokens,
                                     cut=True)
    path = folder / f"ppl_side-{a.tokens}.txt"
    path.write_text(text, encoding="utf-8")
    return path, len(ids), reps


def check(a) -> None:
    """Bad input, one line each, before anything runs."""
    if not (a.bin / TOOL).is_file():
        raise StrataError(f"--bin {a.bin}: no {TOOL} there; give llama.cpp's bin folder "
                          f"(benchmarks/llama_cpp.sh build)")
    if not a.gguf.is_file():
        raise StrataError(f"--gguf {a.gguf}: no such file")
    if not a.pack.is_file():
        raise StrataError(f"--pack {a.pack}: no such file; make it with strata pack GGUF -o PACK")
    if a.ctx < 4 or a.ctx % 2:
        raise StrataError(f"--ctx must be even and at least 4, got {a.ctx}")
    if a.tokens < 2 * a.ctx:
        raise StrataError(f"--tokens {a.tokens} is under two windows of --ctx {a.ctx}; "
                          f"{TOOL} needs at least {2 * a.ctx}")
    if a.ub < 1:
        raise StrataError(f"--ub must be at least 1, got {a.ub}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", type=Path, required=True, help="a GGUF llama.cpp loads")
    ap.add_argument("--pack", type=Path, required=True, help="strata's pack of the same GGUF")
    ap.add_argument("--bin", type=Path, required=True, help=f"the folder holding {TOOL}")
    ap.add_argument("--budget", default="12GiB", help="VRAM budget of both (default 12GiB)")
    ap.add_argument("--tokens", type=int, default=300_000, help="tokens of text (default 300000)")
    ap.add_argument("--ctx", type=int, default=512, help="tokens per window (default 512)")
    ap.add_argument("--ub", type=int, default=2048,
                    help="llama.cpp's -b and -ub (default 2048: 4 windows of 512 a batch)")
    ap.add_argument("--ncmoe", type=int, help="pin -ncmoe (else fitted to the budget)")
    ap.add_argument("--compute-margin", default="1.5GiB",
                    help="the first fit's allowance for llama.cpp's compute buffer")
    ap.add_argument("--strata-args", default="", help="more flags for strata perplexity")
    ap.add_argument("--llama-args", default="", help=f"more flags for {TOOL}")
    ap.add_argument("--load-mode", default="none",
                    help=f"{TOOL} -lm (none: its host-held experts pinned; mmap: mapped)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds each run may take")
    ap.add_argument("--out", type=Path, default=ROOT / "experiments" / "results")
    a = ap.parse_args(argv)
    try:
        a.budget_text, a.budget = a.budget, parse_size(a.budget)
        a.compute_margin = parse_size(a.compute_margin)
        check(a)
        sizes = gguf_sizes(a.gguf)
        if a.ncmoe is None:    # a budget llama.cpp cannot fit: said before anything runs
            ncmoe_for_budget(sizes, a.budget, max(1, a.ub // a.ctx) * a.ctx, a.compute_margin)
        elif not 0 <= a.ncmoe <= sizes.n_layer:
            raise StrataError(f"--ncmoe must be within 0..{sizes.n_layer}, got {a.ncmoe}")
        with tempfile.TemporaryDirectory() as d:
            text, n_tokens, reps = write_text(a, Path(d))
            print(f"[text] {n_tokens:,} tokens ({reps} repeats of the sources), ctx {a.ctx}",
                  flush=True)
            return measure(a, sizes, text, n_tokens, reps)
    except StrataError as e:
        print(f"ppl_side: {e}", file=sys.stderr)
        return 2


def measure(a, sizes, text: Path, n_tokens: int, reps: int) -> int:
    gpu, commit = gpu_name(), commit_of(ROOT)
    common = dict(gguf=a.gguf.name, pack=a.pack.name, budget=a.budget_text, ctx=a.ctx,
                  tokens=n_tokens, text_repeats=reps)
    rows, got, failed = [], {}, []
    stem = bench.run_stem(f"ppl_side-{a.gguf.stem}-{a.budget_text}-ctx{a.ctx}", ROOT)
    path = a.out / f"{stem}.csv"

    def add(label, figure, value, unit, cfg, *, bound="", bound_value=None, timer=""):
        rows.append(dict(experiment="ppl_side", label=label, gpu=gpu, commit=commit,
                         timestamp=utc_now(), torch=torch.__version__, triton="",
                         config=dict(common, **cfg), figure=figure, value=float(value),
                         unit=unit, bound=bound, bound_value=bound_value, gate="", timer=timer))
    for label, run in (("strata", lambda: run_strata(a, text)),
                       ("llama.cpp", lambda: run_llama(a, sizes, text))):
        try:
            got[label] = r = run()
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            print(f"[{label}] {str(e)[:500]}", flush=True)
            failed.append(label)
            continue
        if label == "strata":
            cfg = dict(cmd=r["cmd"], windows=r["windows"], reader=r["reader"],
                       warmup_s=r.get("warmup_s"), batches=r.get("batches"),
                       windows_per_batch=r.get("windows_per_batch"),
                       bytes_streamed=r.get("bytes_streamed"))
            timer = "strata perplexity: its scoring loop"
        else:
            cfg = dict(cmd=r["cmd"], windows=r.get("windows"), n_seq=r.get("n_seq"),
                       ncmoe=r["ncmoe"], gpu_mib=round(r["gpu_mib"], 1), fits=r["fits"],
                       ub=a.ub, eval_tokens=r.get("eval_tokens"))
            timer = "llama_perf_context_print: prompt eval"
        add(label, "ppl", r["ppl"], "PPL", cfg)
        add(label, "ppl_err", r["ppl_err"] if r["ppl_err"] is not None else math.nan, "PPL", cfg)
        if r.get("tokens_per_s"):
            add(label, "tokens_per_s", r["tokens_per_s"], "tok/s", cfg, timer=timer)
        add(label, "wall_s", r["wall_s"], "s", cfg, timer="perf_counter around the command")
        speed_text = f"{r['tokens_per_s']:,.0f} tok/s" if r.get("tokens_per_s") else \
            "tokens/s missing (its log's perf line lost)"
        print(f"[{label}] PPL {r['ppl']:.4f} +/- {r['ppl_err'] or 0:.5f} over "
              f"{cfg['windows']} windows, {speed_text}, wall {r['wall_s']:.1f} s", flush=True)
        write_csv(rows, path)     # a call cut short keeps the first tool's rows
    if not rows:
        print("ppl_side: nothing measured", file=sys.stderr)
        return 1
    s, l = got.get("strata"), got.get("llama.cpp")
    if s and l:
        rel = abs(s["ppl"] / l["ppl"] - 1)
        add("strata", "ppl_rel_diff", rel, "rel", dict(ppl_llama=l["ppl"], ppl_strata=s["ppl"]),
            bound=f"{REL_BAR:g} (issue 39 item 4)", bound_value=REL_BAR)
        speed = None
        if s.get("tokens_per_s") and l.get("tokens_per_s"):
            speed = s["tokens_per_s"] / l["tokens_per_s"]
            add("strata", "speedup", speed, "x", dict(ncmoe=l["ncmoe"]),
                bound=f">= {TARGET:g}x (issue 39 item 6)", bound_value=TARGET)
        print(f"[side] PPL strata / llama.cpp - 1 = {rel:.2e} (bar {REL_BAR:g}); strata "
              + (f"{speed:.2f}x llama.cpp's tokens/s" if speed is not None else
                 "against llama.cpp's tokens/s: missing"), flush=True)
    write_csv(rows, path)
    plot(rows, path.with_suffix(".png"))
    print(f"wrote {path} and {path.with_suffix('.png')}")
    return 1 if failed else 0


def plot(rows: list[dict], png: Path) -> None:
    by = {(r["label"], r["figure"]): r["value"] for r in rows}
    cpu = rows[0]["gpu"].startswith("cpu")
    c = rows[0]["config"]
    rel, speed = by.get(("strata", "ppl_rel_diff")), by.get(("strata", "speedup"))
    words = [f"{c['gguf']}, {c['tokens']:,} tokens, ctx {c['ctx']}, budget {c['budget']} on "
             f"{rows[0]['gpu']} @ {rows[0]['commit']}"]
    lcfg = next((r["config"] for r in rows if r["label"] == "llama.cpp"), None)
    if lcfg:
        words.append(f"llama-perplexity -ncmoe {lcfg['ncmoe']} (GPU {lcfg['gpu_mib']:.0f} MiB), "
                     f"-b/-ub {lcfg['ub']}")
    if rel is not None:
        words.append(f"PPL strata / llama.cpp - 1 = {rel:.1e}; strata "
                     + (f"{speed:.2f}x llama.cpp" if speed is not None else
                        "beside llama.cpp's tokens/s: missing (its log lost its perf line)")
                     + ("  [CPU: tokens/s not meaningful]" if cpu else ""))
    bars(rows, png, x_keys=["ctx"], figures=["tokens_per_s", "ppl", "wall_s"],
         title="\n".join(words))


if __name__ == "__main__":
    raise SystemExit(main())
