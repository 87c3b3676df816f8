"""The tokenizer every synthetic model carries: a byte-level BPE vocabulary of exactly V tokens
with merges learned from a fixed text (so every synth file of one V has the same vocabulary),
written into a GGUF as llama.cpp's gpt2 / qwen2 tokenizer (strata.packs.synth_gguf) and into a
pack by the path a GGUF import takes (synth_tokenizer).

llama.cpp refuses a BPE vocabulary without merges ("cannot find tokenizer merges"): below
256 + 3 + SMALL_MERGES tokens, the top SMALL_MERGES bytes (0xF8..0xFF, never in UTF-8) give
their places to as many merges (as tests/models/make_llama_cpp_fixtures.save_byte_tokenizer).
"""
from __future__ import annotations

import sys

# The text synth's BPE merges are learned from (fixed, so every synth file has the same vocabulary).
_CORPUS = (
    "strata reads long prompts through mixture-of-experts models whose experts do not fit in GPU "
    "memory. The experts stream from host memory through a ring of slots while the kernels compute "
    "on quantized blocks; the chunk, the ring, the cache and the scratch are planned together as "
    "one byte budget. The quick brown fox jumps over the lazy dog. Tokens per second, bytes per "
    "token, the copy rate of the bus and the time the compute waits on copies are what it reports. "
    "def prefill(tokens, chunk=4096): return [t + 1 for t in tokens if t >= 0]  # 0123456789\n"
)
SYNTH_MERGES = 400   # at most this many learned merges (the rest of V: unused placeholders)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
SMALL_MERGES = 8     # merges of a vocabulary too small for the specials and merges both


def _byte_tokens() -> list[str]:
    """GPT-2's bytes_to_unicode: byte b as one printable character, in byte order."""
    from tokenizers.pre_tokenizers import ByteLevel
    alphabet = set(ByteLevel.alphabet())
    printable = [b for b in range(256) if chr(b) in alphabet]
    spelled, n = {}, 0
    for b in range(256):
        if b in printable:
            spelled[b] = chr(b)
        else:
            spelled[b] = chr(256 + n)
            n += 1
    assert set(spelled.values()) == alphabet, "the library's byte alphabet is GPT-2's"
    return [spelled[b] for b in range(256)]


def _learned_merges(n: int) -> list[tuple[str, str]]:
    """Up to n byte-level BPE merges learned by the `tokenizers` library from _CORPUS, in order."""
    import json
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    if n <= 0:
        return []
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=256 + n, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([_CORPUS] * 4, trainer)
    merges = json.loads(tok.to_str())["model"]["merges"]
    return [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in merges][:n]


def _vocab(V: int) -> tuple[list[str], list[int], list[str], int]:
    """A byte-level BPE vocabulary of exactly V tokens (tokens, ggml token types, merges, eos):
    the 256 byte tokens in byte order, merges learned by `tokenizers` from _CORPUS (each merge's
    token after them, in merge order), unused placeholders, then Qwen's three control tokens.
    Below 256 + 3 + SMALL_MERGES tokens: the first V - SMALL_MERGES byte tokens and
    SMALL_MERGES merges, no specials (text with the left-out bytes cannot be encoded). Below 256
    tokens the merges' own bytes would be left out (BPE refuses a merge of a token it lacks), so
    such a vocabulary is its first V byte tokens only, without merges (llama.cpp does not load it;
    strata reads it)."""
    byte_tok = _byte_tokens()
    if V < 256:
        return byte_tok[:V], [1] * V, [], V - 1
    if V < 256 + len(SPECIALS) + SMALL_MERGES:
        pairs = _learned_merges(SMALL_MERGES)
        tokens = byte_tok[:V - SMALL_MERGES] + [a + b for a, b in pairs]
        return tokens, [1] * V, [f"{a} {b}" for a, b in pairs], V - 1
    n_free = V - 256 - len(SPECIALS)
    pairs = _learned_merges(min(n_free, SYNTH_MERGES))
    merged = [a + b for a, b in pairs]
    fill = [f"<|synth_{i}|>" for i in range(n_free - len(merged))]
    tokens = byte_tok + merged + fill + SPECIALS
    # placeholders NORMAL (no merge makes them, so text never maps to one), specials CONTROL
    types = [1] * (256 + len(merged) + len(fill)) + [3] * len(SPECIALS)
    return tokens, types, [f"{a} {b}" for a, b in pairs], V - len(SPECIALS)


def synth_tokenizer(V: int) -> dict | None:
    """synth's tokenizer as a pack entry: the GGUF metadata synth_gguf writes, rebuilt by the
    same transformers path a GGUF import takes (so synth_pack and synth_gguf -> pack agree)."""
    from strata.tokenize import ggml_tokenizer
    tokens, types, merges, _ = _vocab(V)
    try:
        import transformers.integrations.gguf as hf_gguf
        hf_gguf.convert_gguf_tokenizer      # transformers >= 5.24 (strata[text])
    except (ImportError, AttributeError):
        # the weights do not need it: a pack without a tokenizer reads --tokens prompts
        print("note: transformers >= 5.24 (pip install 'strata[text]') is not installed: the "
              "synthetic pack carries no tokenizer and reads --tokens prompts", file=sys.stderr)
        return None
    return ggml_tokenizer("qwen3moe", {"tokenizer_type": "gpt2", "pre_tokenizer_type": "qwen2",
                                       "tokens": tokens, "token_type": types, "merges": merges},
                          bos=None, source="synth")


