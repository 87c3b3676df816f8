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
sys.argv[0] = lc + "/convert_hf_to_gguf.py"
runpy.run_path(sys.argv[0], run_name="__main__")
"""
TEXT = "The quick brown fox reads long prompts through experts."


def hf_folder(d: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from tests.models.hf_tiny import TINY, make_hf_model
    make_hf_model(TINY, seed=0).save_pretrained(d)
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator([TEXT * 3], trainers.BpeTrainer(
        vocab_size=TINY.vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    PreTrainedTokenizerFast(tokenizer_object=t, eos_token="e").save_pretrained(d)
    return d


def main(sdist: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        with tarfile.open(sdist) as tf:
            keep = [m for m in tf.getmembers() if "/vendor/llama.cpp/" in m.name and any(
                p in m.name for p in ("/convert_hf_to_gguf.py", "/conversion/", "/gguf-py/"))]
            tf.extractall(tmp, members=keep, filter="data")
        lc = next(tmp.glob("*/vendor/llama.cpp"))
        hf = hf_folder(tmp / "hf")
        for outtype in ("bf16", "q8_0"):
            subprocess.run([sys.executable, "-c", _RUN, str(lc), str(hf), "--outtype", outtype,
                            "--outfile", str(OUT / f"tiny-{outtype}.gguf")], check=True)


if __name__ == "__main__":
    main(sys.argv[1])
