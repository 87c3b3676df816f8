"""Re-make tests/models/data/llama_cpp/: tiny models of every architecture strata reads, converted
by llama.cpp's own converter, quantized by llama.cpp's quantizer and read by llama.cpp (CPU).

    python -m pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d /tmp/lcp
    python -m venv /work/lcp-venv
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_CUDA=OFF -DGGML_METAL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF" MAKEFLAGS=-j2 CMAKE_BUILD_PARALLEL_LEVEL=2 \
        /work/lcp-venv/bin/pip install /tmp/lcp/llama_cpp_python-0.3.36.tar.gz
    PYTHONPATH=. .venv/bin/python tests/models/make_llama_cpp_logits.py \
        /tmp/lcp/llama_cpp_python-0.3.36.tar.gz /work/lcp-venv/bin/python [--only ARCH,...]

(`--only`: re-make only the models of those architectures (strata names, e.g. minimax-m2):
their files are replaced, every other file and llama_cpp.json's other entries are kept, the
sha256 list is redone over the folder; the model's entry records the command that made it.)

(strata's .venv runs this script: transformers 5, torch, gguf-py; the second interpreter is the
separate venv with the llama_cpp package built from the same sdist: llama-cpp-python 0.3.36,
llama.cpp ggml-org/llama.cpp@0c1e57098, CPU backend with GGML_NATIVE=OFF, which x86-64 builds
with AVX2/F16C/FMA/BMI2, llamafile sgemm and the CPU repack buffers: llama_cpp.json's
system_info.) A few minutes on 2 cores.

Per model (an HF model of `MODELS`, seed 0, weights exact in BF16 and in F16: `make_hf`; its
byte-level BPE tokenizer from tests/models/make_llama_cpp_fixtures.save_byte_tokenizer):
1. save_pretrained, then the vendored convert_hf_to_gguf.py (make_llama_cpp_fixtures.convert:
   its `conversion` package and gguf-py from the sdist) with `--outtype f32` into a temp file;
2. in the llama_cpp venv (`_LLAMA` below): `llama_model_quantize` of that F32 file with
   llama_model_quantize_default_params (nthread 2) and ftype LLAMA_FTYPE_MOSTLY_{F16, Q8_0,
   Q4_K_M} -> `<name>-<fmt>.gguf` (the YaRN model's F32 file is kept as it is);
3. the prompt (`pick_prompt`): TOKENS, else the first of seeded random prompts of the same
   length, whose every routing decision strata makes alike with and without llama.cpp's
   rounding, under the rounding's largest error and under fp32 order
   (test_llama_cpp_logits.file_reads' `rows` and `routed_alike` over all of the model's
   files); if none of `TRIES` does, the one with the most such rows;
4. transformers' logits of the prompt -> `<name>.hf_logits.npy` (float32 [T, V]); llama.cpp's:
   `Llama(path, logits_all=True, n_ctx=64, n_batch=64, n_ubatch=64, n_threads=2,
   type_k=type_v=GGML_TYPE_F32, flash_attn=False, yarn_beta_fast=-1, yarn_beta_slow=-1)`,
   `eval(tokens)`, `scores[:T]` -> `<name>-<fmt>.logits.npy` (float32 [T, V]). eval takes the
   ids as they are: no BOS is added (n_tokens == T is checked). The KV cache is F32 (llama.cpp's
   default is F16) so that the only roundings llama.cpp adds are those of the activations before
   its weight products (the test's docstring); the betas -1 read the file's (llama-cpp-python
   passes 32 / 1 otherwise).
5. `llama_cpp.json`: each model's prompt(s), shape and the rows its prompt routes alike, the
   versions, the context settings, each GGUF's tensors' ggml types, the sha256 of every other
   file of the folder, and this command.

Two shapes per architecture (the files must stay small and are read as they are, so none is
regenerated at test time): the `small` one of the other tests (D 64/96, experts of 32/64) for
F16 and Q8_0, which need rows of a multiple of 32 (or nothing); a `wide` one for Q4_K_M with
D = expert width = 256, because a K-quant needs rows of a multiple of 256 (llama.cpp's quantizer
falls back to Q5_0 / Q8_0 / F16 for a row that is not: those tensors are listed in the JSON).
The hybrids have the small shape only, Q4_K_M included, some files as models of their own
(`HYBRID_QUANT`: e.g. `qwen35moe-mix-q4_k_m.gguf`).

What is patched, and why:
- the pre-tokenizer name (make_llama_cpp_fixtures._RUN: "qwen2"; a fresh tokenizer hashes to no
  released one);
- the tokenizer keeps 248 bytes and learns 8 merges (the bytes 0xF8-0xFF, never in UTF-8, are
  left out): llama.cpp refuses a BPE vocabulary without merges ("cannot find tokenizer merges").
- GPT-OSS: the SwiGLU limit is 7 (llama.cpp fixes it, the converter writes none) where
  hf_archs' GPT_OSS_TINY uses 2; gate/up are scaled so some pre-activations still pass 7.
- DeepSeek: the release's scoring_func / topk_method keys (DS_RELEASE_KEYS) written back into
  config.json (transformers does not save them; the converter reads them).
- MiniMax-M2: the release's scoring_func (MINIMAX_RELEASE_KEYS) written back into config.json:
  without it the converter writes no expert_gating_func, and llama.cpp's minimax-m2 graph has
  no gating function (it stops).
- Qwen3-Next / Qwen3.5-MoE (small files only): converted with --no-mtp (the converter expects
  MTP layers otherwise); Qwen3.5's config.json gets rope_parameters.mrope_section [1, 1, 0]
  (the converter's default [11, 11, 10] is wider than the tiny heads' 2 rotary pairs, which
  llama.cpp refuses; over text any sections covering the pairs rotate alike, as transformers
  does) and, for the conversion only, model_type qwen3_next (transformers' AutoTokenizer reads
  a qwen3_5_moe_text folder's tokenizer as Qwen3_5Tokenizer, which adds a token past the
  vocabulary that the converter refuses).

deepseek2-yarn-f32.gguf: DS_TINY with YaRN in the HF config (rope_scaling `YARN` below: factor 40
over an original context of 32, so TOKENS' positions stay inside it and `long_tokens()`' cross
it), converted as it is (F32: llama.cpp rounds nothing); `deepseek2-yarn.hf_logits.npy`,
`deepseek2-yarn-long.hf_logits.npy` (transformers), `deepseek2-yarn-f32.logits.npy`,
`deepseek2-yarn-f32-long.logits.npy` (llama.cpp), `deepseek2-yarn.config.json` (the HF folder's
config.json). `make_ds_yarn()` rebuilds the HF model.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from strata.shapes import Mla, ModelShape

OUT = Path(__file__).parent / "data" / "llama_cpp"
TOKENS = [3, 250, 17, 17, 0, 128, 64, 9, 200, 31, 5, 77, 1]
SEED = 0
# routers (not the YaRN model's) this many times the other tests' scale: more of the prompts
# route alike under llama.cpp's rounding (a sigmoid router's saturated scores leave the choice
# to the correction bias, which no rounding moves)
ROUTER_GAIN = {"deepseek2": 4.0, "glm4moe": 4.0, "minimax-m2": 4.0}
ROUTER_GAIN_DEFAULT = 2.0
# candidate prompts tried for one whose every routing decision the rounding leaves alone
TRIES = 40
MERGES = 8
# keys of deepseek-ai/DeepSeek-V3's config.json that transformers' DeepseekV3Config does not
# save back: without scoring_func the converter writes no expert_gating_func, which llama.cpp
# reads as softmax (DeepSeek-V2's router)
DS_RELEASE_KEYS = {"scoring_func": "sigmoid", "topk_method": "noaux_tc"}
# MiniMaxAI/MiniMax-M2's config.json key that MiniMaxM2Config does not save back (see above)
MINIMAX_RELEASE_KEYS = {"scoring_func": "sigmoid"}
RELEASE_KEYS = {"deepseek2": DS_RELEASE_KEYS, "minimax-m2": MINIMAX_RELEASE_KEYS}
# the added tokens the converter's GLM vocabulary looks up (_set_vocab_glm)
GLM_SPECIALS = ("[gMASK]", "<|user|>", "<|endoftext|>", "<|observation|>")
LLAMA_CTX = dict(logits_all=True, n_ctx=64, n_batch=64, n_ubatch=64, n_threads=2,
                 n_threads_batch=2, flash_attn=False, type_k="F32", type_v="F32",
                 yarn_beta_fast=-1.0, yarn_beta_slow=-1.0)
# F16's smallest normal: a BF16 value below it may not be exact in F16 (its subnormals'
# spacing is 2^-24), so make_hf zeroes those and the F16 file holds the HF weights exactly
F16_TINY = 2.0 ** -14
YARN = {"rope_type": "yarn", "type": "yarn", "factor": 40.0,
        "original_max_position_embeddings": 32, "beta_fast": 32.0, "beta_slow": 1.0,
        "mscale": 1.0, "mscale_all_dim": 1.0}


def long_tokens(n: int = 48) -> list[int]:
    """A prompt longer than YARN's original context of 32 (for the YaRN fixtures)."""
    return [(7 * i + 3) % 251 for i in range(n)]


