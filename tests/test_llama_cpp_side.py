"""strata.bench.llama_cpp: what llama.cpp's GPU part holds under -ncmoe, read from GGUF files
llama.cpp's own converter wrote (tests/models/data/llama_cpp), the fit to a budget, and its
logs and llama-bench CSV read back (samples in llama.cpp's formats)."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from strata.bench.llama_cpp import (GgufSizes, bench_rows, buffers_from_log, gguf_sizes,
                                    fit_ncmoe, gpu_mib, ncmoe_after,
                                    ncmoe_for_budget)
from strata.errors import StrataError

GGUF = Path(__file__).resolve().parent / "models" / "data" / "llama_cpp"


@pytest.mark.parametrize("name", ["qwen3moe-q8_0", "gpt-oss-q8_0", "deepseek2-q8_0",
                                  "glm4moe-q8_0"])
def test_sizes_add_up_to_the_files_tensors(name):
    """Experts plus the rest are every tensor's bytes; the experts are the layers' *_exps
    tensors (dense-first layers hold none); the file is at least its tensors."""
    import gguf
    path = GGUF / f"{name}.gguf"
    s = gguf_sizes(path)
    tensors = gguf.GGUFReader(str(path)).tensors
    assert s.rest + sum(s.experts) == sum(int(t.n_bytes) for t in tensors)
    for layer, nbytes in enumerate(s.experts):
        assert nbytes == sum(int(t.n_bytes) for t in tensors
                             if t.name.startswith(f"blk.{layer}.ffn_") and "_exps" in t.name)
    assert any(s.experts) and s.kv_row > 0 and path.stat().st_size > s.rest + sum(s.experts)


@given(experts=st.lists(st.integers(0, 1000), min_size=1, max_size=12),
       rest=st.integers(0, 5000), kv=st.integers(0, 50), ctx=st.integers(0, 64),
       compute=st.integers(0, 2000), budget=st.integers(0, 20000))
def test_the_fit_is_the_smallest_n_that_fits(experts, rest, kv, ctx, compute, budget):
    s = GgufSizes(len(experts), tuple(experts), rest, kv)
    fits = [n for n in range(len(experts) + 1) if s.gpu_part(n, ctx) + compute <= budget]
    if not fits:
        with pytest.raises(StrataError) as e:
            ncmoe_for_budget(s, budget, ctx, compute)
        assert "\n" not in str(e.value)
        return
    n = ncmoe_for_budget(s, budget, ctx, compute)
    assert n == fits[0]
    # every N past it fits too: keeping more experts in host memory never adds to the GPU part
    assert fits == list(range(n, len(experts) + 1))


@given(experts=st.lists(st.integers(0, 1000), min_size=1, max_size=12),
       rest=st.integers(0, 5000), kv=st.integers(0, 50), ctx=st.integers(0, 64),
       compute=st.integers(0, 3000), budget=st.integers(0, 20000), data=st.data())
def test_after_an_over_budget_run_the_next_n_is_the_smallest_that_fits(
        experts, rest, kv, ctx, compute, budget, data):
    """A run at n that llama.cpp reports over the budget (its buffers: the file's GPU part plus
    a compute buffer the estimate did not know) moves to the smallest N that fits with that
    same compute buffer, never past it; where none does, one step (as before the jump)."""
    s = GgufSizes(len(experts), tuple(experts), rest, kv)
    seen_at = lambda n: s.gpu_part(n, ctx) + compute         # noqa: E731  what llama.cpp logs
    over = [n for n in range(len(experts)) if seen_at(n) > budget]
    if not over:
        return
    n = data.draw(st.sampled_from(over))
    m = ncmoe_after(s, n, seen_at(n), budget, ctx)
    fits = [k for k in range(n + 1, len(experts) + 1) if seen_at(k) <= budget]
    assert m == (fits[0] if fits else n + 1)


@given(experts=st.lists(st.integers(1, 1000), min_size=1, max_size=12),
       rest=st.integers(0, 5000), compute=st.integers(0, 3000), shrink=st.integers(0, 300),
       budget=st.integers(0, 20000), data=st.data())
def test_fit_ncmoe_finds_the_smallest_fit_from_the_start(experts, rest, compute, shrink, budget,
                                                         data):
    """fit_ncmoe against a stand-in llama.cpp whose compute buffer shrinks by `shrink` bytes a
    layer of experts in host memory (0: the file's sizes tell the whole drop): it returns the
    smallest N >= start that fits (None where none does), never runs an N twice, and with the
    sizes exact runs at most two Ns."""
    s = GgufSizes(len(experts), tuple(experts), rest, 0)
    seen_at = lambda n: s.gpu_part(n, 0) + max(0, compute - shrink * n)    # noqa: E731
    start = data.draw(st.integers(0, len(experts)))
    ran = []

    def run_at(n):
        ran.append(n)
        return seen_at(n)
    got = fit_ncmoe(s, start, run_at, budget, 0)
    fits = [k for k in range(start, len(experts) + 1) if seen_at(k) <= budget]
    assert got == (fits[0] if fits else None)
    assert len(ran) == len(set(ran))
    if shrink == 0 and fits:
        assert len(ran) <= 2


def test_fit_ncmoe_stops_at_a_failed_run():
    s = GgufSizes(4, (100,) * 4, 0, 0)
    assert fit_ncmoe(s, 0, lambda n: None, 50, 0) is None
    assert fit_ncmoe(s, 0, lambda n: 500 - 100 * n if n < 3 else None, 250, 0) is None


def test_the_recorded_fit_is_one_jump():
    """qwen3-30b-a3b Q8_0 at -ub 8192 (stop 56, ppl_side): -ncmoe 37 logged 15,342 MiB against
    a 12 GiB budget, each layer's experts 612 MiB; 42 was the first to fit (12,282 MiB)."""
    layer = 612 * 2**20
    s = GgufSizes(48, (layer,) * 48, 0, 0)
    assert ncmoe_after(s, 37, 15342 * 2**20, 12 * 2**30, 0) == 42


def test_buffers_and_bench_csv_read_back():
    log = """llama_model_load: ...
load_tensors:        CUDA0 model buffer size =  9812.34 MiB
load_tensors:   CPU_Mapped model buffer size = 21000.00 MiB
llama_kv_cache:      CUDA0 KV buffer size =   768.00 MiB
llama_context:      CUDA0 compute buffer size =  1540.50 MiB
llama_context:  CUDA_Host compute buffer size =    80.06 MiB
llama_context:      CUDA0 compute buffer size =  1600.00 MiB
"""
    b = buffers_from_log(log)
    assert b["CUDA0 model"] == 9812.34 and b["CUDA0 compute"] == 1600.0
    assert gpu_mib(b) == pytest.approx(9812.34 + 768.0 + 1600.0)
    text = ("build_commit,model_type,n_batch,n_ubatch,n_prompt,n_gen,avg_ts,stddev_ts\n"
            '"0c1e570","qwen3moe 30B.A3B Q8_0",8192,8192,8192,0,6559.1,12.3\n')
    rows = bench_rows(text)
    assert rows[0]["avg_ts"] == "6559.1" and rows[0]["n_prompt"] == "8192"
    with pytest.raises(StrataError):
        bench_rows("| model | size |\n")


def test_not_a_gguf_is_one_line(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"not a gguf at all")
    with pytest.raises(StrataError) as e:
        gguf_sizes(bad)
    assert "\n" not in str(e.value)


def test_a_gguf_without_the_model_keys_is_one_line(tmp_path):
    import gguf
    import numpy as np
    path = tmp_path / "bare.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("x", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(StrataError, match="block_count") as e:
        gguf_sizes(path)
    assert "\n" not in str(e.value)


FAKE_BENCH = r'''#!/usr/bin/env python3
"""llama-bench's interface: GPU model buffer 1500 - 400 N MiB under -ncmoe N; -lm none twice
as fast as mmap (its host-held experts pinned); each call's flags appended to CALLS."""
import os, sys
a = sys.argv[1:]
arg = lambda f: a[a.index(f) + 1]
n, lm, P = int(arg("-ncmoe")), arg("-lm"), int(arg("-p"))
with open(os.environ["CALLS"], "a") as f:
    f.write(f"{arg('-ub')} {n} {lm}\n")
print(f"load_tensors:        CUDA0 model buffer size = {1500 - 400 * n:.2f} MiB", file=sys.stderr)
print("build_commit,n_ubatch,n_prompt,n_gen,avg_ts,stddev_ts")
print(f"x,{arg('-ub')},{P},0,{(2000 if lm == 'none' else 1000) + int(arg('-ub'))},1.0")
'''


def _side_with_fake_bench(tmp_path, monkeypatch):
    """experiments/llama_side.py loaded, FAKE_BENCH as llama-bench in tmp_path, and the file
    its calls are appended to."""
    from tests.scripts import load_script
    bench = tmp_path / "llama-bench"
    bench.write_text(FAKE_BENCH)
    bench.chmod(0o755)
    calls = tmp_path / "calls.txt"
    monkeypatch.setenv("CALLS", str(calls))
    return load_script("experiments/llama_side.py"), calls


def test_the_side_fits_ncmoe_then_tries_each_load_mode(tmp_path, monkeypatch):
    """experiments/llama_side.py against a stand-in llama-bench: for each -ub, -ncmoe grows from
    the size-based fit until llama.cpp's reported GPU buffers fit the budget (under the first
    load mode), the other load mode runs at that N only, and the row kept is the fastest that
    fits, with its -ub, N and load mode in the row's config and command."""
    import csv
    import json
    side, calls = _side_with_fake_bench(tmp_path, monkeypatch)
    out = tmp_path / "out"
    assert side.main(["--gguf", str(GGUF / "gpt-oss-q8_0.gguf"), "--bin", str(tmp_path),
                      "--budget", "1GiB", "--prompts", "64", "--ub", "32,64", "--reps", "1",
                      "--compute-margin", "0", "--out", str(out)]) == 0
    # 1500, 1100 MiB are over 1 GiB; 700 at N = 2 fits: then mmap at N = 2
    assert calls.read_text().split("\n")[:-1] == [
        "32 0 none", "32 1 none", "32 2 none", "32 2 mmap",
        "64 0 none", "64 1 none", "64 2 none", "64 2 mmap"]
    rows = list(csv.DictReader(open(next(out.glob("llama_side-*.csv")))))
    speed = next(r for r in rows if r["figure"] == "tokens/s")
    cfg = json.loads(speed["config"])
    assert float(speed["value"]) == 2064 and (cfg["ub"], cfg["ncmoe"], cfg["load_mode"]) == \
        (64, 2, "none") and "-ncmoe 2 -lm none" in cfg["cmd"] and cfg["fits"]


def test_prompts_past_llama_max_are_strata_alone(tmp_path, monkeypatch):
    """--llama-max: llama-bench reads the prompts up to it only (a longer one is strata's
    alone); with no --pack and every prompt past it, nothing is measured: exit 1, no CSV."""
    side, calls = _side_with_fake_bench(tmp_path, monkeypatch)
    base = ["--gguf", str(GGUF / "gpt-oss-q8_0.gguf"), "--bin", str(tmp_path), "--budget",
            "1GiB", "--ub", "32", "--reps", "1", "--compute-margin", "0", "--ncmoe", "2"]
    out = tmp_path / "out"
    assert side.main(base + ["--prompts", "64,128", "--llama-max", "64", "--out", str(out)]) == 0
    assert {line.split()[0] for line in calls.read_text().split("\n")[:-1]} == {"32"}
    assert len(calls.read_text().split("\n")[:-1]) == 2       # P 64 only: none, then mmap
    calls.unlink()
    assert side.main(base + ["--prompts", "128", "--llama-max", "64", "--out",
                             str(tmp_path / "none")]) == 1
    assert not calls.exists() and not (tmp_path / "none").exists()


def test_each_strata_arm_is_its_own_row(tmp_path, monkeypatch):
    """--strata-arms: `strata bench` once per ';'-separated arm, its extra flags appended to the
    command, each arm's tokens/s a row labelled by them (the empty arm is plain `strata`)."""
    import csv
    import subprocess
    import types
    side, calls = _side_with_fake_bench(tmp_path, monkeypatch)
    seen, real_run = [], subprocess.run

    def fake_run(cmd, **kw):
        if "strata.cli" not in cmd:
            return real_run(cmd, **kw)
        seen.append(cmd)
        ts = 100 if "--delta" in cmd else 50
        return types.SimpleNamespace(returncode=0, stderr="", stdout=(
            "n_tokens,tokens_per_s,tokens_per_s_sd,of_bound,pcie_bound_tokens_per_s,h2d_gbps\n"
            f"64,{ts},1,0.9,{ts * 2},50.5\n"))
    monkeypatch.setattr(side.subprocess, "run", fake_run)
    out = tmp_path / "out"
    assert side.main(["--gguf", str(GGUF / "gpt-oss-q8_0.gguf"), "--bin", str(tmp_path),
                      "--pack", str(tmp_path / "x.pack"), "--budget", "1GiB", "--prompts", "64",
                      "--llama-max", "0", "--strata-arms", ";--delta backend=fla",
                      "--reps", "1", "--out", str(out)]) == 0
    assert [c[-2:] for c in seen] == [["-o", "csv"], ["--delta", "backend=fla"]]
    got = list(csv.DictReader(open(next(out.glob("llama_side-*.csv")))))
    rows = {r["label"]: float(r["value"]) for r in got}
    assert rows == {"strata": 50.0, "strata[--delta backend=fla]": 100.0}
    import json
    cfgs = {r["label"]: json.loads(r["config"]) for r in got}   # the bound's own terms kept
    assert cfgs["strata"]["pcie_bound_tokens_per_s"] == "100"
    assert cfgs["strata"]["h2d_gbps"] == "50.5"


def test_a_strata_arm_that_does_not_split_is_refused(tmp_path, capsys):
    """--strata-arms with an unclosed quote: exit 2 before anything runs, not a traceback."""
    import pytest
    side, calls = _side_with_fake_bench(tmp_path, pytest.MonkeyPatch())
    with pytest.raises(SystemExit) as e:
        side.main(["--gguf", str(GGUF / "gpt-oss-q8_0.gguf"), "--bin", str(tmp_path),
                   "--strata-arms", ';--delta "backend=fla', "--out", str(tmp_path / "o")])
    assert e.value.code == 2 and "--strata-arms" in capsys.readouterr().err
    assert not calls.exists()


def test_llama_rows_from_an_earlier_run_join_strata_rows(tmp_path, monkeypatch):
    """A GGUF and pack too big to share the machine: llama.cpp's run on the GGUF alone, then
    --llama-rows that CSV with --pack (no GGUF): one CSV holding the first run's llama.cpp rows
    and strata's; rows from another GPU or budget, or a CSV without llama.cpp rows, are refused
    in one line; --gguf and --llama-rows together are a usage error, and so is neither of them
    without --pack (--pack alone: strata's rows, as when llama.cpp's step measured nothing)."""
    import subprocess
    import types

    import pytest

    from strata.bench.record import read_csv
    from strata.errors import StrataError
    side, calls = _side_with_fake_bench(tmp_path, monkeypatch)
    first = tmp_path / "first"
    common = ["--budget", "1GiB", "--prompts", "64", "--ub", "32",
              "--reps", "1", "--compute-margin", "0", "--ncmoe", "2"]
    assert side.main(["--gguf", str(GGUF / "gpt-oss-q8_0.gguf"), "--bin", str(tmp_path),
                      *common, "--out", str(first)]) == 0
    llama_csv = next(first.glob("llama_side-*.csv"))
    real_run = subprocess.run

    def fake_run(cmd, **kw):
        if "strata.cli" not in cmd:
            return real_run(cmd, **kw)
        return types.SimpleNamespace(returncode=0, stderr="", stdout=(
            "n_tokens,tokens_per_s,tokens_per_s_sd,of_bound\n64,5000,1,0.9\n"))
    monkeypatch.setattr(side.subprocess, "run", fake_run)
    n_calls = len(calls.read_text().splitlines())
    out = tmp_path / "out"
    assert side.main(["--llama-rows", str(llama_csv), "--pack", str(tmp_path / "x.pack"),
                      *common, "--out", str(out)]) == 0
    assert len(calls.read_text().splitlines()) == n_calls     # llama-bench did not run again
    got = read_csv(next(out.glob("llama_side-*.csv")))
    speed = {r["label"]: r["value"] for r in got if r["figure"] == "tokens/s"}
    assert speed == {"llama.cpp": 2032.0, "strata": 5000.0}
    assert {r["config"]["gguf"] for r in got} == {"gpt-oss-q8_0.gguf"}
    assert (out / next(out.glob("llama_side-*.csv")).name.replace(".csv", ".png")).exists()
    with pytest.raises(StrataError, match="under 1GiB, this run is .* under 2GiB"):
        side.main(["--llama-rows", str(llama_csv), "--pack", str(tmp_path / "x.pack"),
                   *[c if c != "1GiB" else "2GiB" for c in common], "--out", str(out)])
    with pytest.raises(StrataError, match="no llama.cpp row"):
        side.main(["--llama-rows", str(_strata_only(out, tmp_path)), "--pack",
                   str(tmp_path / "x.pack"), *common, "--out", str(out)])
    with pytest.raises(SystemExit) as e:
        side.main(["--gguf", str(GGUF / "gpt-oss-q8_0.gguf"), "--llama-rows", str(llama_csv),
                   *common, "--out", str(out)])
    assert e.value.code == 2
    # llama.cpp's step measured nothing: --pack alone gives strata's rows, named by the pack
    alone = tmp_path / "alone"
    assert side.main(["--pack", str(tmp_path / "x.pack"), *common, "--out", str(alone)]) == 0
    got = read_csv(next(alone.glob("llama_side-x-1GiB-*.csv")))
    assert {r["label"] for r in got} == {"strata"}
    assert {r["config"]["gguf"] for r in got} == {"x.pack"}
    with pytest.raises(SystemExit) as e:
        side.main([*common, "--out", str(out)])
    assert e.value.code == 2


def _strata_only(out, tmp_path):
    """A copy of out's CSV without its llama.cpp rows."""
    from strata.bench.record import read_csv, write_csv
    rows = [r for r in read_csv(next(out.glob("llama_side-*.csv"))) if r["label"] != "llama.cpp"]
    return write_csv(rows, tmp_path / "strata_only.csv")


def test_lm_none_past_the_host_runs_mapped(tmp_path, monkeypatch):
    """-lm none whose pinned experts (the first N layers', by the file's sizes) would pass the
    host's available memory runs as -lm mmap, once (no second mmap run at the same N); with room
    it runs as asked."""
    from strata.bench.llama_cpp import gguf_sizes, pinned_host
    side, calls = _side_with_fake_bench(tmp_path, monkeypatch)
    g = GGUF / "gpt-oss-q8_0.gguf"
    need = pinned_host(gguf_sizes(g), 2)
    assert need > 0
    args = ["--gguf", str(g), "--bin", str(tmp_path), "--budget", "1GiB", "--prompts", "64",
            "--ub", "32", "--reps", "1", "--ncmoe", "2", "--host-margin", "0"]
    monkeypatch.setattr(side, "host_available", lambda: need - 1)
    assert side.main(args + ["--out", str(tmp_path / "a")]) == 0
    assert calls.read_text().split("\n")[:-1] == ["32 2 mmap"]
    calls.unlink()
    monkeypatch.setattr(side, "host_available", lambda: need)
    assert side.main(args + ["--out", str(tmp_path / "b")]) == 0
    assert calls.read_text().split("\n")[:-1] == ["32 2 none", "32 2 mmap"]


def test_plot_draws_strata_beside_its_bound_and_replot_redraws(tmp_path, capsys):
    """Each strata row's bound (min of its PCIe bound and compute floor, from its own run) is a
    bar beside it; --replot redraws a CSV's PNG from the CSV alone; a file that is not a
    llama_side CSV is one line and exit 2."""
    import pytest

    from strata.bench.record import write_csv
    from tests.scripts import load_script
    side = load_script("experiments/llama_side.py")
    base = dict(experiment="llama_side", gpu="G", commit="c", timestamp="t", torch="",
                triton="", figure="tokens/s", unit="tok/s", bound="", bound_value=None, gate="",
                timer="")
    cfg = dict(gguf="m.gguf", budget="24GiB")
    rows = [dict(base, label="llama.cpp", value=900.0, config=dict(cfg, P=8192)),
            dict(base, label="strata", value=6000.0, config=dict(
                cfg, P=8192, pcie_bound_tokens_per_s="6800", compute_floor_tokens_per_s="18000")),
            dict(base, label="strata", value=8000.0, config=dict(
                cfg, P=32768, pcie_bound_tokens_per_s="25000",
                compute_floor_tokens_per_s="10300")),
            # bench's own bound column wins over its terms where the row has it
            dict(base, label="strata", value=3000.0, config=dict(
                cfg, P=131072, bound_tokens_per_s="3600", pcie_bound_tokens_per_s="9000",
                compute_floor_tokens_per_s="4000"))]
    got = side.bound_rows(rows)
    assert [(r["label"], r["value"], r["config"]["P"]) for r in got] == [
        ("strata's bound", 6800.0, 8192), ("strata's bound", 10300.0, 32768),
        ("strata's bound", 3600.0, 131072)]
    csv_path = write_csv(rows, tmp_path / "llama_side-m-24GiB-G-c.csv")
    assert side.main(["--replot", str(csv_path)]) == 0
    assert csv_path.with_suffix(".png").stat().st_size > 0
    bad = tmp_path / "bad.csv"
    bad.write_text("not,a\nllama_side,csv\n")
    with pytest.raises(SystemExit) as e:
        side.main(["--replot", str(bad)])
    assert e.value.code == 2 and "not a llama_side CSV" in capsys.readouterr().err
