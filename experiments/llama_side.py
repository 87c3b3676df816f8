"""llama.cpp's llama-bench beside `strata bench` on the same GGUF under the same VRAM budget
(issues 37 item 4, 38 item 5): prompt tokens/s at each length, both in one CSV and PNG.

    PYTHONPATH=. python experiments/llama_side.py --gguf M.gguf --bin BUILD/bin --budget 12GiB \\
        --prompts 8192,32768 [--pack M.pack] [--ub 2048,8192] [--ncmoe N] --out DIR

llama.cpp: `llama-bench -m M.gguf -ngl 99 -fa 1 -n 0 -p P -ub UB -b UB -ncmoe N -lm LM -r R -o
csv -v`. N starts at the smallest that fits the budget by the file's sizes (weights on the GPU +
f16 KV at P tokens + --compute-margin, strata.bench.llama_cpp) and, while llama.cpp's own log
says its GPU buffers (model + KV + compute) pass the budget, moves to the smallest N whose weights
drop by the excess (ncmoe_after); each -ub in --ub and each load mode in
--load-mode is tried and the fastest that fits is kept; every flag and the GPU MiB llama.cpp
reported go in the row. The load mode matters: with the file mapped (`mmap`, llama.cpp's default)
the experts -ncmoe keeps in host memory stay in the pageable mapping, and a prompt's batches copy
them to the GPU at pageable rates; `none` reads them into pinned host memory (llama.cpp warns
"tensor overrides to CPU are used with mmap enabled - consider using --load-mode none"). strata:
`strata bench PACK -p P -r R --vram BUDGET -o csv` on a pack made from the same GGUF (`strata
pack M.gguf -o M.pack`), when --pack is given, once per --strata-arms entry (e.g. the defaults and
`--delta backend=fla`, each its own row). Build llama.cpp for the GPU with
benchmarks/llama_cpp.sh build.

A full-size model whose GGUF and pack do not both fit the machine (GLM-4.5-Air Q4_K_M: 70 GB
each, 128 GiB of host memory that also holds llama.cpp's or strata's pinned experts) is read in
two runs: llama.cpp on the GGUF (`--gguf`, no `--pack`), the GGUF removed, then strata on `strata
synth --pack` with the same arguments (the pack `strata pack` makes of that GGUF: synth draws
every tensor from the same seed, tests/packs/test_synth_gguf.py) with `--llama-rows` the first
run's CSV: one CSV and PNG of both.
"""
from __future__ import annotations

import argparse
import csv
import io
import shlex
import subprocess
import sys
from pathlib import Path

from strata.bench.llama_cpp import (bench_rows, buffers_from_log, gguf_sizes,
                                    gpu_mib, fit_ncmoe, ncmoe_for_budget, pinned_host)
from strata.bench.plot import bars
from strata.bench.roofline import bound_rate
from strata.bench.record import commit_of, gpu_name, utc_now, write_csv
from strata.hostmem import host_available
from strata.units import parse_size

ROOT = Path(__file__).resolve().parents[1]


def llama_bench(bin_dir: Path, gguf: Path, P: int, ub: int, ncmoe: int, lm: str, reps: int,
                timeout: float) -> tuple[dict, dict, list[str]]:
    cmd = [str(bin_dir / "llama-bench"), "-m", str(gguf), "-ngl", "99", "-fa", "1", "-n", "0",
           "-p", str(P), "-ub", str(ub), "-b", str(ub), "-ncmoe", str(ncmoe), "-lm", lm,
           "-r", str(reps), "-o", "csv", "-v"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"llama-bench failed ({r.returncode}): {r.stderr[-600:]}")
    return bench_rows(r.stdout)[-1], buffers_from_log(r.stderr), cmd


