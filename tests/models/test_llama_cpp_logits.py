"""strata's logits against llama.cpp's on the same files: tiny HF models of every architecture
strata reads, converted by llama.cpp's convert_hf_to_gguf.py, quantized by its quantizer
(F16, Q8_0, Q4_K_M) and read by llama.cpp's CPU backend (llama-cpp-python 0.3.36); the files
and llama.cpp's logits are fixtures (tests/models/make_llama_cpp_logits.py made them, its
docstring and llama_cpp.json say how). Each file is packed with `strata pack` here.

What llama.cpp computes otherwise, on purpose: before each product with a weight it rounds the
activations to that weight's `vec_dot_type` (ggml-cpu's type traits): F16 weights read f16
activations (relative error <= 2^-11), Q8_0 / Q4_0 / Q5_0 weights q8_0 ones (blocks of 32,
scale amax/127 stored as f16: error <= amax/254), K-quants q8_K ones (blocks of 256, fp32 scale:
<= amax/254), Q4_1 / Q5_1 weights q8_1 ones: q8_0's values, and per block the sum
s = fp16(d sum(q)) (d = amax/127 in fp32), which the dot product multiplies by the weight
block's minimum m where a product with the dequantized weight reads fp16(d) sum(q) (`_q8_1`: the
emulated product adds (s - fp16(d) sum(q)) m per block; error <= 2^-11 |s|). A block holds 32
neighbours in the file's column order, which llama.cpp's activations come in: where strata's
reader reorders a weight's columns (Qwen3.5's ssm_out: the converter tiles the value heads,
`gguf_dense` puts them back in HF's grouped order) the rounding is done in the file's order
(`file_order`, `in_file_order`). F32 weights (norms, routers, biases) and the F32 KV cache the
fixtures ask for read fp32; so do the hybrids' (Qwen3-Next, Qwen3.5-MoE) ssm_conv, gated delta
net and its L2 norm (fp32 ops on fp32 tensors, the recurrent conv and S states F32:
llama-model.cpp's recurrent_type_r / _s); the L2 norm is rms_norm(x, eps/n) / sqrt(n) =
x / sqrt(sum(x^2) + eps) with eps the file's rms eps (1e-6 here, transformers' and strata's
fixed l2norm eps), the gate ssm_a * softplus(alpha + dt) with softplus linear above 20, as
torch's. strata's reference keeps every activation fp32. Per file, strata's fp32 reference
(`--experts ref`) is read twice and held by two bounds, each derived as tests/models/fp32_bound
derives its own (a perturbation of the size the arithmetic allows, propagated through the model
itself, the largest of DRAWS sign draws, doubled):

- emulated, bound EMULATED: llama.cpp's rounding of every product's input done in torch
  (`Arith(mode="emulate")`), so only fp32 order is left, and the roundings it tips to the other
  neighbour (an input within fp32 error of a rounding midpoint). Per format:
  F16: the draws perturb every product's input by fp32's backward error λ√n u (n its
  reduction length, at least the prompt) before the rounding, so they tip f16 roundings as
  another summation order does. llama.cpp's own order tips dozens of them a prompt, each one
  ulp of one element: EMULATED is then about the rounding's own size (1-2.5e-3), and the F16
  files' sharp test is against transformers (below).
  Q8_0, Q4_K_M: the draws keep the read's q8 codes and scales and perturb what lies between
  two roundings (4e-6 - 1e-5). A q8 rounding that fp32 order tips moves a whole step (a code:
  up to amax/127; q8_0 / q8_1's f16 scale, when amax/127 lies that near an f16 midpoint: one
  f16 ulp on every value of the block) and is rare (none to three a prompt here): those
  llama.cpp tipped are found among the few near a midpoint, within fp32 error of it or, when
  the read misses, within what the draws moved the rounding's input by (`window`: fp32 order
  upstream, which a chain of DeltaNet layers carries further than one product's error)
  (`tipped`: row by row, the combination that brings the row within EMULATED), and each is
  taken the other way in the emulated read. Equal inputs are one rounding (ggml rounds each
  product's input, to the same codes), so a tip tips every product of that input.
- plain, bound PLAIN: strata as `strata prefill --experts ref` reads the file, no rounding.
  PLAIN is the rounding's own size: each product's input moved by the format's largest rounding
  error (f16: 2^-11 x; q8_0: amax/254 and the f16 scale's 2^-11; q8_1: q8_0's and the block
  sum's 2^-11 |sum(x)|; q8_K: amax/254) with random signs, doubled, plus EMULATED (the
  triangle: plain -> emulated -> llama.cpp). A routing decision the rounding can change makes
  every later row incomparable at that size: PLAIN holds the rows before the first token a draw
  routes otherwise (`decided`); the fixtures' prompts were picked so that every row routes
  alike, except the hybrids' quantized files (the maker's HYBRID_QUANT: that rounding moves
  these tiny models' logits by up to their own size and tips a routing decision within a few
  tokens of every prompt tried): each is held over the rows its prompt routes alike, at least
  the maker's count (`routed_rows` in llama_cpp.json), and EMULATED over every row.
- transformers (F16 files), bound ORDER: the maker's weights are exact in BF16 and F16, so the
  F16 file holds transformers' model exactly and strata's read of it (the pack's own shape) is
  transformers' forward up to fp32 order (hf_logits.npy, made from the HF model itself); ORDER
  is fp32_bound's, from strata's read with its products' inputs perturbed.

Where llama.cpp and transformers disagree, and what strata does:
- activations: llama.cpp rounds them as above; transformers and strata's reference keep fp32
  (strata's Triton expert GEMM rounds to bf16, its own contract). strata follows transformers:
  the rounding is ggml-cpu's implementation, not the model.
- GPT-OSS's YaRN correction range: llama.cpp rounds it to whole dims (ggml_rope_yarn_corr_dims,
  floor / ceil); transformers' GptOss does not (the release's config: truncate false, as
  OpenAI's reference). A gpt-oss GGUF does not say which, so strata reads it as the model was
  trained (truncate false); the emulated and plain reads here take llama.cpp's convention
  (`llama_cpp_shape`); `test_gpt_oss_yarn_truncation_is_the_one_convention_apart` shows the
  two conventions apart by far more than EMULATED.
- deepseek2-yarn-f32.gguf (YaRN in the HF config, converted as it is): F32, so llama.cpp rounds
  nothing; strata equals transformers and llama.cpp within ORDER, on a prompt inside and one
  longer than the original context (test_deepseek_yarn.py does the same from strata's own
  writer and the HF folder).
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

from tests.models import llama_emulation
from tests.models.fp32_bound import rel
from tests.models.llama_emulation import (DRAWS, Arith, FileReads, _pack, file_order,
                                          file_reads, llama_cpp_shape, read_pack, spread)
from tests.models.make_llama_cpp_logits import HYBRID_QUANT

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py

DATA = Path(__file__).parent / "data" / "llama_cpp"


# ---- the fixtures --------------------------------------------------------------------------------
# committed with the tests: a missing fixture fails here, it is never skipped
INFO = json.loads((DATA / "llama_cpp.json").read_text())
FILES = [(m, f) for m, e in INFO["models"].items() for f in e["files"]]
QUANT_FILES = [(m, f) for m, f in FILES if not m.endswith("-yarn")]
# the models whose PLAIN holds the rows their prompt routes alike, not all (the docstring)
PARTIAL_ROWS = {f"{a}-{tag}" for a, tags in HYBRID_QUANT.items() for tag in tags}


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama-cpp-packs")
    made = {}

    def get(fname: str) -> Path:
        if fname not in made:
            made[fname] = _pack(DATA / fname, d)
        return made[fname]
    return get


def want_of(fname: str, sfx: str = "") -> np.ndarray:
    return np.load(DATA / f"{fname[:-len('.gguf')]}{sfx}.logits.npy")


@pytest.fixture(scope="module")
def reads(packs):
    cache = {}

    def get(model: str, fname: str) -> FileReads:
        if fname not in cache:
            cache[fname] = file_reads(packs(fname), DATA / fname, INFO["models"][model]["tokens"],
                                      want_of(fname))
        return cache[fname]
    return get


def _id(x):
    return x[1][:-5] if isinstance(x, tuple) else None


# ---- the tests -------------------------------------------------------------------------------
def test_the_fixtures_are_the_files_llama_cpp_read():
    """Every file of the folder is byte for byte the one the maker wrote (its sha256 in
    llama_cpp.json): the GGUFs llama.cpp read, its logits, transformers' logits."""
    got = {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(DATA.iterdir())
           if f.name != "llama_cpp.json"}
    assert got == INFO["sha256"]
    for model, fname in FILES:
        for sfx in ("", "-long") if "long_tokens" in INFO["models"][model] else ("",):
            assert want_of(fname, sfx).shape == (
                len(INFO["models"][model]["long_tokens" if sfx else "tokens"]),
                INFO["models"][model]["shape"]["vocab"])