def _small():
    from tests.models.hf_archs import GPT_OSS_TINY, MIXTRAL_TINY
    from tests.models.hf_family import DS_TINY, GLM_TINY
    from tests.models.hf_minimax_m2 import MINIMAX_TINY
    from tests.models.hf_qwen3next import QWEN35MOE_TINY, QWEN3NEXT_TINY
    from tests.models.hf_tiny import TINY
    # the other tests' shapes with fewer experts (and GPT-OSS one sliding and one full layer):
    # the files' size, and fewer near-ties the rounding can tip; DeepSeek / GLM keep 2 of 4
    # groups of 2, top-2
    return {"qwen3moe": TINY.with_(n_expert=4), "mixtral": MIXTRAL_TINY.with_(n_expert=4),
            "gpt-oss": GPT_OSS_TINY.with_(**{"opts.swiglu_limit": 7.0}, n_expert=4, n_layer=2),
            "deepseek2": DS_TINY.with_(n_expert=8, top_k=2),
            "glm4moe": GLM_TINY.with_(n_expert=8, top_k=2),
            "minimax-m2": MINIMAX_TINY,   # 8 experts, top-2; RoPE on 8 of 16 dims
            # three DeltaNet layers, then a gated full-attention one (no wide file: see HYBRID)
            "qwen3next": QWEN3NEXT_TINY, "qwen35moe": QWEN35MOE_TINY}