def run_llama(a, sizes, P: int) -> dict | None:
    """The fastest (-ub, load mode) that fits: for each -ub, N grown under the first load mode
    until llama.cpp's GPU buffers fit the budget, the other modes run at that N (the mode moves
    host memory only)."""
    best, done = None, {}

    def run(ub, n, lm):
        """The bytes llama.cpp logged on the GPU (None: the run failed); a fit is a candidate.
        `-lm none` whose pinned copy would not fit the host's available memory (less
        --host-margin) runs as `-lm mmap` instead, said in a line: a GGUF in /dev/shm and its
        pinned experts both count (GLM-4.5-Air Q4_K_M: 70 GB and ~57 GB of 128 GiB)."""
        nonlocal best
        avail = host_available()
        if lm == "none" and avail is not None and pinned_host(sizes, n) + a.host_margin > avail:
            print(f"[llama] P={P} ub={ub} ncmoe={n}: -lm none would pin "
                  f"{pinned_host(sizes, n) / 1e9:.1f} GB of host memory, "
                  f"{avail / 1e9:.1f} GB available: -lm mmap instead", flush=True)
            lm = "mmap"
        if (ub, n, lm) in done:
            return done[(ub, n, lm)]
        done[(ub, n, lm)] = None
        try:
            row, bufs, cmd = llama_bench(a.bin, a.gguf, P, ub, n, lm, a.reps, a.timeout)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            print(f"[llama] P={P} ub={ub} ncmoe={n} lm={lm}: {str(e)[:200]}", flush=True)
            return None
        mib = gpu_mib(bufs)
        fits = mib * 2**20 <= a.budget
        print(f"[llama] P={P} ub={ub} ncmoe={n} lm={lm}: {float(row['avg_ts']):.0f} tok/s, GPU "
              f"{mib:.0f} MiB ({'fits' if fits else 'over'} the budget)", flush=True)
        if fits or a.ncmoe is not None:
            cand = dict(ts=float(row["avg_ts"]), sd=float(row["stddev_ts"]), ub=ub, ncmoe=n,
                        load_mode=lm, gpu_mib=mib, cmd=" ".join(cmd[1:]), fits=fits)
            if best is None or cand["ts"] > best["ts"]:
                best = cand
        done[(ub, n, lm)] = int(mib * 2**20)
        return done[(ub, n, lm)]

    for ub in a.ub:
        if a.ncmoe is not None:
            n = a.ncmoe if run(ub, a.ncmoe, a.load_mode[0]) is not None else None
        else:
            start = ncmoe_for_budget(sizes, a.budget, P, int(a.compute_margin))
            n = fit_ncmoe(sizes, start, lambda k: run(ub, k, a.load_mode[0]), a.budget, P)
        if n is not None:
            for lm in a.load_mode[1:]:
                run(ub, n, lm)
    return best


BOUND_TERMS = ("bound_tokens_per_s", "pcie_bound_tokens_per_s", "compute_floor_tokens_per_s",
               "bytes_streamed",
               "h2d_gbps", "floor_experts_s", "floor_attention_s", "floor_linear_s",
               "floor_dense_s")


def arm_label(extra: str) -> str:
    """A strata arm's row label: `strata`, or its extra flags in brackets."""
    return f"strata[{extra.strip()}]" if extra.strip() else "strata"


def run_strata(a, P: int, extra: str = "") -> dict | None:
    cmd = [sys.executable, "-m", "strata.cli", "bench", str(a.pack), "-p", str(P), "-r",
           str(a.reps), "--vram", a.budget_text, "-o", "csv", *shlex.split(extra)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout, cwd=ROOT)
    if r.returncode != 0:     # a signal leaves no line of its own: say which, and the last
        how = (f"killed by signal {-r.returncode}"
               + (" (SIGKILL: the OOM killer?)" if r.returncode == -9 else "")
               if r.returncode < 0 else f"exit {r.returncode}")
        print(f"[{arm_label(extra)}] P={P}: failed, {how}: "
              f"{r.stderr.strip().splitlines()[-1:]}", flush=True)
        return None
    rows = [x for x in csv.DictReader(io.StringIO(r.stdout)) if x.get("n_tokens") == str(P)]
    if not rows:
        return None
    x = rows[-1]
    print(f"[{arm_label(extra)}] P={P}: {float(x['tokens_per_s']):.0f} tok/s (of bound "
          f"{x['of_bound']})", flush=True)
    return dict(ts=float(x["tokens_per_s"]), sd=float(x["tokens_per_s_sd"] or 0),
                bound=x.get("of_bound"), cmd=" ".join(cmd[2:]),
                # the bound's own terms, so a row says which one it is measured against
                parts={k: x.get(k) for k in BOUND_TERMS if x.get(k) not in (None, "")})