@pytest.mark.parametrize("item", QUANT_FILES, ids=_id)
def test_emulated_equals_llama_cpp(reads, item):
    """With llama.cpp's rounding of the activations done in torch, strata's reference is
    llama.cpp's forward up to fp32 order and the roundings it tips: within EMULATED."""
    r = reads(*item)
    assert r.routed_alike == r.want.shape[0], "fp32 order changes a routing decision"
    assert r.emulated.logits.shape == r.want.shape
    assert rel(r.emulated.logits, r.want) < r.emulated_bound


@pytest.mark.parametrize("item", QUANT_FILES, ids=_id)
def test_plain_equals_llama_cpp(reads, item):
    """strata's own read (no rounding) is llama.cpp's within PLAIN, the size of llama.cpp's
    rounding propagated through the model; the prompt routes alike under that rounding (else
    the rows from the first token it routes otherwise are not comparable at that size): every
    row, the hybrids' quantized files the rows their prompt routes alike (the maker's count)."""
    r = reads(*item)
    rows = INFO["models"][item[0]]["routed_rows"]
    assert r.rows >= rows, f"row {r.rows} routes otherwise under the rounding"
    assert rows == r.want.shape[0] or item[0] in PARTIAL_ROWS
    assert rel(r.plain.logits[:r.rows], r.want[:r.rows]) < r.plain_bound


