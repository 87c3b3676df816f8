"""`strata generate` and the saved-KV flags through the CLI on a tiny synthetic pack (which
carries a small byte-level tokenizer): text in and out, --resume of a text prompt, --resume
alone, a state saved by the streaming engine's host-held KV resumed by the resident read, and
seeded sampling. Parity with transformers: tests/models/test_generate_parity.py."""
from __future__ import annotations

import json

import numpy as np
import pytest

from strata.cli import main
from strata.packs.synth import ExpertFormats, synth_pack
from strata.shapes import get_preset

CPU = ["--device", "cpu", "--experts", "ref"]
FP32_REL = 1e-5     # tests/models/test_parity_archs.py
STREAM = ["--cache", "256KiB", "--chunk", "8", "--ring", "4", "--kv-resident", "5",
          "--no-warmup"]


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    return synth_pack(tmp_path_factory.mktemp("g") / "t.pack", get_preset("tiny"),
                      ExpertFormats.of("Q8_0"), progress=False)


def run(capsys, *argv):
    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return json.loads(out.out) if "--json" in argv else out.out


def test_text_prompt_resumed_with_more_text(pack, tmp_path, capsys):
    """--save-kv after a text prompt, --resume with more text: the saved ids then the new ones
    (no BOS in between) are what a full read of those ids decodes; the text comes back
    through the pack's tokenizer."""
    st = tmp_path / "doc.kv"
    doc = run(capsys, "prefill", pack, "--prompt", "the cat sat on", "--save-kv", st, "--json",
              *CPU)
    assert doc["kv_state"]["saved_to"] == str(st)
    r = run(capsys, "generate", pack, "--prompt", " the mat", "--resume", st, "-n", 4, "--json",
            *CPU)
    saved = doc["kv_state"]["total"]
    assert r["kv_state"]["restored"] == saved
    from strata.engine.kv_state import KVState
    ids = KVState.open(st).tokens
    from strata.packs import Pack
    from strata.tokenize import pack_tokenizer
    more = pack_tokenizer(Pack.open(pack)).encode(" the mat")
    full = run(capsys, "generate", pack, "--tokens", ",".join(map(str, ids + more)), "-n", 4,
               "--json", *CPU)
    assert r["generated"] == full["generated"] and len(r["generated"]) == 4
    assert isinstance(r["text"], str) and r["text"] == full["text"]
    # --resume alone continues from the saved prompt's own logits
    alone = run(capsys, "generate", pack, "--resume", st, "-n", 3, "--json", *CPU)
    whole = run(capsys, "generate", pack, "--tokens", ",".join(map(str, ids)), "-n", 3,
                "--json", *CPU)
    assert alone["generated"] == whole["generated"] and alone["kv_state"]["read"] == 0
    text = run(capsys, "generate", pack, "--resume", st, "-n", 2, *CPU)
    assert "decode" in text and "experts resident" in text and "kv state" in text


def test_a_streamed_state_resumes_resident(pack, tmp_path, capsys):
    """A state written by the streaming engine (PromptKV, its older tokens host-held) resumes
    in the resident read's KVCache. The engine's attention (chunk_attention_torch) sums in
    another order than the resident read's, so the saved KV of layers after the first differs
    from the resident read's own in fp32 noise: the logits agree within FP32_REL, the bound the
    parity tests give fp32 arithmetic in another order."""
    st, a, b = tmp_path / "s.kv", tmp_path / "a.npy", tmp_path / "b.npy"
    ids = list(range(1, 31))
    run(capsys, "prefill", pack, "--tokens", ",".join(map(str, ids[:16])), "--save-kv", st,
        *CPU, *STREAM)
    run(capsys, "prefill", pack, "--tokens", ",".join(map(str, ids[16:])), "--resume", st,
        "--chunk", "8", "--dump-logits", a, *CPU)
    run(capsys, "prefill", pack, "--tokens", ",".join(map(str, ids)), "--chunk", "8",
        "--dump-logits", b, *CPU)
    got, want = np.load(a), np.load(b)[16:]
    assert np.abs(got - want).max() / np.abs(want).max() < FP32_REL


def test_sampling_is_seeded(pack, capsys):
    ids = "5,6,7,8,9"
    one = [run(capsys, "generate", pack, "--tokens", ids, "-n", 5, "--temperature", "1.5",
               "--seed", s, "--json", *CPU)["generated"] for s in (1, 1, 2)]
    assert one[0] == one[1] != one[2]
    greedy = run(capsys, "generate", pack, "--tokens", ids, "-n", 5, "--json", *CPU)
    top1 = run(capsys, "generate", pack, "--tokens", ids, "-n", 5, "--temperature", "0.7",
               "--top-k", "1", "--json", *CPU)
    assert top1["generated"] == greedy["generated"]
