"""llama.cpp's logits of the windows llama-perplexity scored (tests/data/llama_perplexity):
each base file's windows (its tokens, -c 32: 8 windows; the Qwen3-MoE vocabulary adds no BOS, so
a window is read as written) read by llama.cpp's CPU backend from the quantized fixture file,
each window one prompt, as tests/models/make_llama_cpp_logits.py reads its prompts
(`run_llama`: llama-cpp-python 0.3.36, LLAMA_CTX: F32 KV cache, no flash attention, 2 threads).
llama-perplexity links the same libllama: its F16 base rows are these logits' log-softmax to
within the rows' 16-bit step. Writes <file>.windows.npy (float32 [8, 32, V]) and
llama_perplexity_logits.json (the command, llama.cpp's build, the hashes).

    PYTHONPATH=. python tests/instruments/make_llama_perplexity_logits.py /work/lcp-venv/bin/python
"""
from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "llama_perplexity"
GGUF = ROOT / "tests" / "models" / "data" / "llama_cpp"
FILES = {"qwen3moe-q8_0.gguf": "qwen3moe-f16.kld",
         "qwen3moe-wide-q4_k_m.gguf": "qwen3moe-wide-f16.kld"}


def main(llama_python: str) -> None:
    from strata.instruments.kldfile import Base
    from tests.models.make_llama_cpp_logits import run_llama
    rec = {"command": f"tests/instruments/make_llama_perplexity_logits.py {llama_python}",
           "files": {}}
    for fname, kfile in FILES.items():
        base = Base.open(OUT / kfile)
        windows = base.tokens.view(base.n, base.ctx).tolist()
        with tempfile.TemporaryDirectory() as tmp:
            outs = [Path(tmp) / f"{i}.npy" for i in range(base.n)]
            info = run_llama(llama_python, GGUF / fname, prompts=list(zip(outs, windows)))
            logits = np.stack([np.load(o) for o in outs]).astype(np.float32)
        dst = OUT / f"{fname[:-len('.gguf')]}.windows.npy"
        np.save(dst, logits)
        rec.update(info)
        rec["files"][dst.name] = {"file": fname, "base": kfile, "shape": list(logits.shape),
                                  "sha256": hashlib.sha256(dst.read_bytes()).hexdigest()}
    (OUT / "llama_perplexity_logits.json").write_text(json.dumps(rec, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