@pytest.mark.parametrize("item", [f for f in QUANT_FILES if not f[1].endswith("-f16.gguf")],
                         ids=_id)
def test_emulation_is_sharper_than_the_rounding(reads, item):
    """For the q8 formats EMULATED is far below the rounding's own effect on strata's read, so
    the emulated test fails a read that leaves the rounding out or does another format's.
    (F16's is not: llama.cpp's own order tips dozens of its f16 roundings, each one ulp; the
    F16 files are held to transformers at fp32 order instead.)"""
    r = reads(*item)
    assert 100 * r.emulated_bound < rel(r.plain.logits, r.emulated.logits)


F16_FILES = [(m, f) for m, f in QUANT_FILES if f.endswith("-f16.gguf")]


@pytest.fixture(scope="module")
def f16_reads(packs):
    cache = {}

    def get(model, fname):
        if fname not in cache:
            pack, src = packs(fname), DATA / fname
            toks = INFO["models"][model]["tokens"]
            own = read_pack(pack, src, tokens=toks)                  # the pack's own shape
            draws = [read_pack(pack, src, tokens=toks, arith=Arith(order=i + 1))
                     for i in range(DRAWS)]
            hf = np.load(DATA / f"{model}.hf_logits.npy")
            cache[fname] = own, spread(own, draws), hf
        return cache[fname]
    return get


@pytest.mark.parametrize("item", F16_FILES, ids=_id)
def test_f16_file_reads_as_transformers(f16_reads, item):
    """The F16 file holds transformers' weights exactly (the maker's weights are exact in BF16
    and F16): strata's own read of it (as `strata prefill` reads the pack: for GPT-OSS
    transformers' YaRN, truncate false) is transformers' forward within ORDER, where llama.cpp
    is off by its rounding (and for GPT-OSS its YaRN convention)."""
    own, order, hf = f16_reads(*item)
    assert rel(own.logits, hf) < order