def read_llama_rows(path: Path, gpu: str, budget: str) -> list[dict]:
    """llama.cpp's rows of an earlier llama_side CSV, refused (one line) when that run measured
    another GPU or budget, or measured no llama.cpp row."""
    from strata.bench.record import read_csv
    from strata.errors import StrataError
    try:
        rows = [r for r in read_csv(path) if r["label"] == "llama.cpp"]
    except (OSError, KeyError, ValueError, csv.Error) as e:
        raise StrataError(f"--llama-rows {path}: not a llama_side CSV ({e})") from None
    if not rows:
        raise StrataError(f"--llama-rows {path}: no llama.cpp row in it; run llama_side.py "
                          f"--gguf first")
    for r in rows:
        if not {"P", "gguf", "budget"} <= set(r["config"]):
            raise StrataError(f"--llama-rows {path}: a llama.cpp row without its prompt, GGUF "
                              f"or budget; give a CSV llama_side.py --gguf wrote")
        if r["gpu"] != gpu or r["config"].get("budget") != budget:
            raise StrataError(f"--llama-rows {path}: measured on {r['gpu']} under "
                              f"{r['config'].get('budget')}, this run is {gpu} under {budget}")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", type=Path, help="the GGUF llama.cpp reads")
    ap.add_argument("--llama-rows", type=Path,
                    help="instead of --gguf: llama.cpp's rows from an earlier run's CSV on the "
                         "GGUF this --pack was synthesized beside (see the module doc)")
    ap.add_argument("--bin", type=Path, help="the folder holding llama-bench (with --gguf)")
    ap.add_argument("--pack", type=Path, help="strata's pack of the same GGUF (strata bench)")
    ap.add_argument("--budget", default="12GiB")
    ap.add_argument("--prompts", default="8192,32768")
    ap.add_argument("--llama-max", type=int, default=None,
                    help="the longest prompt llama.cpp reads (longer ones: strata alone, e.g. "
                         "131K / 262K where llama-bench's reps would pass a call's time)")
    ap.add_argument("--ub", default="2048,8192", help="llama.cpp -ub (= -b) values to try")
    ap.add_argument("--ncmoe", type=int, help="pin -ncmoe (else fitted to the budget)")
    ap.add_argument("--load-mode", default="none,mmap",
                    help="llama.cpp -lm values to try (none: its host-held experts pinned)")
    ap.add_argument("--host-margin", default="4GiB",
                    help="host memory left free beside llama.cpp's pinned experts (-lm none)")
    ap.add_argument("--compute-margin", default="1.5GiB",
                    help="the first fit's allowance for llama.cpp's compute buffer")
    ap.add_argument("--strata-arms", default="",
                    help="strata's arms, ';'-separated extra `strata bench` flags (an empty one "
                         "is the defaults), e.g. ';--delta backend=fla': each its own row")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--out", type=Path, default=ROOT / "experiments" / "results")
    ap.add_argument("--replot", type=Path, metavar="CSV",
                    help="redraw a llama_side CSV's PNG beside it (nothing runs)")
    a = ap.parse_args(argv)
    if a.replot is not None:
        from strata.bench.record import read_csv
        try:
            rows = read_csv(a.replot)
            name, budget = rows[0]["config"]["gguf"], rows[0]["config"]["budget"]
        except (OSError, KeyError, IndexError, TypeError, ValueError, csv.Error) as e:
            ap.error(f"--replot {a.replot}: not a llama_side CSV ({e!r})")
        print(f"wrote {plot(rows, a.replot.with_suffix('.png'), name, budget)}")
        return 0
    a.budget_text, a.budget = a.budget, parse_size(a.budget)
    a.compute_margin = parse_size(a.compute_margin)
    a.host_margin = parse_size(a.host_margin)
    a.ub = [int(u) for u in a.ub.split(",")]
    a.load_mode = [m for m in a.load_mode.split(",") if m]
    for arm in a.strata_arms.split(";"):
        try:
            shlex.split(arm)
        except ValueError as e:     # an unclosed quote: one line, not a traceback mid-run
            ap.error(f"--strata-arms: {arm!r}: {e}")
    if a.gguf is not None and a.llama_rows is not None:
        ap.error("give --gguf (llama.cpp runs on it) or --llama-rows (its rows from an earlier "
                 "run), not both")
    if a.gguf is None and a.llama_rows is None and a.pack is None:
        ap.error("nothing to run: give --gguf (llama.cpp), --pack (strata) or both")
    if a.gguf is not None and a.bin is None:
        ap.error("--gguf runs llama-bench: give --bin, the folder holding it")
    if a.llama_rows is not None and a.pack is None:
        ap.error("--llama-rows adds strata's rows to llama.cpp's: give --pack")
    gpu, commit = gpu_name(), commit_of(ROOT)
    earlier = read_llama_rows(a.llama_rows, gpu, a.budget_text) if a.llama_rows else []
    # strata alone (llama.cpp's step of a two-step read measured nothing): named by its pack
    gguf_name = (earlier[0]["config"]["gguf"] if earlier else a.gguf.name if a.gguf
                 else a.pack.name)
    sizes = gguf_sizes(a.gguf) if a.gguf else None
    tag = f"{Path(gguf_name).stem}-{a.budget_text}-{gpu.replace(' ', '_')}-{commit}"
    rows = []

    def add(label, P, fig, val, unit, cfg):
        rows.append(dict(experiment="llama_side", label=label, gpu=gpu, commit=commit,
                         timestamp=utc_now(), torch="", triton="", config=dict(cfg, P=P),
                         figure=fig, value=val, unit=unit, bound="", bound_value=None,
                         gate="", timer="llama-bench" if label == "llama.cpp" else
                         "strata bench"))
    for P in (int(p) for p in a.prompts.split(",")):
        rows += [r for r in earlier if int(r["config"]["P"]) == P]
        got = (run_llama(a, sizes, P) if sizes and (a.llama_max is None or P <= a.llama_max)
               else None)
        if got:
            cfg = dict(gguf=a.gguf.name, budget=a.budget_text, ub=got["ub"],
                       ncmoe=got["ncmoe"], load_mode=got["load_mode"], fits=got["fits"],
                       cmd=got["cmd"])
            add("llama.cpp", P, "tokens/s", got["ts"], "tok/s", cfg)
            add("llama.cpp", P, "GPU MiB", got["gpu_mib"], "MiB", cfg)
        for extra in (a.strata_arms.split(";") if a.pack else []):
            s = run_strata(a, P, extra)
            if s:
                add(arm_label(extra), P, "tokens/s", s["ts"], "tok/s",
                    dict(gguf=gguf_name, budget=a.budget_text, cmd=s["cmd"],
                         of_bound=s["bound"], **s["parts"]))
        if rows:   # each prompt's rows on disk as soon as measured: a call cut short keeps them
            write_csv(rows, a.out / f"llama_side-{tag}.csv")
    if not rows:
        print("llama_side: nothing measured", file=sys.stderr)
        return 1
    path = write_csv(rows, a.out / f"llama_side-{tag}.csv")
    plot(rows, a.out / f"llama_side-{tag}.png", gguf_name, a.budget_text)
    print(f"wrote {path}")
    return 0


