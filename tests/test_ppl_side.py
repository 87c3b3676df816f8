"""experiments/ppl_side.py: bad input is one line and exit 2 before anything runs; -ncmoe grows
while the tool's logged GPU buffers pass the budget, a run over it killed as soon as its context
is made (a stand-in llama-perplexity that logs what the real one does); and, where a CPU build of
llama-perplexity is found (STRATA_LLAMA_BIN, or /tmp/ppl), a smoke run on a tiny synthesized
Q8_0 GGUF and its pack: the CSV and PNG, both PPLs finite and within 1e-3 of each other, tokens/s
of both above 0.

The smoke's bound is issue 39 item 4's: strata's PPL within 1e-3 relative of llama-perplexity's
(tests/instruments/test_llama_perplexity.py holds it on llama.cpp's own files, measured 1.5e-4
for Q8_0 with an f32 KV cache and no flash attention). The model's dense weights are F32 here, so
the only roundings that part the two are llama.cpp's: q8_0 activations before each Q8_0 expert
product and, in this script's configuration (-fa on, f16 KV cache), Q, K and V rounded to f16
(unit roundoff 2^-11 = 4.9e-4) in its CPU flash attention. Measured on this model and text:
6.0e-4 as run, 2.5e-4 with -ctk f32 -ctv f32 -fa off (checked too). With BF16 dense weights
llama.cpp rounds those products' activations to bf16 (2^-8) and the gap was 2.4e-3: not used."""
from __future__ import annotations

import importlib.util
import math
import os
import time
from pathlib import Path

import pytest

from strata.bench import read_csv
from strata.cli import main as strata_main

ROOT = Path(__file__).resolve().parents[1]
CONVERTED = ROOT / "tests" / "models" / "data" / "llama_cpp" / "qwen3moe-q8_0.gguf"
KNOWN_BINS = (Path("/tmp/ppl"), Path("/tmp/ppl/lcp-build/bin"))
REL = 1e-3            # issue 39 item 4


