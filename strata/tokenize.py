"""Text -> token ids with the model's own tokenizer, through the `tokenizers` library.

A pack carries its source's tokenizer as one serialized `tokenizers.Tokenizer` (the tokenizer.json
format) in its header (strata.packs.file, `Pack.tokenizer`):
- from a GGUF: transformers' GGUF integration rebuilds it from `tokenizer.ggml.*` (tokens, merges,
  token types, pre-tokenizer) - `gguf_tokenizer(path)`;
- from a Hugging Face folder: its tokenizer.json as written, or transformers' AutoTokenizer's
  backend when the folder has only the slow files - `hf_tokenizer(folder)`.
Either is stored as `{"json": <tokenizer.json text>, "add_bos": <id or null>, "source": ...}`;
`encode` prepends the BOS id when the source says to (llama.cpp's `add_bos_token`; Qwen's is off).
No BPE is written here: the merges and pre-tokenizer are the library's.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from strata.errors import StrataError


def gguf_tokenizer(path, reader=None) -> dict | None:
    """The GGUF's tokenizer as a pack entry, or None when the file has no `tokenizer.ggml.model`
    (or one transformers cannot rebuild: a note on stderr says so; the pack then takes --tokens).
    The fields are read by gguf-py (`reader`: an open GGUFReader, else the file is opened); an
    unreadable field is the file's fault, said in one line."""
    try:    # transformers >= 5 (its GGUF integration); without it the pack takes --tokens
        from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING
    except ImportError as e:
        print(f"note: the GGUF's tokenizer is not carried into the pack (transformers' GGUF "
              f"integration is unavailable: {e}); install transformers>=5 for --prompt",
              file=sys.stderr)
        return None
    from strata.gguf_file import READ_ERRORS, open_gguf, short_error
    r = reader if reader is not None else open_gguf(path)

    def field(key):
        f = r.get_field(key)
        return None if f is None else f.contents()
    try:
        tdict = {name: v for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items()
                 if (v := field(f"tokenizer.{key}")) is not None}
        arch = field("general.architecture")
        add_bos, bos_id = field("tokenizer.ggml.add_bos_token"), field("tokenizer.ggml.bos_token_id")
    except (*READ_ERRORS, UnicodeDecodeError) as e:
        raise StrataError(f"{path}: its tokenizer metadata is unreadable ({short_error(e)}); the file "
                          f"is corrupted") from None
    if "tokens" not in tdict or "tokenizer_type" not in tdict:
        return None
    if tdict["tokenizer_type"] == "gpt2":
        tdict.setdefault("merges", [])   # a file may leave an empty merges array out
    if tdict["tokenizer_type"] == "llama" and add_bos is None:
        add_bos = True   # llama.cpp adds BOS to a sentencepiece vocabulary that does not say
    tokens = tdict["tokens"]
    bos = tokens[bos_id] if add_bos and isinstance(bos_id, int) and 0 <= bos_id < len(tokens) \
        else None
    try:
        return ggml_tokenizer(arch, tdict, bos, f"gguf:{Path(path).name}")
    except Exception as e:   # tokenizers raises bare Exceptions on vocabularies it cannot build
        print(f"note: {path}: its tokenizer cannot be rebuilt ({short_error(e)}); the pack carries "
              f"none and takes --tokens prompts", file=sys.stderr)
        return None


def ggml_tokenizer(arch: str, tdict: dict, bos: str | None, source: str) -> dict:
    """A pack entry from llama.cpp's tokenizer fields (transformers' names: tokenizer_type,
    pre_tokenizer_type, tokens, token_type, merges) rebuilt by transformers' GGUF converter;
    `bos`: the BOS token's text when the source prepends one, else None."""
    from transformers.integrations.gguf import convert_gguf_tokenizer
    tok, _ = convert_gguf_tokenizer(arch, tdict)
    return {"json": tok.to_str(), "add_bos": None if bos is None else tok.token_to_id(bos),
            "source": source}


def hf_tokenizer(folder) -> dict | None:
    """A Hugging Face folder's tokenizer as a pack entry, or None when it has none."""
    folder = Path(folder)
    fast = folder / "tokenizer.json"
    if fast.is_file():
        from tokenizers import Tokenizer
        try:
            text = Tokenizer.from_file(str(fast)).to_str()
        except Exception as e:   # the library raises a bare Exception on a malformed file
            raise StrataError(f"{fast} is not a readable tokenizer.json ({str(e)[:120]}); fix or "
                              f"re-download it") from None
        bos = _hf_bos(folder)
        return {"json": text, "add_bos": bos, "source": f"hf:{folder.name}"}
    if not any((folder / n).is_file() for n in ("vocab.json", "tokenizer.model")):
        return None
    from transformers import AutoTokenizer
    t = AutoTokenizer.from_pretrained(str(folder))
    bos = t.bos_token_id if getattr(t, "add_bos_token", False) else None
    return {"json": t.backend_tokenizer.to_str(), "add_bos": bos, "source": f"hf:{folder.name}"}


def _hf_bos(folder: Path):
    """The BOS id when tokenizer_config.json asks for it (add_bos_token true), else None."""
    cfg = folder / "tokenizer_config.json"
    if not cfg.is_file():
        return None
    try:
        c = json.loads(cfg.read_text())
    except (ValueError, UnicodeDecodeError):
        return None
    if not c.get("add_bos_token"):
        return None
    bos = c.get("bos_token")
    bos = bos.get("content") if isinstance(bos, dict) else bos
    if bos is None:
        return None
    from tokenizers import Tokenizer
    return Tokenizer.from_file(str(folder / "tokenizer.json")).token_to_id(bos)


class TextTokenizer:
    """A pack's tokenizer: `encode(text) -> list[int]`, `piece(id) -> str` (for reports)."""

    def __init__(self, entry: dict):
        from tokenizers import Tokenizer
        self._tok = Tokenizer.from_str(entry["json"])
        self.add_bos = entry.get("add_bos")
        self.source = entry.get("source", "")

    def encode(self, text: str, *, specials: bool = True) -> list[int]:
        """The ids of `text` (the BOS first when the source adds one). specials=False reads the
        special tokens written in the text as plain text, as llama.cpp does with parse_special
        off (llama-perplexity's tokenization)."""
        self._tok.encode_special_tokens = not specials
        try:
            ids = self._tok.encode(text, add_special_tokens=False).ids
        finally:
            self._tok.encode_special_tokens = False
        return ([int(self.add_bos)] if self.add_bos is not None else []) + ids

    def piece(self, i: int) -> str:
        """Token i as text (byte-level pieces decoded; a partial UTF-8 sequence shows as U+FFFD)."""
        return self._tok.decode([i], skip_special_tokens=False)


def pack_tokenizer(pack) -> TextTokenizer:
    """The pack's tokenizer; one line saying how to get one when the pack has none."""
    entry = pack.tokenizer
    if entry is None:
        raise StrataError(f"{pack.path} carries no tokenizer (packed from a file without one, or "
                          f"by an older strata); re-pack it from a GGUF or Hugging Face folder "
                          f"with a tokenizer, or give --tokens")
    return TextTokenizer(entry)


def show_tokens(tok: TextTokenizer, ids: list[int], n: int = 4) -> str:
    """The first and last n tokens as `id 'piece'`, for the report."""
    def one(i):
        return f"{i} {tok.piece(i)!r}"
    if len(ids) <= 2 * n:
        return ", ".join(map(one, ids))
    return ", ".join(map(one, ids[:n])) + " ... " + ", ".join(map(one, ids[-n:]))