def bound_rows(rows: list[dict]) -> list[dict]:
    """Each strata row's bound, measured in its own run (bench's `bound_tokens_per_s`), as a
    row of its own ("<label>'s bound"), so the plot shows every figure beside its bound. A CSV
    from before bench wrote that column has its two terms: roofline.bound_rate takes them."""
    out = []
    for r in rows:
        c = r["config"]
        terms = [float(c[k]) for k in ("bound_tokens_per_s",)
                 if c.get(k) not in (None, "")] or [
            float(c[k]) for k in ("pcie_bound_tokens_per_s", "compute_floor_tokens_per_s")
            if c.get(k) not in (None, "")]
        bound = bound_rate(*terms)
        if r["label"].startswith("strata") and r["figure"] == "tokens/s" and bound:
            out.append(dict(r, label=f"{r['label']}'s bound", value=bound))
    return out


def plot(rows: list[dict], png: Path, gguf_name: str, budget: str) -> Path:
    """tokens/s per prompt length: llama.cpp's, strata's and strata's bound beside it."""
    speed = [r for r in rows if r["figure"] == "tokens/s"]
    # a two-step read's rows carry two commits: each tool's
    tools = dict.fromkeys((r["label"].split("[")[0], r["commit"]) for r in rows)
    one = len({c for _, c in tools}) == 1
    commits = rows[0]["commit"] if one else ", ".join(f"{t} {c}" for t, c in tools)
    return bars(speed + bound_rows(speed), png, x_keys=["P"],
                title=f"{gguf_name} under {budget}: llama.cpp vs strata ({rows[0]['gpu']}, "
                      f"{commits})")


if __name__ == "__main__":
    from strata.errors import StrataError
    try:
        raise SystemExit(main())
    except StrataError as e:
        print(f"llama_side: {e}", file=sys.stderr)
        raise SystemExit(2) from None