def test_a_rounding_is_placed_at_its_chunk_s_positions(packs):
    """`tipped` looks for a row's tips among the roundings placed at that row (Arith.near_tok:
    the chunk's first position plus the row), so each product must see its own chunk's first
    position, the LM head's too, which runs after the last layer is done."""
    model, fname = QUANT_FILES[0]
    toks = INFO["models"][model]["tokens"]
    a, seen = Arith(mode="emulate"), []
    input_fn = a.input_fn

    def spied(ggml_type, name):
        fn = input_fn(ggml_type, name)
        if name != "output.weight":
            return fn
        return lambda x: (seen.append((a.offset, x.shape[0])), fn(x))[1]
    a.input_fn = spied
    read_pack(packs(fname), DATA / fname, tokens=toks, arith=a, chunk=4)
    assert seen == [(s, min(4, len(toks) - s)) for s in range(0, len(toks), 4)]


def test_cli_prefill_is_the_plain_read(packs, tmp_path):
    """The plain read here is the CLI's: `strata prefill --experts ref` on the pack gives it."""
    from strata.cli import main
    model, fname = QUANT_FILES[0]
    toks = INFO["models"][model]["tokens"]
    out = tmp_path / "l.npy"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["prefill", str(packs(fname)), "--tokens", ",".join(map(str, toks)),
                     "--device", "cpu", "--experts", "ref", "--chunk", "4", "--dump-logits",
                     str(out)]) == 0
    assert np.array_equal(np.load(out), read_pack(packs(fname), tokens=toks).logits)


def test_gpt_oss_yarn_truncation_is_the_one_convention_apart(packs, reads):
    """strata's gpt-oss read (YaRN's correction range not rounded: transformers, the release)
    and llama.cpp's (rounded to whole dims) differ by more than EMULATED: the emulated read
    with strata's own convention misses llama.cpp, and with llama.cpp's it meets it."""
    from strata.packs import Pack
    fname = "gpt-oss-q8_0.gguf"
    r = reads("gpt-oss", fname)
    shape = Pack.open(packs(fname)).shape
    assert shape.yarn.truncate is False
    own = read_pack(packs(fname), DATA / fname, tokens=INFO["models"]["gpt-oss"]["tokens"],
                    shape=shape, arith=Arith(mode="emulate", tips=_tips(r)))
    assert rel(own.logits, r.want) > 100 * r.emulated_bound
    assert rel(r.emulated.logits, r.want) < r.emulated_bound


def test_llama_cpp_s_yarn_convention_is_not_transformers(packs, f16_reads):
    """On the F16 file, which holds transformers' GPT-OSS exactly: strata's read is
    transformers' within ORDER (test_f16_file_reads_as_transformers), the same read with
    llama.cpp's whole-dim YaRN correction range is not."""
    own, order, hf = f16_reads("gpt-oss", "gpt-oss-f16.gguf")
    from strata.packs import Pack
    pack = packs("gpt-oss-f16.gguf")
    theirs = read_pack(pack, tokens=INFO["models"]["gpt-oss"]["tokens"],
                       shape=llama_cpp_shape(Pack.open(pack).shape))
    assert rel(theirs.logits, hf) > 10 * order


def _tips(r: FileReads) -> dict:
    t: dict = {}
    for c, i in r.tips:
        t.setdefault(c, []).append(i)
    return t


# a deliberate error per bound: each must miss llama.cpp's logits by more than the bound
WRONG_ROUNDING = {   # a file, the format its weights' activations are rounded to instead
    "qwen3moe-f16.gguf": {"F16": "q8_0"},
    "qwen3moe-q8_0.gguf": {"Q8_0": "f16"},
    "qwen3moe-wide-q4_k_m.gguf": {"Q4_K": "q8_0", "Q6_K": "q8_0"},
    "deepseek2-q8_0.gguf": {"Q8_0": "bf16"},
    "qwen35moe-mix-q4_k_m.gguf": {"Q5_1": "q8_0"},   # q8_1's minimum term left out
}


@pytest.mark.parametrize("fname", list(WRONG_ROUNDING), ids=lambda f: f[:-5])
def test_emulated_bound_catches_another_format_s_rounding(packs, reads, fname):
    from strata.packs import Pack
    model = {f: m for m, f in QUANT_FILES}.get(fname)
    assert model is not None, f"llama_cpp.json lists no {fname}"
    r = reads(model, fname)
    got = read_pack(packs(fname), DATA / fname, tokens=INFO["models"][model]["tokens"],
                    shape=llama_cpp_shape(Pack.open(packs(fname)).shape),
                    arith=Arith(mode="emulate", formats=WRONG_ROUNDING[fname]))
    assert rel(got.logits, r.want) > r.emulated_bound


