"""The text is tokenized as llama-perplexity tokenizes it: special tokens written in the text
are plain text (llama.cpp's parse_special off), while `strata prefill` keeps them whole."""
from __future__ import annotations

from strata.packs.synth_vocab import SPECIALS, synth_tokenizer
from strata.tokenize import TextTokenizer


def test_special_tokens_in_the_text_are_text_when_asked():
    tok = TextTokenizer(synth_tokenizer(300))     # byte tokens, merges, then Qwen's specials
    special = 300 - len(SPECIALS) + SPECIALS.index("<|im_end|>")
    text = "a<|im_end|>b"
    assert special in tok.encode(text)
    plain = tok.encode(text, specials=False)
    assert special not in plain and len(plain) > 3
    assert tok.encode(text) == tok.encode(text, specials=True)     # the default is restored