def _script():
    spec = importlib.util.spec_from_file_location("ppl_side", ROOT / "experiments" / "ppl_side.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _bin() -> Path | None:
    for d in (os.environ.get("STRATA_LLAMA_BIN"), *KNOWN_BINS):
        if d and (Path(d) / "llama-perplexity").is_file():
            return Path(d)
    return None


def _fake_bin(tmp_path, body: str = "exit 1") -> Path:
    b = tmp_path / "bin"
    b.mkdir()
    (b / "llama-perplexity").write_text("#!/bin/sh\n" + body + "\n")
    (b / "llama-perplexity").chmod(0o755)
    return b


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny qwen3moe: Q8_0 experts, F32 dense weights, as a GGUF and its pack."""
    d = tmp_path_factory.mktemp("ppl_side")
    g, p = d / "tiny.gguf", d / "tiny.pack"
    assert strata_main(["synth", "--preset", "tiny-qwen3moe", "--quant", "Q8_0",
                        "--dense-type", "F32", "-o", str(g)]) == 0
    assert strata_main(["pack", str(g), "-o", str(p)]) == 0
    return g, p


@pytest.mark.parametrize("case", ["no binary", "no gguf", "not a gguf", "no pack",
                                  "budget too small", "bad budget", "too few tokens", "odd ctx"])
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, case):
    bin_dir, gguf, pack, budget = _fake_bin(tmp_path), CONVERTED, CONVERTED, "1TiB"
    more = []
    if case == "no binary":
        bin_dir = tmp_path / "empty"
    elif case == "no gguf":
        gguf = tmp_path / "missing.gguf"
    elif case == "not a gguf":
        gguf = tmp_path / "x.gguf"
        gguf.write_bytes(b"not a gguf")
    elif case == "no pack":
        pack = tmp_path / "missing.pack"
    elif case == "budget too small":
        budget = "1KiB"
    elif case == "bad budget":
        budget = "twelve"
    elif case == "too few tokens":
        more = ["--tokens", "100", "--ctx", "64"]
    else:
        more = ["--ctx", "63"]
    rc = _script().main(["--gguf", str(gguf), "--pack", str(pack), "--bin", str(bin_dir),
                         "--budget", budget, "--out", str(tmp_path / "out"), *more])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("ppl_side: ") and "\n" not in err, err
    assert not (tmp_path / "out").exists()     # refused before anything ran


# a stand-in llama-perplexity: GPU buffers of (2 - N) * 1000 + 600 MiB under -ncmoe N, logged
# as the tool logs them; a run that is not killed at its context reads for 30 s; with LOSE_ONCE
# set, its first run that reads exits 0 without its last lines (llama.cpp's logger at exit); with
# LOSE_PERF set, every run loses only its perf line (after its final PPL)
_STANDIN = r"""n=0; while [ $# -gt 0 ]; do [ "$1" = -ncmoe ] && n=$2; shift; done
echo "load_tensors:        CUDA0 model buffer size = $(( (2 - n) * 1000 + 400 )).00 MiB"
echo "llama_kv_cache:        CUDA0 KV buffer size = 100.00 MiB"
echo "sched_reserve:      CUDA0 compute buffer size = 100.00 MiB"
echo "perplexity: tokenizing the input .."
[ "$n" -lt "${FITS_AT:-2}" ] && exec sleep 30
echo "perplexity: calculating perplexity over 7 chunks, n_ctx=64, batch_size=256, n_seq=4"
if [ -n "${LOSE_ONCE:-}" ] && [ ! -f "$LOSE_ONCE" ]; then touch "$LOSE_ONCE"; exit 0; fi
echo "Final estimate: PPL = 123.4567 +/- 1.23456"
[ -n "${LOSE_PERF:-}" ] && exit 0
echo "llama_perf_context_print: prompt eval time =     100.00 ms /   448 tokens (    0.22 ms per token,  4480.00 tokens per second)"
"""


def _strata_stub(a, text):
    return dict(ppl=123.45, ppl_err=1.2, windows=7, reader="stub", tokens_per_s=9000.0,
                wall_s=1.0, cmd="strata.cli perplexity (stub)")


def test_ncmoe_grows_until_the_logged_buffers_fit(tmp_path, tiny, monkeypatch, capsys):
    gguf, pack = tiny
    mod = _script()
    monkeypatch.setattr(mod, "run_strata", _strata_stub)
    t0 = time.perf_counter()
    rc = mod.main(["--gguf", str(gguf), "--pack", str(pack), "--bin",
                   str(_fake_bin(tmp_path, _STANDIN)), "--budget", "700MiB", "--tokens", "500",
                   "--ctx", "64", "--ub", "256", "--compute-margin", "0", "--out",
                   str(tmp_path / "out")])
    assert rc == 0, capsys.readouterr().err
    assert time.perf_counter() - t0 < 25          # the runs over the budget were killed
    out = capsys.readouterr().out
    for n, mib, verdict in ((0, 2600, "over"), (1, 1600, "over"), (2, 600, "fits")):
        assert f"-ncmoe {n}: GPU {mib} MiB ({verdict} the budget)" in out, out
    (csv_path,) = (tmp_path / "out").glob("ppl_side-*.csv")
    rows = {(r["label"], r["figure"]): r for r in read_csv(csv_path)}
    llama = rows["llama.cpp", "tokens_per_s"]
    assert llama["value"] == pytest.approx(4480.0)
    assert llama["config"]["ncmoe"] == 2 and llama["config"]["gpu_mib"] == 600
    assert "-ncmoe 2 -lm none" in llama["config"]["cmd"] and "-fa on" in llama["config"]["cmd"]
    assert rows["llama.cpp", "ppl"]["value"] == 123.4567
    assert rows["strata", "ppl_rel_diff"]["value"] == pytest.approx(abs(123.45 / 123.4567 - 1))
    assert rows["strata", "speedup"]["value"] == pytest.approx(9000 / 4480)


def test_a_budget_no_ncmoe_fits_is_one_line_exit_2(tmp_path, tiny, monkeypatch, capsys):
    gguf, pack = tiny
    mod = _script()
    monkeypatch.setattr(mod, "run_strata", _strata_stub)
    monkeypatch.setenv("FITS_AT", "0")
    rc = mod.main(["--gguf", str(gguf), "--pack", str(pack), "--bin",
                   str(_fake_bin(tmp_path, _STANDIN)), "--budget", "500MiB", "--tokens", "500",
                   "--ctx", "64", "--compute-margin", "0", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("ppl_side: ") and "\n" not in err, err
    assert "-ncmoe 2" in err


@pytest.mark.parametrize("llama_args", ["", "-ctk f32 -ctv f32 -fa off"])
def test_smoke_on_the_cpu(tmp_path, tiny, monkeypatch, capsys, llama_args):
    bin_dir = _bin()
    if bin_dir is None:
        pytest.skip("no llama-perplexity binary (set STRATA_LLAMA_BIN to its bin folder)")
    gguf, pack = tiny
    monkeypatch.setenv("OMP_NUM_THREADS", "1")        # strata's reader: one torch thread
    out = tmp_path / "out"
    rc = _script().main(["--gguf", str(gguf), "--pack", str(pack), "--bin", str(bin_dir),
                         "--budget", "1TiB", "--tokens", "4000", "--ctx", "64",
                         "--strata-args", "--device cpu --no-warmup",
                         "--llama-args", llama_args, "--out", str(out)])
    assert rc == 0
    (csv_path,) = out.glob("ppl_side-*.csv")
    assert csv_path.with_suffix(".png").stat().st_size > 5_000
    rows = {(r["label"], r["figure"]): r for r in read_csv(csv_path)}
    s, ll = rows["strata", "ppl"], rows["llama.cpp", "ppl"]
    assert math.isfinite(s["value"]) and math.isfinite(ll["value"])
    assert s["config"]["tokens"] >= 4000
    assert s["config"]["windows"] == ll["config"]["windows"] == s["config"]["tokens"] // 64
    assert ll["config"]["ncmoe"] == 0                 # no GPU: every buffer in host memory
    rel = rows["strata", "ppl_rel_diff"]["value"]
    assert rel == pytest.approx(abs(s["value"] / ll["value"] - 1)) and rel <= REL, rel
    lost = "its PPL kept, its tokens/s missing" in capsys.readouterr().out
    for label in ("strata", "llama.cpp"):
        if label == "llama.cpp" and lost:      # its perf line lost every time: no row made up
            assert (label, "tokens_per_s") not in rows
        else:
            assert rows[label, "tokens_per_s"]["value"] > 0
        assert rows[label, "wall_s"]["value"] > 0


def test_the_text_is_cut_to_a_line_past_the_tokens():
    from strata.bench.text import text, text_of_tokens

    def encode(t):                   # one id a byte: the cut is exact to measure
        return list(t.encode("utf-8"))
    for n in (100, 5_000, 300_000):
        t, ids, reps = text_of_tokens(encode, n, cut=True)
        whole, _ = text(len(t))
        assert ids == encode(t) and len(ids) >= n
        assert t.endswith("\n") and whole.startswith(t)
        # the cut lands in the line the 1% margin (and its 2% steps) reach, not at the end
        assert len(ids) <= n * 1.01 * 1.02 + max(len(x) for x in whole.splitlines()) + 1


def test_a_run_that_lost_its_last_lines_runs_again(tmp_path, tiny, monkeypatch, capsys):
    gguf, pack = tiny
    mod = _script()
    monkeypatch.setattr(mod, "run_strata", _strata_stub)
    monkeypatch.setenv("FITS_AT", "0")
    monkeypatch.setenv("LOSE_ONCE", str(tmp_path / "lost"))
    rc = mod.main(["--gguf", str(gguf), "--pack", str(pack), "--bin",
                   str(_fake_bin(tmp_path, _STANDIN)), "--budget", "1TiB", "--tokens", "500",
                   "--ctx", "64", "--compute-margin", "0", "--out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert rc == 0 and "-ncmoe 0: its log lost its last lines at exit" in out, out
    (csv_path,) = (tmp_path / "out").glob("ppl_side-*.csv")
    rows = {(r["label"], r["figure"]): r for r in read_csv(csv_path)}
    assert rows["llama.cpp", "ppl"]["value"] == 123.4567


def test_a_perf_line_lost_every_time_keeps_the_ppl_and_makes_no_speed(tmp_path, tiny,
                                                                     monkeypatch, capsys):
    """Every run prints its final PPL and loses the perf line after it: after LOST_RUNS runs the
    PPL is kept, with no llama.cpp tokens/s row and no speedup (none is made up), exit 0."""
    gguf, pack = tiny
    mod = _script()
    monkeypatch.setattr(mod, "run_strata", _strata_stub)
    monkeypatch.setenv("FITS_AT", "0")
    monkeypatch.setenv("LOSE_PERF", "1")
    rc = mod.main(["--gguf", str(gguf), "--pack", str(pack), "--bin",
                   str(_fake_bin(tmp_path, _STANDIN)), "--budget", "1TiB", "--tokens", "500",
                   "--ctx", "64", "--compute-margin", "0", "--out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert out.count("its log lost its last lines at exit") == mod.LOST_RUNS - 1
    assert "its PPL kept, its tokens/s missing" in out
    (csv_path,) = (tmp_path / "out").glob("ppl_side-*.csv")
    rows = {(r["label"], r["figure"]): r for r in read_csv(csv_path)}
    assert rows["llama.cpp", "ppl"]["value"] == 123.4567
    assert ("llama.cpp", "tokens_per_s") not in rows and ("strata", "speedup") not in rows
    assert rows["strata", "tokens_per_s"]["value"] == 9000.0
    assert csv_path.with_suffix(".png").stat().st_size > 0