def test_emulated_bound_catches_rounding_in_strata_s_column_order(packs, reads):
    """Qwen3.5's ssm_out input rounded in strata's order of the value heads (HF's grouped one),
    not the file's (the converter's tiled one) that llama.cpp's activations come in: a q8 block
    then holds other elements than llama.cpp's, and the read misses by far more than EMULATED."""
    from strata.packs import Pack
    model, fname = "qwen35moe-q8", "qwen35moe-q8-q8_0.gguf"
    r = reads(model, fname)
    pack = Pack.open(packs(fname))
    assert file_order("blk.0.ssm_out.weight", pack.dense("blk.0.ssm_out.weight"),
                      pack.shape) is not None
    with mock.patch.object(llama_emulation, "file_order", lambda *a: None):
        got = read_pack(packs(fname), DATA / fname, tokens=INFO["models"][model]["tokens"],
                        shape=llama_cpp_shape(pack.shape),
                        arith=Arith(mode="emulate", tips=_tips(r)))
    assert rel(got.logits, r.want) > 100 * r.emulated_bound


def _scale_as_bf16(fmt_name: str):
    """strata's decoder with one slip: each Q8_0 block's f16 scale read through bf16."""
    from strata.kernels.moe import ffn as kmoe
    real = kmoe.dequantize_matrix

    def dq(experts, e, name):
        w = real(experts, e, name)
        if getattr(experts.layout, name).fmt.name != fmt_name:
            return w
        b = w.reshape(-1, 32)
        d = b.abs().amax(-1, keepdim=True) / 127
        return (b / d * d.bfloat16().float()).reshape(w.shape)
    return dq


def test_emulated_bound_catches_a_decoder_slip(packs, reads):
    """Q8_0 experts decoded with each block's scale rounded to bf16 (2^-8 relative, a whole
    block at a time): under EMULATED's microscope, far off; PLAIN alone would not see it."""
    from strata.kernels.moe import ffn as kmoe
    from strata.packs import Pack
    fname = "qwen3moe-q8_0.gguf"
    r = reads("qwen3moe", fname)
    with mock.patch.object(kmoe, "dequantize_matrix", _scale_as_bf16("Q8_0")):
        got = read_pack(packs(fname), DATA / fname, tokens=INFO["models"]["qwen3moe"]["tokens"],
                        shape=llama_cpp_shape(Pack.open(packs(fname)).shape),
                        arith=Arith(mode="emulate", tips=_tips(r)))
    assert rel(got.logits, r.want) > 100 * r.emulated_bound


WRONG_SHAPE = {   # a file, a hyperparameter read otherwise
    "gpt-oss-f16.gguf": dict(yarn=None),                     # plain RoPE for YaRN
    "qwen3moe-f16.gguf": dict(rope_theta=1e6),               # another RoPE base
    "mixtral-q8_0.gguf": dict(rope_theta=1e4),               # the default base for 1e6
    "glm4moe-wide-q4_k_m.gguf": {"router.scale": 1.0},       # the routed experts' scale dropped
    "minimax-m2-f16.gguf": {"attn.rope_dim": 16},            # RoPE over all of the head, not 8
    "minimax-m2-wide-q4_k_m.gguf": dict(norm_topk_prob=False),   # the k sigmoid weights as
}                                                            # they are, not renormalised


def _wrong(packs, reads, fname, emulate: bool):
    """The file's reads, and its read (emulated: with the tips llama.cpp took) with
    WRONG_SHAPE's hyperparameter."""
    from strata.packs import Pack
    model = {f: m for m, f in QUANT_FILES}.get(fname)
    assert model is not None, f"llama_cpp.json lists no {fname}"
    r = reads(model, fname)
    shape = llama_cpp_shape(Pack.open(packs(fname)).shape).with_(**WRONG_SHAPE[fname])
    arith = Arith(mode="emulate", tips=_tips(r)) if emulate else Arith()
    return r, read_pack(packs(fname), DATA / fname, tokens=INFO["models"][model]["tokens"],
                        shape=shape, arith=arith)


