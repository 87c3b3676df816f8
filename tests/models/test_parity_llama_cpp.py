"""Files written by llama.cpp's own converter (convert_hf_to_gguf.py from the llama-cpp-python
0.3.36 sdist; tests/models/make_llama_cpp_fixtures.py says how they were made) from the tiny random
transformers Qwen3MoeForCausalLM `make_hf_model(TINY, seed=0)`:

- tiny-bf16.gguf (`--outtype bf16`: matrices BF16, norms F32): `strata pack` -> `strata prefill`
  gives the logits of the transformers model the file was converted from (its weights are
  BF16-exact, so lossless), FP32_REL = 1e-5 as tests/models/test_parity_packs (fp32 on both sides,
  arithmetic order only).
- tiny-q8_0.gguf (`--outtype q8_0`: experts and dense matrices Q8_0 by llama.cpp's quantizer):
  the logits of transformers run on the file's weights decoded by gguf-py, the same FP32_REL
  (identical weights: strata's Q8_0 decoder is bit-exact with gguf-py's).
- the tokenizer the converter wrote (tokenizer.ggml.*, pre-tokenizer qwen2) is carried into the
  pack and encodes as the Hugging Face tokenizer it came from.
"""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from strata.cli import main
from strata.packs import Pack
from strata.tokenize import TextTokenizer
from tests.models.hf_tiny import TINY, make_hf_model
from tests.models.test_parity_mixes import hf_from_gguf, rel

DATA = Path(__file__).parent / "data"
FP32_REL = 1e-5
TOKENS = [3, 250, 17, 17, 0, 128, 64, 9, 200, 31, 5, 77, 1]


def _pack_and_prefill(src, tmp_path, tokens):
    pack = tmp_path / "p.pack"
    assert main(["pack", str(src), "-o", str(pack)]) == 0
    out = tmp_path / "l.npy"
    assert main(["prefill", str(pack), "--tokens", ",".join(map(str, tokens)), "--device", "cpu",
                 "--experts", "ref", "--chunk", "4", "--dump-logits", str(out)]) == 0
    return pack, np.load(out)


def test_converter_bf16_matches_the_transformers_model(tmp_path):
    src = DATA / "tiny-bf16.gguf"
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(src)).tensors}
    assert types["blk.0.ffn_gate_exps.weight"] == "BF16" and types["blk.0.attn_norm.weight"] == "F32"
    hf = make_hf_model(TINY, seed=0)
    emb = gguf.GGUFReader(str(src)).get_tensor(1)
    assert emb.name == "token_embd.weight"
    # the fixture is this model (a torch RNG change would show here, not as a logits mismatch)
    got_emb = torch.from_numpy(np.asarray(emb.data).copy()).view(torch.bfloat16).float()
    assert torch.equal(got_emb.reshape(TINY.vocab, TINY.d_model), hf.model.embed_tokens.weight)
    _, got = _pack_and_prefill(src, tmp_path, TOKENS)
    with torch.no_grad():
        want = hf(torch.tensor([TOKENS])).logits[0].numpy()
    assert rel(got, want) < FP32_REL


def test_converter_q8_0_matches_transformers_on_its_weights(tmp_path):
    src = DATA / "tiny-q8_0.gguf"
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(src)).tensors}
    assert {types[f"blk.{i}.ffn_{m}_exps.weight"] for i in range(2) for m in
            ("gate", "up", "down")} == {"Q8_0"}
    pack, got = _pack_and_prefill(src, tmp_path, TOKENS)
    assert {m.fmt.name for pl in Pack.open(pack).layers for m in pl.layout.matrices} == {"Q8_0"}
    with torch.no_grad():
        want = hf_from_gguf(src, TINY)(torch.tensor([TOKENS])).logits[0].numpy()
    assert rel(got, want) < FP32_REL


@pytest.mark.parametrize("name", ["tiny-bf16.gguf", "tiny-q8_0.gguf"])
def test_converter_tokenizer_is_carried(name, tmp_path, capsys):
    src = DATA / name
    pack = tmp_path / "t.pack"
    assert main(["pack", str(src), "-o", str(pack)]) == 0
    tok = TextTokenizer(Pack.open(pack).tokenizer)
    r = gguf.GGUFReader(str(src))
    assert r.get_field("tokenizer.ggml.pre").contents() == "qwen2"
    vocab = r.get_field("tokenizer.ggml.tokens").contents()
    text = "The quick brown fox, 42 experts."
    ids = tok.encode(text)
    # the file's byte-level vocabulary spells the UTF-8 bytes back (TINY's 256 ids are bytes)
    from strata.packs.synth_vocab import _byte_tokens
    assert "".join(vocab[i] for i in ids) == "".join(_byte_tokens()[b] for b in text.encode())
    assert main(["prefill", str(pack), "--prompt", text, "--device", "cpu",
                 "--experts", "ref"]) == 0
    assert f"prompt: {len(ids)} tokens from --prompt" in capsys.readouterr().out
