"""Re-make tests/models/data/tiny-{bf16,q8_0}.gguf with llama.cpp's own converter.

    python -m pip download --no-deps --no-binary :all: llama-cpp-python -d /tmp/lcp
    PYTHONPATH=. python tests/models/make_llama_cpp_fixtures.py /tmp/lcp/llama_cpp_python-*.tar.gz

The fixtures were made with llama-cpp-python 0.3.36's vendored llama.cpp (convert_hf_to_gguf.py,
its `conversion` package and gguf-py 0.19.0), from make_hf_model(TINY, seed=0) saved by
transformers with a byte-level BPE tokenizer trained by `tokenizers` (TINY's 256 ids are all
bytes, so no merges). Only those three parts are extracted, into a temp folder, and run in a
subprocess with the vendored gguf-py first on its path (as the converter expects).

One change to the converter's behaviour, and why: it names the pre-tokenizer by hashing the
tokenization of a fixed text against a table of released tokenizers; a freshly trained tokenizer
is in no table, so `get_vocab_base_pre` is made to answer "qwen2" (what a Qwen3 GGUF says).
A llama-arch conversion (Mixtral) imports sentencepiece before it looks for a tokenizer.model;
without that file it falls through to the HF tokenizer, so `_create_vocab_sentencepiece` raises
the FileNotFoundError it would raise after the import (sentencepiece need not be installed).
"""
from __future__ import annotations

import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

OUT = Path(__file__).parent / "data"
_RUN = """
import runpy, sys
lc = sys.argv.pop(1)
sys.path[:0] = [lc, lc + "/gguf-py"]
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
spm = base.TextModel._create_vocab_sentencepiece
def no_spm(self):   # without a tokenizer.model: what it raises once sentencepiece is imported
    if not (self.dir_model / "tokenizer.model").is_file():
        raise FileNotFoundError(self.dir_model / "tokenizer.model")
    return spm(self)
base.TextModel._create_vocab_sentencepiece = no_spm
sys.argv[0] = lc + "/convert_hf_to_gguf.py"
runpy.run_path(sys.argv[0], run_name="__main__")
"""
TEXT = "The quick brown fox reads long prompts through experts."


def save_byte_tokenizer(d: Path, vocab: int, merges: int = 0, specials: tuple = ()) -> None:
    """A byte-level BPE tokenizer of `vocab` ids saved into d, as transformers saves one (what
    the converter reads): with merges 0 and vocab 256 all bytes and no merges; `merges` > 0
    leaves that many of the bytes 0xFF, 0xFE, ... (never in UTF-8) out of the alphabet and
    learns that many merges in their place (llama.cpp refuses a BPE vocabulary without merges);
    `specials` (special tokens, ids first) take the places of as many of those merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    alphabet = [c for c in pre_tokenizers.ByteLevel.alphabet()   # char c is byte ord(c) here
                if not 0xFF - merges < ord(c) <= 0xFF]
    t.train_from_iterator([TEXT * 3], trainers.BpeTrainer(
        vocab_size=vocab, initial_alphabet=alphabet, special_tokens=list(specials),
        show_progress=False))
    PreTrainedTokenizerFast(tokenizer_object=t, eos_token="e").save_pretrained(d)


def hf_folder(d: Path) -> Path:
    from tests.models.hf_tiny import TINY, make_hf_model
    make_hf_model(TINY, seed=0).save_pretrained(d)
    save_byte_tokenizer(d, TINY.vocab)
    return d


def extract_converter(sdist: str, tmp: Path) -> Path:
    """convert_hf_to_gguf.py, its `conversion` package and gguf-py from the sdist into tmp;
    returns the vendored llama.cpp folder."""
    with tarfile.open(sdist) as tf:
        keep = [m for m in tf.getmembers() if "/vendor/llama.cpp/" in m.name and any(
            p in m.name for p in ("/convert_hf_to_gguf.py", "/conversion/", "/gguf-py/"))]
        tf.extractall(tmp, members=keep, filter="data")
    return next(tmp.glob("*/vendor/llama.cpp"))


def convert(lc: Path, hf: Path, outtype: str, outfile: Path, extra: tuple = ()) -> None:
    """The vendored converter on the HF folder (in a subprocess, its gguf-py first, the
    pre-tokenizer patch above); `extra`: more of its flags."""
    subprocess.run([sys.executable, "-c", _RUN, str(lc), str(hf), "--outtype", outtype,
                    "--outfile", str(outfile), *extra], check=True)


def main(sdist: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        lc = extract_converter(sdist, tmp)
        hf = hf_folder(tmp / "hf")
        for outtype in ("bf16", "q8_0"):
            convert(lc, hf, outtype, OUT / f"tiny-{outtype}.gguf")


if __name__ == "__main__":
    main(sys.argv[1])
