"""The instrument with logits sources made by hand: the protocol's alignment (the logits of
position p score token p + 1, BOS replaced, only the second half), the seam a batched reader
takes (windows -> logits, any number per call), and the base file round trip."""
from __future__ import annotations

import json
import math
import struct

import numpy as np
import pytest
import torch

from strata.errors import StrataError
from strata.instruments.kldfile import Base, BaseWriter, tokens_sha256
from strata.instruments.logprobs import row_width
from strata.instruments.perplexity import measure
from strata.instruments.windows import Windows

V = 5


def oracle(p_next: float, seen: list):
    """A source that gives the window's own next token probability p_next (the rest spread
    evenly): each scored token's NLL is -ln p_next exactly when the alignment is right."""
    def read(ids):
        seen.append(ids.clone())
        n, ctx = ids.shape
        first = ctx // 2
        out = torch.full((n, ctx - 1 - first, V), math.log((1 - p_next) / (V - 1)))
        for j in range(n):
            for k, p in enumerate(range(first, ctx - 1)):
                out[j, k, ids[j, p + 1]] = math.log(p_next)
        return out
    return read


def text(n):
    return [(7 * i + 3) % V for i in range(n)]


@pytest.mark.parametrize("per_call", [1, 2, 3])
def test_the_scored_tokens_line_up_whatever_the_windows_per_call(per_call):
    seen = []
    w = Windows.of(text(50), ctx=8, bos=0)                   # 6 windows of 8, 3 scored each
    res = measure(w, oracle(0.5, seen), per_call=per_call)
    assert (res.n_windows, res.count) == (6, 18)
    # float32 logits: each NLL is ln 2 to a few float32 ulps (1e-7 relative)
    assert res.ppl == pytest.approx(2.0, rel=1e-6)
    assert math.isnan(res.ppl_err) or res.ppl_err < 1e-6    # no spread
    assert res.running == pytest.approx([2.0] * 6, rel=1e-6)
    ids = torch.cat(seen)
    assert ids.shape == (6, 8) and (ids[:, 0] == 0).all()   # BOS first in every window
    assert ids[2, 1:].tolist() == text(50)[17:24]


def test_a_misaligned_source_is_caught():
    w = Windows.of(text(40), ctx=8, bos=None)
    with pytest.raises(StrataError, match="wants"):
        measure(w, lambda ids: torch.zeros(ids.shape[0], 4, V))


def test_the_error_is_llama_cpp_s():
    # two windows whose tokens get p = 1/2 and p = 1/4: NLL ln 2 (×3), ln 4 (×3)
    probs = iter([0.5, 0.25])
    w = Windows.of(text(16), ctx=8, bos=None)
    res = measure(w, lambda ids: oracle(next(probs), [])(ids))
    mean = 1.5 * math.log(2)
    var = (3 * math.log(2) ** 2 + 3 * math.log(4) ** 2) / 6 - mean ** 2
    assert res.ppl == pytest.approx(math.exp(mean), rel=1e-6)
    assert res.ppl_err == pytest.approx(math.exp(mean) * math.sqrt(var / 5), rel=1e-5)
    assert res.running[0] == pytest.approx(2.0, rel=1e-6)


