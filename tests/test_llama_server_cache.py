"""experiments/llama_server_cache.py: bad input is one line and exit 2 before any server starts;
the document and questions are the ids kv_resume draws; and, where a llama-server binary is
found (STRATA_LLAMA_BIN, its bin folder, or a CPU build in /tmp/lcp-srv/build/bin), a smoke run
on a converter-made tiny GGUF writes every row and reads each question after the first through
the prompt cache. The CPU build: cmake -DGGML_CUDA=OFF -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF, target
llama-server (a native build's AMX Q8_0 kernels crash at load on a machine that advertises AMX
but does not grant its tile state)."""
from __future__ import annotations

import argparse
import importlib.util
import os
from pathlib import Path

import pytest
import torch

from strata.bench import read_csv

ROOT = Path(__file__).resolve().parents[1]
GGUF = ROOT / "tests" / "models" / "data" / "llama_cpp" / "qwen3moe-q8_0.gguf"
KNOWN_BIN = Path("/tmp/lcp-srv/build/bin")


def _script():
    spec = importlib.util.spec_from_file_location(
        "llama_server_cache", ROOT / "experiments" / "llama_server_cache.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _bin() -> Path | None:
    for d in (os.environ.get("STRATA_LLAMA_BIN"), KNOWN_BIN):
        if d and (Path(d) / "llama-server").is_file():
            return Path(d)
    return None


def _fake_bin(tmp_path) -> Path:
    b = tmp_path / "bin"
    b.mkdir()
    (b / "llama-server").write_text("#!/bin/sh\nexit 1\n")
    (b / "llama-server").chmod(0o755)
    return b


@pytest.mark.parametrize("case", ["no binary", "no gguf", "not a gguf", "budget too small"])
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, case):
    bin_dir, gguf, budget = _fake_bin(tmp_path), GGUF, "1TiB"
    if case == "no binary":
        bin_dir = tmp_path / "empty"
    elif case == "no gguf":
        gguf = tmp_path / "missing.gguf"
    elif case == "not a gguf":
        gguf = tmp_path / "x.gguf"
        gguf.write_bytes(b"not a gguf")
    else:
        budget = "1KiB"
    rc = _script().main(["--gguf", str(gguf), "--bin", str(bin_dir), "--budget", budget,
                         "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("llama_server_cache: ") and "\n" not in err, err
    assert not (tmp_path / "out").exists()     # refused before anything ran


def test_prompts_are_kv_resumes_ids():
    """kv_resume draws its resume prompt (P + Q), then the document, then each question from
    one generator seeded 0; --skip P + Q gives the same document and questions."""
    P, Q, D, V, n = 40, 8, 24, 256, 3
    g = torch.Generator().manual_seed(0)
    torch.randint(0, V, (P + Q,), generator=g)
    doc = torch.randint(0, V, (D,), generator=g).tolist()
    qs = [torch.randint(0, V, (Q,), generator=g).tolist() for _ in range(n)]
    args = argparse.Namespace(skip=P + Q, vocab=V, doc_tokens=D, question_tokens=Q, questions=n)
    assert _script().prompts(args) == (doc, qs)


def test_server_smoke(tmp_path):
    bin_dir = _bin()
    if bin_dir is None:
        pytest.skip("no llama-server binary (set STRATA_LLAMA_BIN to its bin folder)")
    out = tmp_path / "out"
    rc = _script().main(["--gguf", str(GGUF), "--bin", str(bin_dir), "--budget", "1TiB",
                         "--doc-tokens", "64", "--questions", "2", "--question-tokens", "4",
                         "--start-timeout", "120", "--out", str(out)])
    assert rc == 0
    (csv_path,) = out.glob("llama_server_cache-*.csv")
    rows = read_csv(csv_path)
    figs = [r["figure"] for r in rows]
    assert figs == ["doc_read_s", "ttft_s", "ttft_s", "slot_save_s", "slot_bytes",
                    "slot_restore_s"]
    assert all(r["value"] > 0 and r["label"] == "llama.cpp" for r in rows)
    assert all("llama-server -m " in r["config"]["cmd"] and "-lm none" in r["config"]["cmd"]
               and "-ncmoe" in r["config"]["cmd"] for r in rows)
    doc = rows[0]["config"]
    assert doc["prompt_n"] == 64            # the document read whole into an empty cache
    for r in rows[1:3]:                     # each question: the document from the cache
        c = r["config"]
        assert c["cache_n"] == 64 and c["prompt_n"] == 4, c
    save, restore = rows[3]["config"], rows[5]["config"]
    # the slot holds the last prompt, document + question (the token it answered is not fed back)
    assert save["n_saved"] == restore["n_restored"] == 64 + 4
    assert list(out.glob("llama_server_cache-*.png"))
