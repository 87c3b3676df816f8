"""Re-make tests/models/data/llama_cpp_synth/: llama.cpp's logits of `strata synth`'s tiny GGUF of
every architecture (test_llama_cpp_synth.py compares strata's read of the same files).

    PYTHONPATH=. .venv/bin/python tests/models/make_llama_cpp_synth.py /work/lcp-venv/bin/python

(the second interpreter: the llama_cpp venv of make_llama_cpp_logits.py, llama-cpp-python
0.3.36, llama.cpp ggml-org/llama.cpp@0c1e57098, CPU.) Under a minute on 2 cores.

Per file of FILES (a tiny-<arch> preset, a stock mix or expert format, seed 0):
1. `strata synth --preset P ... --seed 0 -o F` (the argv in synth.json); synth is deterministic,
   so the GGUFs are not committed: their sha256 is, and the test re-synthesizes them;
2. the prompt (`pick_prompt`, as make_llama_cpp_logits picks): TOKENS, else the first of seeded random
   prompts whose every routing decision strata makes alike with and without llama.cpp's
   rounding, under the rounding's largest error and under fp32 order;
3. llama.cpp's logits of it (make_llama_cpp_logits.run_llama: the same Llama context as the
   converted fixtures, F32 KV, no BOS) -> `<name>.logits.npy` (float32 [T, V]);
4. synth.json: the command, each file's argv, sha256, tensor types, prompt and routed rows, and
   the sha256 of every .npy.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import sys
import tempfile
from pathlib import Path

import torch

OUT = Path(__file__).parent / "data" / "llama_cpp_synth"
SEED = 0
# name -> (preset, synth options): each architecture with Q8_0 experts and F32 dense tensors
# (synth's default BF16 dense: llama.cpp's bf16 rounding of the activations changes a routing
# decision on every prompt tried, so no row is comparable at that rounding's size), in
# llama.cpp's Q4_K_M mix (at D 64 its K-quant rows fall back to Q5_0 / Q5_1 / Q8_0 as llama.cpp's
# quantizer does), and gpt-oss in MXFP4_MOE
_Q8 = ["--quant", "Q8_0", "--dense-type", "F32"]
FILES = {
    "qwen3moe-q8_0": ("tiny-qwen3moe", _Q8),
    "mixtral-q8_0": ("tiny-mixtral", _Q8),
    "gpt-oss-q8_0": ("tiny-gpt-oss", _Q8),
    "deepseek2-q8_0": ("tiny-deepseek2", _Q8),
    "glm4moe-q8_0": ("tiny-glm4moe", _Q8),
    "minimax-m2-q8_0": ("tiny-minimax-m2", _Q8),
    "qwen3next-q8_0": ("tiny-qwen3next", _Q8),
    # Qwen3.5-MoE with F32 experts: with Q8_0 experts the emulated read meets llama.cpp (2e-5,
    # EMULATED 3.5e-4, two q8 codes tipped by fp32 order, one in layer 2's expert input at row
    # 2, which the full-attention layer carries to later rows), but strata's own read misses
    # PLAIN (0.28 against 0.24: this tiny hybrid moves its logits by their own size under q8's
    # rounding, past what two random-sign draws of it show)
    "qwen35moe-f32": ("tiny-qwen35moe", ["--quant", "F32", "--dense-type", "F32"]),
    "qwen3moe-q4_k_m": ("tiny-qwen3moe", ["--mix", "Q4_K_M"]),
    "mixtral-q4_k_m": ("tiny-mixtral", ["--mix", "Q4_K_M"]),
    "gpt-oss-q4_k_m": ("tiny-gpt-oss", ["--mix", "Q4_K_M"]),
    "deepseek2-q4_k_m": ("tiny-deepseek2", ["--mix", "Q4_K_M"]),
    "glm4moe-q4_k_m": ("tiny-glm4moe", ["--mix", "Q4_K_M"]),
    "gpt-oss-mxfp4_moe": ("tiny-gpt-oss", ["--mix", "MXFP4_MOE"]),
    # the hybrids in a stock mix: the DeltaNet conv stays F32 as llama-quantize leaves it (an
    # F16 one aborts llama.cpp's ssm_conv, CPU and CUDA alike)
    "qwen35moe-q4_k_m": ("tiny-qwen35moe", ["--mix", "Q4_K_M"]),
    "qwen3next-q4_k_m": ("tiny-qwen3next", ["--mix", "Q4_K_M"]),
    "minimax-m2-q4_k_m": ("tiny-minimax-m2", ["--mix", "Q4_K_M"]),
    "qwen35moe-iq4_xs": ("tiny-qwen35moe", ["--mix", "IQ4_XS"]),
    "deepseek2-q2_k": ("tiny-deepseek2", ["--mix", "Q2_K"]),
}


def argv(name: str, out: Path) -> list[str]:
    preset, opts = FILES[name]
    return ["synth", "--preset", preset, *opts, "--seed", str(SEED), "-o", str(out)]


def synth(args: list[str]) -> None:
    """`strata synth` in this process (quiet)."""
    from strata.cli import main
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(args) == 0


def pick_prompt(f: Path, n: int, work: Path) -> tuple[list[int], int]:
    """make_llama_cpp_logits.pick_prompt's pick for one file, a prompt whose first row already
    routes otherwise counting 0 rows."""
    from tests.models.make_llama_cpp_logits import candidates, routed_rows
    best_rows, best = -1, None
    for i, toks in enumerate(candidates(n)):
        try:
            rows = routed_rows([f], toks, work)
        except ValueError:   # no row left to compare (the bound over zero rows)
            rows = 0
        print(f"  prompt {i}: {rows} of {n} rows routed alike", flush=True)
        if rows == n:
            return toks, rows
        if rows > best_rows:
            best_rows, best = rows, toks
    return best, best_rows


def main(llama_python: str) -> None:
    from tests.models.make_llama_cpp_logits import LLAMA_CTX, TOKENS, run_llama, tensor_types
    torch.set_num_threads(1)
    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.iterdir():
        old.unlink()
    info = {"command": "PYTHONPATH=. .venv/bin/python tests/models/make_llama_cpp_synth.py "
                       "/work/lcp-venv/bin/python",
            "llama.cpp": "ggml-org/llama.cpp@0c1e57098", "seed": SEED, "llama_ctx": LLAMA_CTX,
            "files": {}}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name in FILES:
            f = tmp / f"{name}.gguf"
            synth(argv(name, f))
            toks, rows = pick_prompt(f, len(TOKENS), tmp)
            info.update(run_llama(llama_python, f, prompts=[(OUT / f"{name}.logits.npy", toks)]))
            types = tensor_types(f)
            info["files"][name] = {
                "argv": argv(name, Path("OUT"))[:-1], "tokens": toks, "routed_rows": rows,
                "sha256": hashlib.sha256(f.read_bytes()).hexdigest(), "bytes": f.stat().st_size,
                "types": {t: sorted(n for n, v in types.items() if v == t)
                          for t in sorted(set(types.values()))}}
            print(name, "done", rows, flush=True)
    info["sha256"] = {f.name: hashlib.sha256(f.read_bytes()).hexdigest()
                      for f in sorted(OUT.iterdir())}
    (OUT / "synth.json").write_text(json.dumps(info, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
