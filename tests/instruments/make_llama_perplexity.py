"""Re-make tests/data/llama_perplexity/: llama-perplexity's own figures on tiny GGUF files, the
reference `strata perplexity` is held to (tests/instruments/test_llama_perplexity.py).

    PYTHONPATH=. .venv/bin/python tests/instruments/make_llama_perplexity.py BIN [LIBDIR] \
        --sdist /tmp/lcp/llama_cpp_python-0.3.36.tar.gz --llama-python /work/lcp-venv/bin/python

BIN is llama-perplexity built from the llama-cpp-python 0.3.36 sdist's vendored llama.cpp
(ggml-org/llama.cpp@0c1e57098), CPU only; LIBDIR, when the tool links llama.cpp's shared
libraries, the folder that holds them (LD_LIBRARY_PATH). The figures here came from (BUILD):

    cmake -G Ninja vendor/llama.cpp -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
        -DBUILD_SHARED_LIBS=OFF -DLLAMA_OPENSSL=OFF
    # the compile and archive commands `ninja -t commands llama-perplexity` lists for common/,
    # vendor/cpp-httplib and tools/perplexity, one at a time under nice -n 19; then
    c++ -O3 main.cpp.o libllama-perplexity-impl.a libllama-common.a libllama-common-base.a \
        libcpp-httplib.a -L$LIB -lllama -lggml -lggml-base -lggml-cpu -ldl -lm -lgomp -lpthread
    # $LIB: the libllama / libggml*.so that the same sdist built for tests/models'
    # llama_cpp fixtures (make_llama_cpp_logits.py: GGML_NATIVE=OFF), so the library is the one
    # that gave those logits and only the tool and llama.cpp's common/ were compiled here

1. `strata synth --preset tiny --quant Q8_0`'s GGUF read by the tool: its PPL when it loads
   (strata.packs.synth_vocab: 248 bytes and 8 merges), else the refusal (a byte-level
   vocabulary of 256 tokens has no room for a merge, and llama.cpp refuses a BPE vocabulary
   without merges: what an earlier synth wrote).
2. The llama.cpp-converted Qwen3-MoE files of tests/models/data/llama_cpp (F16, Q8_0 of one
   model; the `wide` Q4_K_M is another model): perplexity over text.txt (argparse's module
   docstring, CPython 3.11.7) at -c 32 -b 32 (one window a batch) --chunks 8, an F32 KV cache
   and no flash attention (the cache the logits fixtures ask for), 2 threads; the F16 run also
   writes its KL-divergence base (qwen3moe-f16.kld, llama.cpp's own file).
3. The Q8_0 file read against that base (--kl-divergence): llama.cpp's closing statistics.
4. The other way: `strata perplexity --kld-save` of the F16 file's pack (strata's base, with its
   identity trailer) read by llama-perplexity --kl-divergence with the Q8_0 file (a record: the
   tool reads strata's base; strata's read is fp32 on this machine's CPU).
5. The Q4_K_M file's own base: its model (`qwen3moe-wide`, D = F = 256) is made again as
   tests/models/make_llama_cpp_logits.py makes it (same HF weights, tokenizer, converter to
   F32), then llama.cpp's quantizer writes its F16 and Q4_K_M files into a temp folder (SDIST:
   the converter; LLAMA_PYTHON: the llama_cpp venv). The Q4_K_M file must come out byte for byte
   the fixture (else the maker stops): the F16 is then that file's model. Its read writes
   qwen3moe-wide-f16.kld (`wide_f16`: its PPL and sha256; the GGUF itself is not kept), and the
   fixture's Q4_K_M file read against it gives `kld_wide_q4_k_m_vs_f16`.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "llama_perplexity"
GGUF = ROOT / "tests" / "models" / "data" / "llama_cpp"
TEXT = OUT / "text.txt"
COMMON = ["-c", "32", "-b", "32", "--chunks", "8", "-ctk", "f32", "-ctv", "f32", "-fa", "off",
          "-t", "2", "--seed", "0"]
BUILD = ("llama.cpp common/ + tools/perplexity compiled with the sdist's cmake (GGML_NATIVE=OFF, "
         "Release), linked to the libllama/libggml*.so the same sdist built (GGML_NATIVE=OFF): "
         "make_llama_perplexity.py's docstring")
FILES = ("qwen3moe-f16.gguf", "qwen3moe-q8_0.gguf", "qwen3moe-wide-q4_k_m.gguf")


def run(bin_: str, args: list[str], env: dict, until: str | None = None) -> tuple[int, str]:
    """The tool's exit code and output. llama.cpp's log is written by a thread that the exit
    can cut off (the last lines go missing now and then): a run whose output lacks `until` is
    run again, up to 10 times; the figures are the same every run."""
    for _ in range(10):
        p = subprocess.run([bin_, *args], capture_output=True, text=True, env=env)
        out = p.stdout + p.stderr
        if until is None or until in out:
            return p.returncode, out
    if p.returncode:
        return p.returncode, out
    raise SystemExit(f"{until!r} never reached the output of {args}")


def ppl_of(text: str) -> dict:
    m = re.search(r"Final estimate: PPL = ([\d.]+) \+/- ([\d.]+)", text)
    running = [float(x) for x in re.findall(r"\[\d+\]([\d.]+),", text)]
    return {"ppl": float(m.group(1)), "ppl_err": float(m.group(2)), "running": running}


def kld_of(text: str) -> dict:
    """Every `Name : value ± err` / `Name: value%` line of the closing blocks."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z0-9.% ()/,\-Δ]+?)\s*:\s*(-?[\d.]+)\s*(?:±\s*(-?[\d.]+))?\s*%?$",
                     line.strip())
        if m and ("KLD" in line or "Δp" in line or "PPL" in line or "top p" in line):
            out[m.group(1).strip()] = [float(m.group(2))] + ([float(m.group(3))]
                                                            if m.group(3) else [])
    return out


