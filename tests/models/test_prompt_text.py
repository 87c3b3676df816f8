"""Text prompts: the tokenizer a pack carries from its GGUF or Hugging Face source (strata.tokenize),
`strata prefill --prompt / --prompt-file`, and its refusals."""
from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from strata.cli import main
from strata.packs import Pack, write_pack
from strata.packs.synth import synth_gguf, synth_pack
from strata.packs.synth_vocab import _byte_tokens, _vocab, synth_tokenizer
from strata.shapes import PRESETS
from strata.tokenize import TextTokenizer, hf_tokenizer
from tests.models.hf_tiny import TINY, hf_state, make_hf_model, to_strata

SMALL = PRESETS["small"]          # V = 1024: room for learned merges and the control tokens
TEXT = "The quick brown fox reads long prompts through experts.<|im_end|>"


@pytest.fixture(scope="module")
def small_pack(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    g = synth_gguf(d / "s.gguf", SMALL, progress=False)
    assert main(["pack", str(g), "-o", str(d / "s.pack")]) == 0
    return d / "s.pack"


def test_gguf_tokenizer_is_carried_and_matches_the_vocabulary(small_pack):
    entry = Pack.open(small_pack).tokenizer
    assert entry is not None and entry["source"] == "gguf:s.gguf" and entry["add_bos"] is None
    tok = TextTokenizer(entry)
    tokens, _, merges, eos = _vocab(SMALL.vocab)
    ids = tok.encode(TEXT)
    # the file's own vocabulary spells the text back; learned merges were used; the control
    # token stays whole (one id: eos + 2 is <|im_end|>)
    assert "".join(tokens[i] for i in ids[:-1]) == "".join(
        _byte_tokens()[b] for b in TEXT[:-len("<|im_end|>")].encode())
    assert ids[-1] == eos + 2 and tokens[ids[-1]] == "<|im_end|>"
    assert len(ids) < len(TEXT.encode()) // 2, "merges shorten the text"
    assert tokens.index("Ġquick") in ids and merges


def test_synth_pack_and_gguf_import_carry_the_same_tokenizer(small_pack, tmp_path):
    direct = synth_pack(tmp_path / "d.pack", SMALL, progress=False)
    a, b = Pack.open(direct).tokenizer, Pack.open(small_pack).tokenizer
    assert json.loads(a["json"]) == json.loads(b["json"])
    assert synth_tokenizer(SMALL.vocab)["json"] == a["json"], "the vocabulary is deterministic"


@settings(max_examples=40, deadline=None)
@given(st.text(max_size=60))
@example("")                       # nothing in, nothing out
@example("  two  spaces\n\ttab")   # whitespace runs are split by the Qwen2 regex, not dropped
@example("日本語 é \x00")           # multi-byte UTF-8 and a NUL byte go through byte tokens
def test_encode_round_trips(small_pack, text):
    """Any text: the ids spell its UTF-8 bytes in the file's byte alphabet, and decode back."""
    tok = TextTokenizer(Pack.open(small_pack).tokenizer)
    ids = tok.encode(text)
    tokens = _vocab(SMALL.vocab)[0]
    if "<|" not in text:
        assert "".join(tokens[i] for i in ids) == "".join(_byte_tokens()[b] for b in text.encode())
    assert tok._tok.decode(ids, skip_special_tokens=False) == text


def test_hf_folder_tokenizer_equals_transformers(tmp_path):
    """A Hugging Face folder's tokenizer.json is carried; the pack encodes as transformers does."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers, decoders
    from transformers import AutoTokenizer, PreTrainedTokenizerFast
    hf = make_hf_model(TINY, seed=0)
    folder = tmp_path / "hf"
    hf.save_pretrained(folder)
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator([TEXT * 3], trainers.BpeTrainer(
        vocab_size=TINY.vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    PreTrainedTokenizerFast(tokenizer_object=t).save_pretrained(folder)
    assert main(["pack", str(folder), "-o", str(tmp_path / "h.pack")]) == 0
    ours = TextTokenizer(Pack.open(tmp_path / "h.pack").tokenizer)
    theirs = AutoTokenizer.from_pretrained(str(folder))
    for text in (TEXT, "fox fox prompts", "über 42"):
        assert ours.encode(text) == theirs.encode(text, add_special_tokens=False)
    assert hf_tokenizer(tmp_path) is None, "a folder without tokenizer files carries none"


def test_prompt_equals_its_tokens(small_pack, tmp_path, capsys):
    """--prompt and --prompt-file read exactly the ids --tokens gives; the report shows them."""
    tok = TextTokenizer(Pack.open(small_pack).tokenizer)
    ids = tok.encode(TEXT)
    base = ["prefill", str(small_pack), "--experts", "ref", "--device", "cpu"]
    a, b, c = tmp_path / "a.npy", tmp_path / "b.npy", tmp_path / "c.npy"
    assert main(base + ["--tokens", ",".join(map(str, ids)), "--dump-logits", str(a)]) == 0
    capsys.readouterr()
    assert main(base + ["--prompt", TEXT, "--dump-logits", str(b)]) == 0
    out = capsys.readouterr().out
    doc = tmp_path / "doc.txt"
    doc.write_text(TEXT, encoding="utf-8")
    assert main(base + ["--prompt-file", str(doc), "--dump-logits", str(c), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert np.array_equal(np.load(a), np.load(b)) and np.array_equal(np.load(a), np.load(c))
    assert f"prompt: {len(ids)} tokens from --prompt (tokenizer gguf:s.gguf): " \
           f"{ids[0]} 'T', {ids[1]} 'he'" in out and "'<|im_end|>'" in out and " ... " in out
    assert rep["prompt"]["n_tokens"] == len(ids) == rep["n_tokens"]


def test_prompt_streamed(small_pack, capsys):
    """The streaming engine reads a text prompt too (CPU stand-in)."""
    assert main(["prefill", str(small_pack), "--prompt", TEXT, "--experts", "ref",
                 "--device", "cpu", "--vram", "2GiB", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["n_tokens"] == rep["prompt"]["n_tokens"] > 0


def test_refusals(small_pack, tmp_path, capsys):
    """One line, exit 2: text past the context, no tokenizer, empty or unreadable text."""
    short = dataclasses.replace(TINY, max_pos=16)
    dense, blobs, lays = to_strata(hf_state(make_hf_model(TINY, seed=0)), TINY)
    ctx = write_pack(tmp_path / "ctx.pack", short, dense, blobs, lays, native=True,
                     progress=False, tokenizer=synth_tokenizer(TINY.vocab))
    bare = write_pack(tmp_path / "bare.pack", TINY, dense, blobs, lays, native=True,
                      progress=False)
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok \xff\xfe")
    cases = [
        ([str(ctx), "--prompt", "x" * 17], r"--prompt has 17 tokens, longer than the model's "
                                           r"context of 16 tokens; shorten it"),
        ([str(bare), "--prompt", "hi"], r"carries no tokenizer .* or give --tokens"),
        ([str(small_pack), "--prompt", ""], r"--prompt is empty"),
        ([str(small_pack), "--prompt-file", str(bad)], r"is not UTF-8 text \(byte 3\)"),
        ([str(small_pack), "--prompt-file", str(tmp_path)], r"is a folder"),
        ([str(small_pack), "--prompt-file", str(tmp_path / "no.txt")], r"no such file"),
    ]
    capsys.readouterr()
    for args, msg in cases:
        assert main(["prefill", *args, "--experts", "ref"]) == 2, args
        err = capsys.readouterr().err.strip()
        assert re.search(msg, err) and len(err.splitlines()) == 1, err


def test_prompts_file_text_lines(small_pack, tmp_path, capsys):
    """--prompts-file `text: ...` lines: each read exactly as --prompt reads it (beside id and
    length lines in one file); after --resume a text question drops the tokenizer's BOS (a
    continuation, as --prompt does) and its next token equals a full read of document +
    question; an empty `text:`, a bare pack or undecodable bytes are one line, exit 2."""
    tok = TextTokenizer(Pack.open(small_pack).tokenizer)
    q1, q2 = "What reads the prompt?", "And how fast?"
    f = tmp_path / "q.txt"
    f.write_text(f"# questions\ntext: {q1}\n5\ntext:   {q2}  \n", encoding="utf-8")
    base = ["prefill", str(small_pack), "--experts", "ref", "--device", "cpu", "--vram", "2GiB",
            "--json", "--no-warmup"]
    assert main(base + ["--prompts-file", str(f)]) == 0
    reps = json.loads(capsys.readouterr().out)
    assert [r["n_tokens"] for r in reps] == [len(tok.encode(q1)), 5, len(tok.encode(q2))]
    for r, q in ((reps[0], q1), (reps[2], q2)):
        assert main(base + ["--prompt", q]) == 0
        assert json.loads(capsys.readouterr().out)["next_token"] == r["next_token"]
    # after a saved document: each question continues it
    doc = tmp_path / "doc.kv"
    assert main(base + ["--prompt", TEXT, "--save-kv", str(doc)]) == 0
    capsys.readouterr()
    f.write_text(f"text: {q1}\ntext: {q2}\n", encoding="utf-8")
    assert main(base + ["--prompts-file", str(f), "--resume", str(doc)]) == 0
    reps = json.loads(capsys.readouterr().out)
    for r, q in zip(reps, (q1, q2)):
        new = tok.encode(q)
        assert r["kv_state"]["read"] == len(new)
        assert r["kv_state"]["restored"] == len(tok.encode(TEXT))
        whole = ",".join(map(str, tok.encode(TEXT) + new))
        assert main(base + ["--tokens", whole]) == 0
        assert json.loads(capsys.readouterr().out)["next_token"] == r["next_token"]
    bad = tmp_path / "bad.txt"
    for content, msg in ((b"text:   \n", r"line 1: `text:` holds no text"),
                         (b"text: ok \xff\n", r"cannot read it .* UTF-8"),
                         (b"hello\n", r"line 1: 'hello' is neither token ids")):
        bad.write_bytes(content)
        assert main(base + ["--prompts-file", str(bad)]) == 2
        err = capsys.readouterr().err.strip()
        assert re.search(msg, err) and len(err.splitlines()) == 1, err
