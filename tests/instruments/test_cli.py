"""`strata perplexity` end to end on synthetic packs: llama.cpp's lines and --json, a pack read
against its own base (KLD 0 within the base's 16-bit step, every top token the same), another
quant against it, the streamed read, and bad inputs (one line, exit 2, nothing written).

The texts are the standard library's own documentation (argparse's and json's docstrings);
the synthetic tokenizer is byte-level with a few merges, about one token a byte."""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import re
import struct

import pytest

from strata.cli import main
from strata.packs import Pack
from strata.packs.synth import ExpertFormats, synth_pack
from strata.shapes import get_preset
from strata.tokenize import pack_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py

STEP = 16 / 65535          # a base row's log-prob resolution: rounding moves a log-prob <= STEP/2
CTX = ["--ctx", "32"]
N = 8                      # windows read: 8·15 = 120 scored tokens, past llama.cpp's 100 for
READ = [*CTX, "--chunks", str(N)]      # its closing statistics; the CPU's expert FFN is slow


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    d = tmp_path_factory.mktemp("ppl")
    tiny = get_preset("tiny")
    q8 = synth_pack(d / "q8.pack", tiny, ExpertFormats.of("Q8_0"), progress=False)
    q4 = synth_pack(d / "q4.pack", tiny, ExpertFormats.of("Q4_0"), progress=False)
    return q8, q4


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    d = tmp_path_factory.mktemp("texts")
    (d / "a.txt").write_text(argparse.__doc__)
    (d / "b.txt").write_text(json.__doc__)
    (d / "short.txt").write_text("A few words.")
    return d / "a.txt", d / "b.txt", d / "short.txt"


@pytest.fixture(scope="module")
def base(packs, texts, tmp_path_factory):
    """The Q8_0 pack's base over text a, and what --kld-save reported."""
    path = tmp_path_factory.mktemp("base") / "q8.kld"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["perplexity", str(packs[0]), "--file", str(texts[0]), *READ, "--kld-save",
                   str(path), "--json"])
    assert rc == 0
    return path, json.loads(out.getvalue())


def run(capsys, *argv):
    rc = main(["perplexity", *map(str, argv)])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def run_json(capsys, *argv) -> dict:
    rc, out, err = run(capsys, *argv, "--json")
    assert rc == 0, err
    return json.loads(out)