def main(bin_: str, libdir: str | None, sdist: str, llama_python: str) -> None:
    env = dict(os.environ)
    if libdir:
        env["LD_LIBRARY_PATH"] = libdir + os.pathsep + env.get("LD_LIBRARY_PATH", "")
    rec = {"command": " ".join(["tests/instruments/make_llama_perplexity.py", *sys.argv[1:]]),
           "llama.cpp": "ggml-org/llama.cpp@0c1e57098 (llama-cpp-python 0.3.36 sdist)",
           "text": TEXT.name, "text_sha256": hashlib.sha256(TEXT.read_bytes()).hexdigest(),
           "build": BUILD, "args": COMMON, "ppl": {}}
    with tempfile.TemporaryDirectory() as d:
        synth = Path(d) / "tiny-q8_0.gguf"
        subprocess.run([sys.executable, "-m", "strata", "synth", "--preset", "tiny", "--quant",
                        "Q8_0", "-o", str(synth)], check=True, capture_output=True,
                       env={**env, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
        rc, text = run(bin_, ["-m", str(synth), "-f", str(TEXT), *COMMON], env,
                       until="Final estimate")
        rec["synth_tiny_q8_0"] = {"command": "strata synth --preset tiny --quant Q8_0",
                                  "rc": rc}
        if rc:
            rec["synth_tiny_q8_0"]["errors"] = [ln for ln in text.splitlines()
                                                if "error" in ln.lower() or "failed" in ln][:6]
        else:
            rec["synth_tiny_q8_0"].update(ppl_of(text))
    for f in FILES:
        extra = ["--kl-divergence-base", str(OUT / "qwen3moe-f16.kld")] if "f16" in f else []
        args = ["-m", str(GGUF / f), "-f", str(TEXT), *COMMON, *extra]
        rc, text = run(bin_, args, env, until="Final estimate")
        if rc:
            raise SystemExit(f"{f}: llama-perplexity exited {rc}:\n{text[-3000:]}")
        rec["ppl"][f] = ppl_of(text)
        info = re.search(r"system_info: (.*)", text)
        rec["system_info"] = info.group(1).strip() if info else None
    args = ["-m", str(GGUF / "qwen3moe-q8_0.gguf"), "--kl-divergence-base",
            str(OUT / "qwen3moe-f16.kld"), "--kl-divergence", *COMMON]
    rc, text = run(bin_, args, env, until="Same top p:")
    if rc:
        raise SystemExit(f"--kl-divergence exited {rc}:\n{text[-3000:]}")
    rec["kld_q8_0_vs_f16"] = kld_of(text)
    rec["kld_log"] = [ln for ln in text.splitlines() if re.match(r"^\s+\d+\s", ln)]
    with tempfile.TemporaryDirectory() as d:
        pack, base = Path(d) / "f16.pack", Path(d) / "strata-f16.kld"
        senv = {**env, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        subprocess.run([sys.executable, "-m", "strata", "pack", str(GGUF / FILES[0]), "-o",
                        str(pack)], check=True, capture_output=True, env=senv, cwd=ROOT)
        subprocess.run([sys.executable, "-m", "strata", "perplexity", str(pack), "--file",
                        str(TEXT), "--ctx", "32", "--chunks", "8", "--device", "cpu",
                        "--kld-save", str(base)], check=True, capture_output=True, env=senv,
                       cwd=ROOT)
        args = ["-m", str(GGUF / "qwen3moe-q8_0.gguf"), "--kl-divergence-base", str(base),
                "--kl-divergence", *COMMON]
        rc, text = run(bin_, args, env, until="Same top p:")
        if rc:
            raise SystemExit(f"--kl-divergence of strata's base exited {rc}:\n{text[-3000:]}")
        rec["kld_q8_0_vs_strata_f16"] = kld_of(text)
    rec.update(wide_base(bin_, env, sdist, llama_python))
    rec["sha256"] = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
                     for p in sorted(OUT.glob("*.kld"))}
    (OUT / "llama_perplexity.json").write_text(json.dumps(rec, indent=1, ensure_ascii=False)
                                               + "\n")


def wide_base(bin_: str, env: dict, sdist: str, llama_python: str) -> dict:
    """Step 5 of the module doc: the wide model's F16 base and the Q4_K_M file read against it."""
    import tests.models.make_llama_cpp_logits as lcl
    from tests.models.make_llama_cpp_fixtures import convert, extract_converter, \
        save_byte_tokenizer
    fixture = GGUF / "qwen3moe-wide-q4_k_m.gguf"
    m = next(m for m in lcl.models() if m.name == "qwen3moe-wide")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        hf = tmp / m.name
        lcl.make_hf(m).save_pretrained(hf)
        save_byte_tokenizer(hf, m.shape.vocab, lcl.MERGES)
        f32 = tmp / "f32.gguf"
        convert(extract_converter(sdist, tmp), hf, "f32", f32)
        made = {fmt: tmp / f"{m.name}-{fmt.lower()}.gguf" for fmt in ("F16", "Q4_K_M")}
        for fmt, dst in made.items():
            lcl.run_llama(llama_python, dst, src=f32, fmt=fmt)
        if made["Q4_K_M"].read_bytes() != fixture.read_bytes():
            raise SystemExit(f"the re-made {m.name} Q4_K_M differs from {fixture}: its F16 "
                             f"would be another model's")
        args = ["-m", str(made["F16"]), "-f", str(TEXT), *COMMON, "--kl-divergence-base",
                str(OUT / "qwen3moe-wide-f16.kld")]
        rc, text = run(bin_, args, env, until="Final estimate")
        if rc:
            raise SystemExit(f"{m.name} F16: llama-perplexity exited {rc}:\n{text[-3000:]}")
        rec = {"wide_f16": {"file": made["F16"].name, **ppl_of(text),
                            "sha256": hashlib.sha256(made["F16"].read_bytes()).hexdigest(),
                            "made_by": "make_llama_cpp_logits.make_hf + the converter (F32) + "
                                       "llama_model_quantize MOSTLY_F16"}}
    args = ["-m", str(fixture), "--kl-divergence-base", str(OUT / "qwen3moe-wide-f16.kld"),
            "--kl-divergence", *COMMON]
    rc, text = run(bin_, args, env, until="Same top p:")
    if rc:
        raise SystemExit(f"--kl-divergence of the Q4_K_M file exited {rc}:\n{text[-3000:]}")
    rec["kld_wide_q4_k_m_vs_f16"] = kld_of(text)
    return rec


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("bin")
    ap.add_argument("libdir", nargs="?")
    ap.add_argument("--sdist", required=True)
    ap.add_argument("--llama-python", required=True)
    a = ap.parse_args()
    main(a.bin, a.libdir, a.sdist, a.llama_python)
