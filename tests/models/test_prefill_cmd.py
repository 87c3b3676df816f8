"""`strata prefill`: logits dump equals the model, chunking, summary/JSON, clear errors."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from strata.cli import main
from strata.engine.load import load_model, resident_provider
from strata.models.moe import moe_ffn_ref
from strata.packs import write_pack
from tests.models.hf_tiny import TINY, hf_state, make_hf_model, to_strata

FP32_REL = 1e-5  # see test_qwen3moe: identical weights, fp32 on both sides


@pytest.fixture(scope="module")
def hf_and_pack(tmp_path_factory):
    hf = make_hf_model(TINY, seed=0)
    dense, blobs, lays = to_strata(hf_state(hf), TINY)
    path = tmp_path_factory.mktemp("pack") / "tiny.pack"
    write_pack(path, TINY, dense, blobs, lays, native=True, source="test", progress=False)
    return hf, path


TOKENS = [5, 17, 255, 0, 3, 99, 42, 7, 7, 128, 64]


def test_dump_logits_match_transformers(hf_and_pack, tmp_path, capsys):
    hf, pack = hf_and_pack
    out = tmp_path / "logits.npy"
    rc = main(["prefill", str(pack), "--tokens", ",".join(map(str, TOKENS)), "--device", "cpu",
               "--experts", "ref", "--dump-logits", str(out)])
    assert rc == 0
    got = np.load(out)
    assert got.dtype == np.float32 and got.shape == (len(TOKENS), TINY.vocab)
    with torch.no_grad():
        ref = hf(torch.tensor([TOKENS])).logits[0].float().numpy()
    assert np.abs(got - ref).max() / np.abs(ref).max() < FP32_REL
    text = capsys.readouterr().out
    assert "tokens/s" in text and f"{len(TOKENS)} tokens in 1 chunk(s)" in text


def test_chunked_json(hf_and_pack, tmp_path, capsys):
    _, pack = hf_and_pack
    whole, parts = tmp_path / "a.npy", tmp_path / "b.npy"
    args = ["prefill", str(pack), "--tokens", ",".join(map(str, TOKENS)), "--experts", "ref"]
    assert main(args + ["--dump-logits", str(whole)]) == 0
    capsys.readouterr()
    assert main(args + ["--chunk", "4", "--json", "--dump-logits", str(parts)]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert (rep["n_tokens"], rep["chunk"], rep["n_chunks"], rep["provider"]) == (11, 4, 3, "resident")
    assert rep["tokens_per_s"] > 0 and rep["stats"]["resident_expert_bytes"] > 0
    assert rep["next_token"] == int(np.load(whole)[-1].argmax())
    a, b = np.load(whole), np.load(parts)
    assert np.abs(a - b).max() / np.abs(a).max() < FP32_REL


def test_load_model_from_pack(hf_and_pack):
    _, pack = hf_and_pack
    model = load_model(pack, device="cpu", ffn=moe_ffn_ref)
    prov = resident_provider(pack, "cpu")
    assert prov.nbytes >= TINY.n_layer * TINY.n_expert * prov.sets[0].layout.size
    assert model.prefill(torch.tensor(TOKENS), prov).shape == (len(TOKENS), TINY.vocab)


@pytest.mark.parametrize("tokens,msg", [
    ("1,2,256", r"id 256 at position 2 is outside the vocabulary \[0, 256\)"),
    ("1,-3", "id -3 at position 1 is outside"),
    ("1,x,3", "'x' is not a token id"),
    (",", "--tokens is empty"),
], ids=["V", "negative", "not-int", "empty"])
def test_bad_tokens(hf_and_pack, capsys, tokens, msg):
    _, pack = hf_and_pack
    assert main(["prefill", str(pack), "--tokens", tokens]) == 2
    import re
    assert re.search(msg, capsys.readouterr().err)


def test_missing_pack_and_bad_options(hf_and_pack, tmp_path, capsys):
    _, pack = hf_and_pack
    assert main(["prefill", str(tmp_path / "nope.pack"), "--tokens", "1"]) == 2
    assert "no pack at" in capsys.readouterr().err
    junk = tmp_path / "junk.pack"
    junk.write_bytes(b"\x00" * 3)
    assert main(["prefill", str(junk), "--tokens", "1"]) == 2
    assert "not a readable strata pack" in capsys.readouterr().err
    assert main(["prefill", str(pack), "--tokens", "1", "--chunk", "0"]) == 2
    assert "--chunk must be at least 1" in capsys.readouterr().err
    assert main(["prefill", str(pack), "--tokens", "1",
                 "--dump-logits", str(tmp_path / "no" / "dir" / "x.npy")]) == 2
    assert "does not exist" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main(["prefill", str(pack), "--tokens", "1", "--device", "cuda"]) == 2
        assert "no CUDA device" in capsys.readouterr().err