def one_line(capsys, *argv) -> str:
    rc, out, err = run(capsys, *argv)
    lines = [ln for ln in (out + err).splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, (rc, out, err)
    return lines[0]


def test_llama_cpp_s_lines_and_the_json(packs, texts, capsys):
    rc, out, err = run(capsys, packs[0], "--file", texts[0], *READ)
    assert rc == 0, err
    m = re.fullmatch(r"Final estimate: PPL = (\d+\.\d{4}) \+/- (\d+\.\d{5})\n", out)
    assert m, out
    progress = re.findall(r"\[(\d+)\](\d+\.\d{4}),", err)
    rep = run_json(capsys, packs[0], "--file", texts[0], *READ)
    assert rep["windows"] == N and rep["scored_tokens"] == 15 * N
    # the text read through the pack's own tokenizer (tiny's V = 256: 248 bytes and 8 merges)
    tok = pack_tokenizer(Pack.open(packs[0]))
    assert rep["n_tokens"] == len(tok.encode(argparse.__doc__, specials=False))
    assert rep["n_tokens"] < len(argparse.__doc__.encode())      # its merges were used
    assert [int(i) for i, _ in progress] == list(range(1, N + 1))
    assert float(m.group(1)) == pytest.approx(rep["ppl"], abs=5e-5)
    assert float(m.group(2)) == pytest.approx(rep["ppl_err"], abs=5e-6)
    assert float(progress[-1][1]) == pytest.approx(rep["ppl"], abs=5e-5)
    assert 1 < rep["ppl"] < 10 * 256 and rep["ppl_err"] > 0


def test_a_pack_against_its_own_base_has_kld_0_and_the_same_top_tokens(packs, texts, capsys,
                                                                        base):
    base, saved = base
    assert saved["kld_saved"] == str(base) and base.read_bytes()[:8] == b"_logits_"
    rep = run_json(capsys, packs[0], "--kld", base)          # the base's own tokens
    k = rep["kld"]
    # |KLD| <= max|δ|·Σp_base with |δ| <= STEP/2 (+ float32 rounding), Σp_base <= e^(STEP/2)
    bound = (STEP / 2 + 1e-5) * math.exp(STEP)
    assert max(abs(k["kld"]["max"]), abs(k["kld"]["min"]), abs(k["kld"]["mean"])) <= bound
    assert k["same_top"]["p"] == 1.0
    assert abs(k["perplexity"]["ln_ratio"]) <= STEP / 2 + 1e-5
    # the same logits; the KLD mode keeps each NLL in float32, as llama.cpp does
    assert rep["ppl"] == pytest.approx(saved["ppl"], rel=1e-6)
    rc, out, err = run(capsys, packs[0], "--kld", base, "--file", texts[0])
    assert rc == 0 and "Same top p: 100.000 ±" in out and "Mean    KLD:" in out
    assert re.search(r"^ +1 +\d+\.\d{4} ± ", err, re.M)          # the per-window table


def test_another_quant_diverges_from_the_base(packs, texts, capsys, base):
    base, _ = base
    k = run_json(capsys, packs[1], "--kld", base, "--file", texts[0])["kld"]
    assert k["kld"]["mean"] > 100 * STEP and k["kld"]["err"] > 0
    assert k["same_top"]["p"] < 1.0
    assert k["kld"]["min"] <= k["kld"]["percentiles"]["1"] <= k["kld"]["median"] \
        <= k["kld"]["percentiles"]["99"] <= k["kld"]["max"]


def test_the_streamed_read_gives_the_resident_numbers(packs, texts, capsys):
    # both run the fp32 reference expert FFN on the CPU over the same chunks
    args = (packs[0], "--file", texts[0], *CTX, "--chunks", "3")
    resident = run_json(capsys, *args)
    streamed = run_json(capsys, *args, "--vram", "2GiB", "--cache", "3MiB", "--no-warmup")
    assert streamed["reader"].startswith("streamed") and resident["reader"].startswith("resident")
    assert streamed["windows"] == 3
    assert streamed["ppl"] == pytest.approx(resident["ppl"], rel=1e-6)


def _retokenized(base, tmp_path):
    """The base with another vocabulary hash in its trailer (a base made by another tokenizer)."""
    raw = base.read_bytes()
    n = struct.unpack("<Q", raw[-16:-8])[0]
    ident = json.loads(raw[-16 - n:-16])
    ident["vocab_sha256"] = "0" * 64
    t = json.dumps(ident).encode()
    other = tmp_path / "other_tok.kld"
    other.write_bytes(raw[:-16 - n] + t + struct.pack("<Q", len(t)) + b"STRATAKL")
    return other


def test_bad_inputs_are_one_line_and_write_nothing(packs, texts, capsys, tmp_path, base):
    a, b, short = texts
    base, _ = base
    out = tmp_path / "out"
    out.mkdir()
    (out / "not_a_base.txt").write_text("keep me")
    cases = [
        (["--file", tmp_path / "missing.txt"], "no such file"),
        (["--file", short], "needs at least 1,024"),
        (["--file", a, "--ctx", "33"], "odd"),
        (["--file", a, "--ctx", "2"], "too small"),
        (["--file", a, "--ctx", "65536"], "longer than the model's context"),
        ([], "give the text"),
        (["--file", a, "--chunks", "0"], "--chunks"),
        (["--file", b, "--kld", base], "another text"),
        (["--file", a, "--kld", base, "--ctx", "64"], "--ctx 32"),
        (["--kld", _retokenized(base, tmp_path)], "another tokenizer"),
        (["--kld", a], "not a KL-divergence base"),
        (["--kld", tmp_path / "none.kld"], "does not exist"),
        (["--file", a, *CTX, "--kld-save", out / "not_a_base.txt"], "not a base file"),
        (["--file", a, *CTX, "--kld-save", tmp_path / "no" / "b.kld"], "does not exist"),
        (["--file", short, "--kld-save", out / "b.kld"], "needs at least"),
    ]
    for argv, words in cases:
        line = one_line(capsys, packs[0], *argv)
        assert words in line, (argv, line)
    assert sorted(p.name for p in out.iterdir()) == ["not_a_base.txt"]
    assert (out / "not_a_base.txt").read_text() == "keep me"


def test_an_interrupted_save_leaves_nothing(packs, texts, capsys, tmp_path, monkeypatch):
    import strata.instruments.perplexity as instrument
    real, calls = instrument.quantize_rows, [0]

    def interrupted(logits):
        calls[0] += 1
        if calls[0] == 3:
            raise KeyboardInterrupt
        return real(logits)
    monkeypatch.setattr(instrument, "quantize_rows", interrupted)
    rc, _, err = run(capsys, packs[0], "--file", texts[0], *CTX, "--kld-save",
                     tmp_path / "b.kld")
    assert rc == 130 and "interrupted" in err
    assert list(tmp_path.iterdir()) == []


def test_the_json_is_strict_when_too_few_tokens_give_no_error(packs, texts, capsys, tmp_path):
    # 3 scored tokens: no error of the mean (llama.cpp wants more than ten), no correlation
    base = tmp_path / "small.kld"
    argv = (packs[0], "--file", texts[0], "--ctx", "8", "--chunks", "1")
    run_json(capsys, *argv, "--kld-save", base)
    rc, out, err = run(capsys, *argv, "--kld", base, "--json")

    def no_nan(name):
        raise AssertionError(f"{name} in --json")
    rep = json.loads(out, parse_constant=no_nan)
    assert rc == 0 and rep["kld"]["count"] == 3 and rep["kld"]["perplexity"]["cor"] is None


def test_a_pack_without_a_tokenizer_is_one_line(texts, capsys, tmp_path):
    from strata.packs.memory import MemoryPack
    mem = MemoryPack(get_preset("tiny"), ExpertFormats.of("BF16"), distinct=2, variants=1,
                     device="cpu")
    bare = mem.save(tmp_path / "bare.pack", progress=False, tokenizer=False)
    assert "carries no tokenizer" in one_line(capsys, bare, "--file", texts[0], *READ)
