"""strata's instruments compute llama-perplexity's numbers when fed llama.cpp's arithmetic.

strata perplexity's PPL equals llama.cpp's within 1e-3 relative (test_llama_perplexity.py), but its
KLD does not (Q8_0 against llama.cpp's F16 base: 2.20e-4 against 2.59e-4): llama.cpp rounds every
weight product's activations (q8_0 for Q8_0 weights, q8_K for K-quants;
tests/models/test_llama_cpp_logits.py) where strata's reference keeps fp32, and a KLD that small is
made of differences of the rounding's size. Here the logits come from that file's emulation of
llama.cpp's rounding (`emulated_read`: `Arith(mode="emulate")`, and the q8 roundings llama.cpp's
fp32 order tipped, found against llama.cpp's logits of the same windows, `tipped`), read over the
windows of llama.cpp's own base file (its tokens: text.txt at -c 32, 8 windows, each window one
prompt as llama-perplexity -b 32 reads it), and scored by strata's own instrument
(`strata.instruments.perplexity.measure` with the base, as `strata perplexity --kld` calls it).
llama.cpp's logits of those windows are fixtures (<file>.windows.npy, made by
make_llama_perplexity_logits.py from the same libllama llama-perplexity links).

- The premise: each window's emulated read is llama.cpp's logits within EMULATED (fp32 order,
  the bound test_llama_cpp_logits derives).
- Every figure is then llama.cpp's: PPL(Q), PPL(base), ln(PPL(Q)/PPL(base)), each with its error;
  mean KLD and its error, the maximum, 99.9 / 99 / 95 / 90 % and median KLD; same top p and its
  error. Each within 1e-3 relative, or within half a unit of the last digit llama.cpp printed
  (%10.6f; %6.3f %% for same top p), whichever is looser: the printed digits are the looser bound
  for every KLD line (0.000259 is known to +-5e-7, 2e-3 of it).
- llama.cpp's own logits through the same instrument give the same figures: the statistics alone.

The Q8_0 file is read against llama.cpp's F16 base (qwen3moe-f16.kld), the wide Q4_K_M file
against its own F16 base (qwen3moe-wide-f16.kld); the base rows are llama.cpp's, so only the
quantized file is read here."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from strata.instruments.kldfile import Base
from strata.instruments.perplexity import measure
from strata.instruments.windows import Windows
from tests.models.fp32_bound import rel
from tests.models.llama_emulation import _pack, emulated_read

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "llama_perplexity"
GGUF = ROOT / "tests" / "models" / "data" / "llama_cpp"
FIX = json.loads((DATA / "llama_perplexity.json").read_text())
LOGITS = json.loads((DATA / "llama_perplexity_logits.json").read_text())
CASES = {"qwen3moe-q8_0.gguf": ("qwen3moe-f16.kld", "kld_q8_0_vs_f16"),
         "qwen3moe-wide-q4_k_m.gguf": ("qwen3moe-wide-f16.kld", "kld_wide_q4_k_m_vs_f16")}
REL = 1e-3


def test_the_window_logits_are_the_maker_s():
    for name, e in LOGITS["files"].items():
        assert hashlib.sha256((DATA / name).read_bytes()).hexdigest() == e["sha256"], name
        assert e["file"] in CASES and CASES[e["file"]][0] == e["base"]


def windows_of(base: Base, pack: Path) -> Windows:
    from strata.packs import Pack
    from strata.tokenize import pack_tokenizer
    return Windows.of(base.tokens, base.ctx, pack_tokenizer(Pack.open(pack)).add_bos,
                      min_windows=1)


def scored(logits, w: Windows, base: Base):
    """strata's instrument over logits [n, ctx, V] (a window's every position), against `base`."""
    return measure(w, lambda ids: torch.stack([torch.as_tensor(
        logits[i][w.first:w.ctx - 1]) for i in range(len(ids))]), per_call=w.n, base=base)


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    """{file: (pack, llama.cpp's window logits [n, ctx, V], an Emulated read per window)}:
    each window read as one prompt of ctx tokens with llama.cpp's rounding emulated and the q8
    roundings llama.cpp's fp32 order tipped found (test_llama_cpp_logits.emulated_read)."""
    tmp, cache = tmp_path_factory.mktemp("emulated"), {}

    def get(fname: str):
        if fname not in cache:
            pack = _pack(GGUF / fname, tmp)
            want = np.load(DATA / f"{fname[:-len('.gguf')]}.windows.npy")
            w = windows_of(Base.open(DATA / CASES[fname][0]), pack)
            assert want.shape[:2] == (w.n, w.ctx)
            cache[fname] = pack, want, [emulated_read(pack, GGUF / fname, w.ids(i).tolist(),
                                                      want[i]) for i in range(w.n)]
        return cache[fname]
    return get


def close(got: float, want: float, printed: float = 0.0) -> bool:
    """Within REL of want, or within half a unit of llama.cpp's last printed digit."""
    return abs(got - want) <= max(REL * abs(want), printed / 2 * (1 + 1e-9))


def figures(res) -> dict:
    """The llama.cpp lines the test compares: name as llama_perplexity.json keys them -> values."""
    k = res.kld
    pp = k["perplexity"]
    return {"Mean PPL(Q)": (pp["ppl"], pp["ppl_err"]),
            "Mean PPL(base)": (pp["ppl_base"], pp["ppl_base_err"]),
            "Mean ln(PPL(Q)/PPL(base))": (pp["ln_ratio"], pp["ln_ratio_err"]),
            "Mean    KLD": (k["kld"]["mean"], k["kld"]["err"]),
            "Maximum KLD": (k["kld"]["max"],),
            "99.9%   KLD": (k["kld"]["percentiles"]["99.9"],),
            "99.0%   KLD": (k["kld"]["percentiles"]["99"],),
            "95.0%   KLD": (k["kld"]["percentiles"]["95"],),
            "90.0%   KLD": (k["kld"]["percentiles"]["90"],),
            "Median  KLD": (k["kld"]["median"],),
            "Same top p": (100 * k["same_top"]["p"], 100 * k["same_top"]["err"])}


PRINTED = {"Same top p": 1e-3}      # %6.3f %%; every other line compared here %10.6f: 1e-6


def off_llama_cpp(res, key: str, what: str) -> list:
    bad = []
    for name, vals in figures(res).items():
        for g, w in zip(vals, FIX[key][name]):
            print(f"{what} {name}: strata {g:.9g}  llama.cpp {w}")
            if not close(g, w, PRINTED.get(name, 1e-6)):
                bad.append((name, g, w))
    return bad


@pytest.mark.parametrize("fname", list(CASES), ids=lambda f: f[:-5])
def test_emulated_read_is_llama_cpp_s_logits(emulated, fname):
    """The premise: each window's emulated read is llama.cpp's logits within EMULATED (fp32
    order; test_llama_cpp_logits's bound, derived there)."""
    _, want, reads = emulated(fname)
    for i, r in enumerate(reads):
        assert rel(r.read.logits, want[i]) < r.bound, (i, r.tips)


@pytest.mark.parametrize("fname", list(CASES), ids=lambda f: f[:-5])
def test_emulated_read_scores_as_llama_perplexity(emulated, fname):
    kfile, key = CASES[fname]
    pack, _, reads = emulated(fname)
    base = Base.open(DATA / kfile)
    res = scored(np.stack([r.read.logits for r in reads]), windows_of(base, pack), base)
    assert not (bad := off_llama_cpp(res, key, f"{fname} emulated")), bad


@pytest.mark.parametrize("fname", list(CASES), ids=lambda f: f[:-5])
def test_llama_cpp_s_own_logits_score_as_llama_perplexity(emulated, fname):
    """The statistics alone: llama.cpp's logits of the windows through strata's instrument."""
    kfile, key = CASES[fname]
    pack, want, _ = emulated(fname)
    base = Base.open(DATA / kfile)
    res = scored(want, windows_of(base, pack), base)
    assert not (bad := off_llama_cpp(res, key, f"{fname} llama.cpp's logits")), bad