def test_a_base_written_and_read_back(tmp_path):
    w = Windows.of(text(40), ctx=8, bos=0)
    path = tmp_path / "b.kld"
    with BaseWriter(path, w, V, {"vocab_sha256": "v" * 64, "tokenizer": "t"}) as wr:
        saved = measure(w, oracle(0.5, []), save=wr)
    size = 20 + 4 * 40 + 2 * 5 * 3 * row_width(V)
    raw = path.read_bytes()
    assert raw[:8] == b"_logits_" and struct.unpack("<iii", raw[8:20]) == (8, V, 5)
    n = struct.unpack("<Q", raw[-16:-8])[0]
    assert raw[-8:] == b"STRATAKL" and len(raw) == size + n + 16
    ident = json.loads(raw[size:size + n])
    assert ident["tokens_sha256"] == tokens_sha256(w.tokens) and ident["ctx"] == 8
    base = Base.open(path)
    assert base.tokens.tolist() == text(40) and base.rows(4).shape == (3, row_width(V))
    same = measure(w, oracle(0.5, []), base=base)
    assert same.ppl == pytest.approx(saved.ppl, rel=1e-6)
    assert same.kld["kld"]["mean"] == pytest.approx(0.0, abs=1e-6)
    assert same.kld["same_top"]["p"] == 1.0
    other = measure(w, oracle(0.25, []), base=base)
    # KL(base || Q) per token: ½ ln(½/¼) + 4·⅛ ln(⅛ / (3/16)) = ½ ln 2 + ½ ln(2/3)
    assert other.kld["kld"]["mean"] == pytest.approx(0.5 * math.log(4 / 3), rel=1e-4)
    assert other.kld["p_diff"]["mean"] == pytest.approx(-0.25, rel=1e-4)
    assert other.kld["perplexity"]["ln_ratio"] == pytest.approx(math.log(2), rel=1e-4)


def test_a_failed_save_leaves_nothing(tmp_path):
    w = Windows.of(text(40), ctx=8, bos=0)
    calls = [0]

    def dies(ids):
        calls[0] += 1
        if calls[0] == 3:
            raise KeyboardInterrupt
        return oracle(0.5, [])(ids)
    with pytest.raises(KeyboardInterrupt):
        with BaseWriter(tmp_path / "b.kld", w, V, {}) as wr:
            measure(w, dies, save=wr)
    assert list(tmp_path.iterdir()) == []


def test_a_llama_cpp_base_without_a_trailer_is_read(tmp_path):
    p = tmp_path / "l.kld"
    rows = np.zeros((2, 3, row_width(V)), np.uint16)
    p.write_bytes(b"_logits_" + struct.pack("<iii", 8, V, 2)
                  + np.arange(16, dtype="<i4").tobytes() + rows.tobytes())
    base = Base.open(p)
    assert base.identity is None and base.n == 2 and base.tokens.tolist() == list(range(16))
    p.write_bytes(p.read_bytes()[:-2])
    with pytest.raises(StrataError, match="cut short"):
        Base.open(p)
    p.write_bytes(b"GGUF" + bytes(40))
    with pytest.raises(StrataError, match="not a KL-divergence base"):
        Base.open(p)


def test_a_base_refuses_another_model_tokenizer_window_or_text(tmp_path):
    w = Windows.of(text(40), ctx=8, bos=0)
    with BaseWriter(tmp_path / "b.kld", w, V, {"vocab_sha256": "a" * 64}) as wr:
        measure(w, oracle(0.5, []), save=wr)
    base = Base.open(tmp_path / "b.kld")
    ok = dict(vocab_sha="a" * 64, n_vocab=V, ctx=None, tokens=torch.tensor(text(40)))
    base.check(**ok)
    for change, words in [({"n_vocab": V + 1}, "another model"),
                          ({"vocab_sha": "b" * 64}, "another tokenizer"),
                          ({"ctx": 16}, "--ctx 8"),
                          ({"tokens": torch.tensor(text(41))[1:]}, "another text"),
                          ({"tokens": torch.tensor(text(30))}, "another text")]:
        with pytest.raises(StrataError, match=words):
            base.check(**{**ok, **change})


def test_an_odd_window_from_a_llama_cpp_base(tmp_path):
    # llama-perplexity takes -c 9: first = 4, 4 scored a window; strata reads such a base
    p = tmp_path / "odd.kld"
    rows = np.zeros((2, 4, row_width(V)), np.uint16)
    p.write_bytes(b"_logits_" + struct.pack("<iii", 9, V, 2)
                  + np.array(text(18), dtype="<i4").tobytes() + rows.tobytes())
    base = Base.open(p)
    w = Windows.of(base.tokens, base.ctx, None, even=False)
    assert (w.n, w.first, w.n_scored) == (2, 4, 4)
    res = measure(w, oracle(0.5, []), base=base)
    assert res.count == 8
    with pytest.raises(StrataError, match="odd"):
        Windows.of(base.tokens, 9, None)