# the hybrids: small files only (four layers of 8 experts: a wide file would weigh megabytes).
# A rounding of the size of llama.cpp's q8 one moves these tiny models' logits by up to their
# own size (it reaches a DeltaNet layer's ssm_out, its gate z and attn_qkv: the noise reads of
# test_llama_cpp_logits.py spread 0.2 - 1.1) and changes a routing decision within a few tokens
# of most prompts, so each quantized file takes the prompt that routes alike longest on its own:
# Qwen3-Next's F16 and Q8_0 files share one (every row routes alike), its Q4_K_M file and
# Qwen3.5's Q8_0 and Q4_K_M files are models of their own (`<name>-<tag>`, the same HF model).
# At D 64 Q4_K_M's every K-quant row falls back (Q5_0 / Q5_1 / Q8_0, the JSON lists them), which
# still holds the ftype's mix: the Q5_1 attn_output (q8_1 activations, whose minimum term no
# other converted fixture has) and Q5_0 beside Q8_0 in one layer's experts.
HYBRID = ("qwen3next", "qwen35moe")
SMALL_FMTS = {"qwen35moe": ("F16",)}
HYBRID_QUANT = {"qwen3next": {"mix": ("Q4_K_M",)},
                "qwen35moe": {"q8": ("Q8_0",), "mix": ("Q4_K_M",)}}


# D = expert width = 256 (whole K-quant rows), top-2 of 3 experts, attention of 4 x 32
# (attn_output's rows of 128 fall back to Q5_0: a 32-block type beside the K-quants); one layer,
# DeepSeek / GLM a dense one and a MoE one
_WIDE = dict(d_model=256, d_expert=256, n_expert=3, top_k=2, n_head=4, n_kv_head=2,
             head_dim=32, n_layer=1)


def _wide():
    s = _small()
    return {"qwen3moe": s["qwen3moe"].with_(**_WIDE),
            "mixtral": s["mixtral"].with_(**_WIDE),
            "gpt-oss": s["gpt-oss"].with_(**_WIDE),
            # the first layer dense (d_ff 256), the second 3 routed + 1 shared, one group;
            # MLA q_lora 64 / kv_lora 64 (Q5_0 rows), heads of 32 + 16 rope dims, values 32
            "deepseek2": s["deepseek2"].with_(**{**_WIDE, "n_kv_head": 4, "head_dim": 48,
                                                 "n_layer": 2},
                                              **{"dense.d_ff": 256, "router.n_group": 1,
                                                 "router.topk_group": 1},
                                              mla=Mla(64, 64, 16, 32)),
            "glm4moe": s["glm4moe"].with_(**{**_WIDE, "n_layer": 2, "dense.d_ff": 256,
                                             "router.n_group": 1, "router.topk_group": 1,
                                             "attn.rope_dim": 16}),
            "minimax-m2": s["minimax-m2"].with_(**_WIDE, **{"attn.rope_dim": 16})}