@pytest.mark.parametrize("fname", list(WRONG_SHAPE), ids=lambda f: f[:-5])
def test_emulated_bound_catches_a_hyperparameter_read_otherwise(packs, reads, fname):
    r, got = _wrong(packs, reads, fname, emulate=True)
    assert rel(got.logits, r.want) > r.emulated_bound


@pytest.mark.parametrize("fname", ["gpt-oss-f16.gguf", "qwen3moe-f16.gguf",
                                   "minimax-m2-f16.gguf"],
                         ids=lambda f: f[:-5])
def test_plain_bound_catches_a_rope_read_otherwise(packs, reads, fname):
    r, got = _wrong(packs, reads, fname, emulate=False)
    assert rel(got.logits[:r.rows], r.want[:r.rows]) > r.plain_bound


# ---- DeepSeek's YaRN from the converter's GGUF ------------------------------------------------
YARN = "deepseek2-yarn"
YARN_FILE = f"{YARN}-f32.gguf"


@pytest.fixture(scope="module")
def yarn(packs):
    """Per prompt ("" short, "-long" past the original context): strata's read of the
    converter's F32 file (all weights as transformers had them: llama.cpp rounds nothing),
    ORDER from its own order draws, transformers' and llama.cpp's logits."""
    e = INFO["models"][YARN]
    pack = packs(YARN_FILE)
    out = {}
    for sfx, toks in (("", e["tokens"]), ("-long", e["long_tokens"])):
        own = read_pack(pack, tokens=toks)
        draws = [read_pack(pack, DATA / YARN_FILE, tokens=toks, arith=Arith(order=i + 1))
                 for i in range(DRAWS)]
        out[sfx] = dict(tokens=toks, own=own.logits, order=spread(own, draws),
                        hf=np.load(DATA / f"{YARN}{sfx}.hf_logits.npy"),
                        lc=want_of(YARN_FILE, sfx))
    return pack, out




def test_yarn_keys_as_the_converter_wrote_them(yarn):
    import math
    from strata.packs import Pack
    s = Pack.open(yarn[0]).shape
    cfg = json.loads((DATA / f"{YARN}.config.json").read_text())
    cfg = cfg.get("rope_parameters") or cfg["rope_scaling"]
    y = s.yarn
    assert (y.factor, y.orig_ctx) == (cfg["factor"], cfg["original_max_position_embeddings"])
    assert (y.beta_fast, y.beta_slow, y.truncate) == (cfg["beta_fast"], cfg["beta_slow"], True)
    assert y.kq == pytest.approx((0.1 * math.log(cfg["factor"]) + 1) ** 2, rel=1e-6)
    assert len(yarn[1]["-long"]["tokens"]) > cfg["original_max_position_embeddings"]


@pytest.mark.parametrize("sfx", ["", "-long"], ids=["short", "long"])
def test_yarn_equals_transformers_and_llama_cpp(yarn, sfx):
    r = yarn[1][sfx]
    assert 0 < r["order"] < 1e-4
    assert rel(r["own"], r["hf"]) < r["order"]
    assert rel(r["own"], r["lc"]) < r["order"]


@pytest.mark.parametrize("how", ["resident", "streamed"])
def test_yarn_cli_equals_transformers(yarn, tmp_path, how):
    """`strata prefill` on the converter's file, resident and streamed, long prompt."""
    from strata.cli import main
    r = yarn[1]["-long"]
    extra = ["--vram", "2GiB", "--cache", "3MiB", "--ring", "4"] if how == "streamed" else []
    out = tmp_path / "l.npy"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["prefill", str(yarn[0]), "--tokens", ",".join(map(str, r["tokens"])),
                     "--device", "cpu", "--experts", "ref", "--chunk", "5", "--dump-logits",
                     str(out), *extra]) == 0
    assert rel(np.load(out), r["hf"]) < r["order"]


@pytest.mark.parametrize("sfx", ["", "-long"], ids=["short", "long"])
def test_yarn_read_as_plain_rope_is_far_off(yarn, sfx):
    from strata.packs import Pack
    r = yarn[1][sfx]
    shape = Pack.open(yarn[0]).shape.with_(yarn=None)
    got = read_pack(yarn[0], tokens=r["tokens"], shape=shape).logits
    assert min(rel(got, r["hf"]), rel(got, r["lc"])) > 100 * r["order"]