@dataclass(frozen=True)
class Model:
    name: str           # file stem: <name>-<fmt>.gguf
    arch: str           # the GGUF's general.architecture
    shape: ModelShape
    fmts: tuple[str, ...]
    yarn: bool = False


def models() -> list[Model]:
    small, wide = _small(), _wide()
    gguf_arch = {"mixtral": "llama"}
    out = []
    for a in small:
        out.append(Model(a, gguf_arch.get(a, a), small[a], SMALL_FMTS.get(a, ("F16", "Q8_0"))))
        for tag, fmts in HYBRID_QUANT.get(a, {}).items():
            out.append(Model(f"{a}-{tag}", a, small[a], fmts))
        if a in wide:
            out.append(Model(f"{a}-wide", gguf_arch.get(a, a), wide[a], ("Q4_K_M",)))
    # YaRN's model: 4 experts in 2 groups of 2 (one kept), top-2 (an F32 file: kept small)
    out.append(Model("deepseek2-yarn", "deepseek2", small["deepseek2"].with_(
        n_expert=4, **{"router.n_group": 2, "router.topk_group": 1}), ("F32",), yarn=True))
    return out


def make_ds_yarn(shape: ModelShape, seed: int = SEED):
    """The shape's DeepseekV3ForCausalLM (hf_family.make_hf_family's weights) with YARN."""
    from transformers import DeepseekV3ForCausalLM
    from tests.models.hf_family import _config, make_hf_family
    base = make_hf_family(shape, seed)
    cfg = _config(shape)
    cfg.rope_parameters = {**YARN, "rope_theta": shape.rope_theta}
    cfg.max_position_embeddings = int(YARN["factor"] * YARN["original_max_position_embeddings"])
    cfg._attn_implementation = "eager"
    model = DeepseekV3ForCausalLM(cfg).eval()
    missing, unexpected = model.load_state_dict(base.state_dict(), strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    return model


def make_hf(m: Model):
    from tests.models.hf_archs import make_gpt_oss, make_mixtral
    from tests.models.hf_family import make_hf_family
    from tests.models.hf_minimax_m2 import make_minimax_m2
    from tests.models.hf_qwen3next import make_hybrid
    from tests.models.hf_tiny import make_hf_model
    if m.yarn:
        return exact_in_f16(make_ds_yarn(m.shape))
    model = {"qwen3moe": make_hf_model, "mixtral": make_mixtral, "gpt-oss": make_gpt_oss,
             "deepseek2": make_hf_family, "glm4moe": make_hf_family,
             "minimax-m2": make_minimax_m2, "qwen3next": make_hybrid,
             "qwen35moe": make_hybrid}[m.shape.arch](m.shape, SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("mlp.gate.weight", "mlp.router.weight")):   # a power of two
                p.mul_(ROUTER_GAIN.get(m.shape.arch, ROUTER_GAIN_DEFAULT))
    return exact_in_f16(model)


def exact_in_f16(model):
    """Zero the (BF16) weights below F16_TINY: every weight is then exact in F16 too (the
    rotary tables are buffers the converter does not write)."""
    weights = [*model.parameters(), *(b for n, b in model.named_buffers()
                                      if n.endswith("e_score_correction_bias"))]
    with torch.no_grad():
        for t in weights:
            t.masked_fill_(t.abs() < F16_TINY, 0.0)
            assert torch.equal(t.half().float(), t) and torch.equal(t.bfloat16().float(), t)
    return model


_LLAMA = r"""
import ctypes, json, sys
import numpy as np
import llama_cpp
job = json.loads(sys.argv[1])
if job.get("ftype"):
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + job["ftype"])
    p.nthread = 2
    rc = llama_cpp.llama_model_quantize(job["src"].encode(), job["dst"].encode(), ctypes.byref(p))
    assert rc == 0, f"llama_model_quantize returned {rc}"
if job.get("prompts"):
    ctx = dict(job["ctx"])
    for k in ("type_k", "type_v"):
        ctx[k] = getattr(llama_cpp, "GGML_TYPE_" + ctx[k])
    m = llama_cpp.Llama(job["dst"], verbose=False, **ctx)
    for out, tokens in job["prompts"]:
        m.reset()
        m.eval(tokens)
        assert m.n_tokens == len(tokens), (m.n_tokens, len(tokens))
        np.save(out, np.asarray(m.scores[:len(tokens)], dtype=np.float32))
print(json.dumps({"llama_cpp": llama_cpp.__version__,
                  "system_info": llama_cpp.llama_print_system_info().decode().strip()}))
"""


def run_llama(python: str, dst: Path, *, src: Path | None = None, fmt: str | None = None,
              prompts: list[tuple[Path, list[int]]] = ()) -> dict:
    """In the llama_cpp venv: quantize `src` to `fmt` into `dst` (when fmt), then the logits of
    each prompt read by llama.cpp from `dst` into its .npy."""
    job = dict(src=str(src), dst=str(dst), ftype=fmt, ctx=LLAMA_CTX,
               prompts=[(str(o), t) for o, t in prompts])
    r = subprocess.run([python, "-c", _LLAMA, json.dumps(job)], check=True, capture_output=True,
                       text=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def tensor_types(path: Path) -> dict[str, str]:
    import gguf
    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}


def hf_logits(model, tokens: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].float().numpy()


def candidates(n: int, tries: int = TRIES):
    yield TOKENS[:n] if n <= len(TOKENS) else long_tokens(n)
    for i in range(tries):
        g = torch.Generator().manual_seed(1000 + i)
        yield torch.randint(0, 256, (n,), generator=g).tolist()


def _pack(f: Path, work: Path) -> Path:
    from tests.models.llama_emulation import _pack as pack
    done = work / (f.stem + ".pack")
    return done if done.exists() else pack(f, work)


def routed_rows(files: list[Path], tokens: list[int], work: Path) -> int:
    """The rows every file's reads route alike (test_llama_cpp_logits.file_reads: plain,
    emulated, the rounding's largest error, fp32 order), the least over the files."""
    from tests.models.llama_emulation import file_reads
    rows = len(tokens)
    for f in files:
        try:
            r = file_reads(_pack(f, work), f, tokens, None)
        except ValueError:   # its first row already routes otherwise: no row to bound
            return 0
        rows = min(rows, r.rows, r.routed_alike)
    return rows


def pick_prompt(files: list[Path], n: int, work: Path) -> tuple[list[int], int]:
    """The first candidate whose n rows all route alike, else the one with the most."""
    best_rows, best = -1, None
    for i, toks in enumerate(candidates(n)):
        rows = routed_rows(files, toks, work)
        print(f"  prompt {i}: {rows} of {n} rows routed alike", flush=True)
        if rows == n:
            return toks, rows
        if rows > best_rows:
            best_rows, best = rows, toks
    return best, best_rows


COMMAND = ("PYTHONPATH=. .venv/bin/python tests/models/make_llama_cpp_logits.py "
           "/tmp/lcp/llama_cpp_python-0.3.36.tar.gz /work/lcp-venv/bin/python")


def _files_of(name: str, entry: dict) -> list[Path]:
    """The files of model `name` in the folder, as its llama_cpp.json entry names them."""
    out = [OUT / f"{name}{sfx}.hf_logits.npy" for sfx in ("", "-long")]
    out.append(OUT / f"{name}.config.json")
    for f in entry.get("files", {}):
        stem = f[:-len(".gguf")]
        out += [OUT / f] + [OUT / f"{stem}{sfx}.logits.npy" for sfx in ("", "-long")]
    return [f for f in out if f.exists()]


def main(sdist: str, llama_python: str, only: set[str] | None = None) -> None:
    import transformers
    torch.set_num_threads(1)   # strata's tiny reads (the prompt pick): no second thread to wait on
    OUT.mkdir(parents=True, exist_ok=True)
    if only is not None:   # keep the other models' files and entries
        todo = [m for m in models() if m.shape.arch in only]
        info = json.loads((OUT / "llama_cpp.json").read_text())
        for m in todo:
            for old in _files_of(m.name, info["models"].pop(m.name, {})):
                old.unlink()
            info["router_gain"][m.shape.arch] = ROUTER_GAIN.get(m.shape.arch,
                                                                ROUTER_GAIN_DEFAULT)
        _make(sdist, llama_python, todo, info, f"{COMMAND} --only {','.join(sorted(only))}")
        return
    for old in OUT.iterdir():
        old.unlink()
    info = {"command": COMMAND,
            "sdist": Path(sdist).name,
            "sdist_sha256": hashlib.sha256(Path(sdist).read_bytes()).hexdigest(),
            "llama.cpp": "ggml-org/llama.cpp@0c1e57098",
            "transformers": transformers.__version__, "torch": torch.__version__,
            "gguf-py (reader)": importlib.metadata.version("gguf"),
            "seed": SEED,
            "router_gain": {**{a: ROUTER_GAIN_DEFAULT for a in _small()}, **ROUTER_GAIN},
            "llama_ctx": LLAMA_CTX, "models": {}}
    _make(sdist, llama_python, models(), info, None)


def _hybrid_folder(hf: Path, m: Model) -> Path:
    """The folder the converter reads (see the module doc): Qwen3.5's with mrope_section
    [1, 1, 0] (written into hf too: the model's own config) and, in a copy, model_type
    qwen3_next."""
    if m.shape.arch != "qwen35moe":
        return hf
    import shutil
    cfg = json.loads((hf / "config.json").read_text())
    cfg["rope_parameters"]["mrope_section"] = [1, 1, 0]
    (hf / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    conv = hf.with_name(hf.name + "-convert")
    shutil.copytree(hf, conv, dirs_exist_ok=True)
    (conv / "config.json").write_text(json.dumps({**cfg, "model_type": "qwen3_next"}) + "\n")
    return conv


def _make(sdist: str, llama_python: str, todo: list[Model], info: dict,
          command: str | None) -> None:
    """Convert, quantize and read each model of `todo` into OUT, its entry into `info`
    (`command`: the one recorded in the entry, when not the whole folder's), then the folder's
    sha256 list and llama_cpp.json."""
    from tests.models.make_llama_cpp_fixtures import convert, extract_converter, \
        save_byte_tokenizer
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        lc = extract_converter(sdist, tmp)
        for m in todo:
            hf = tmp / m.name
            model = make_hf(m)
            model.save_pretrained(hf)
            if m.shape.arch in RELEASE_KEYS:
                cfg = json.loads((hf / "config.json").read_text())
                cfg.update(RELEASE_KEYS[m.shape.arch])
                (hf / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
            save_byte_tokenizer(hf, m.shape.vocab, MERGES, GLM_SPECIALS if
                                m.shape.arch == "glm4moe" else ())
            f32 = tmp / f"{m.name}-f32.gguf"
            convert(lc, _hybrid_folder(hf, m), "f32", f32,
                    ("--no-mtp",) if m.shape.arch in HYBRID else ())
            entry = {"shape": m.shape.to_dict(), "arch": m.arch, "files": {}}
            if command is not None:
                entry["command"] = command
            files = [OUT / f"{m.name}-{fmt.lower()}.gguf" for fmt in m.fmts]
            for fmt, dst in zip(m.fmts, files):
                if fmt == "F32":
                    dst.write_bytes(f32.read_bytes())
                else:
                    info.update(run_llama(llama_python, dst, src=f32, fmt=fmt))
            print(m.name, flush=True)
            if m.yarn:
                prompts = {"": TOKENS, "-long": long_tokens()}
                (OUT / f"{m.name}.config.json").write_text((hf / "config.json").read_text())
                entry["long_tokens"] = prompts["-long"]
            else:
                toks, entry["routed_rows"] = pick_prompt(files, len(TOKENS), tmp)
                prompts = {"": toks}
            entry["tokens"] = prompts[""]
            for sfx, toks in prompts.items():
                np.save(OUT / f"{m.name}{sfx}.hf_logits.npy", hf_logits(model, toks))
            for dst in files:
                stem = dst.name[:-len(".gguf")]
                info.update(run_llama(llama_python, dst, prompts=[
                    (OUT / f"{stem}{sfx}.logits.npy", t) for sfx, t in prompts.items()]))
                types = tensor_types(dst)
                entry["files"][dst.name] = {
                    "sha256": hashlib.sha256(dst.read_bytes()).hexdigest(),
                    "bytes": dst.stat().st_size,
                    "types": {t: sorted(n for n, v in types.items() if v == t)
                              for t in sorted(set(types.values()))}}
            info["models"][m.name] = entry
            print(m.name, "done", flush=True)
    info["sha256"] = {f.name: hashlib.sha256(f.read_bytes()).hexdigest()
                      for f in sorted(OUT.iterdir()) if f.name != "llama_cpp.json"}
    (OUT / "llama_cpp.json").write_text(json.dumps(info, indent=1) + "\n")


if __name__ == "__main__":
    _only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else None
    main(*sys.argv[1:3], set(_only.split(",")) if _only else None)
