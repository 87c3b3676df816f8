"""DeepSeek's YaRN (DeepSeek-V3 / R1, Kimi-K2 ship it: factor 40 over a 4096-token context,
mscale = mscale_all_dim = 1) read from an HF folder and from a GGUF, against transformers'
DeepseekV3 with the same rope scaling in its config (tests/models/hf_family.DS_YARN).

What YaRN changes, and where strata does it (strata.models.layers, shared with GPT-OSS):
- the rope dims' frequencies: interpolated by the factor below the correction range, original
  above it, a linear ramp between (beta_fast / beta_slow rotations of the original context);
- cos and sin times mscale's temperature over mscale_all_dim's (1 for the releases);
- the softmax scale 1/sqrt(hd) times mscale_all_dim's temperature squared, (0.1 ln 40 + 1)² =
  1.87 (ModelShape.yarn.kq, strata.models.mla). A GGUF carries it as llama.cpp's converter
  writes it: rope.scaling.yarn_log_multiplier = 0.1 mscale_all_dim.

Bounds: the fp32 reference expert FFN on both sides with identical (BF16-exact) weights, so only
the order of fp32 sums differs: the bound is derived from fp32's backward error propagated
through the transformers model itself (tests/models/fp32_bound.py) and must come out below
1e-4 of the logits. The Triton expert GEMM rounds x and h to bf16 (its contract, BF16_FFN_REL of
tests/models/test_parity_packs). A read without YaRN (or with YaRN but without the softmax
mscale) misses by orders of magnitude more than the bound: the test can fail.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from strata.cli import main
from strata.packs import Pack
from tests.models.fp32_bound import model_order_bound, rel
from tests.models.hf_family import DS_TINY, DS_YARN, make_hf_family
from tests.models.hf_gguf_family import write_family_gguf
from tests.models.hf_tiny import hf_state

TOKENS = [3, 250, 17, 17, 0, 128, 64, 9, 200, 31, 5, 77, 1, 42, 99, 7, 180]
BF16_FFN_REL = 1e-2


def hf_logits(model, tokens=TOKENS) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].float().numpy()


@pytest.fixture(scope="module")
def yarn(tmp_path_factory):
    """(HF logits, their derived fp32 bound, {source: pack}) of the tiny DeepseekV3 with YaRN."""
    hf = make_hf_family(DS_TINY, seed=3, rope=DS_YARN)
    d = tmp_path_factory.mktemp("ds-yarn")
    hf.save_pretrained(d / "hf")
    want = hf_logits(hf)
    bound = model_order_bound(hf, hf_logits, tokens=len(TOKENS))
    packs = {"hf": d / "hf.pack", "gguf": d / "gguf.pack"}
    assert main(["pack", str(d / "hf"), "--quant", "BF16", "-o", str(packs["hf"])]) == 0
    g = write_family_gguf(hf_state(hf), DS_TINY, d / "m.gguf", expert_fmt="F32", rope=DS_YARN)
    assert main(["pack", str(g), "-o", str(packs["gguf"])]) == 0
    return want, bound, packs


def _prefill(pack, tmp_path, *extra):
    out = tmp_path / "logits.npy"
    assert main(["prefill", str(pack), "--tokens", ",".join(map(str, TOKENS)), "--device", "cpu",
                 "--dump-logits", str(out), *extra]) == 0
    return np.load(out)


@pytest.mark.parametrize("src", ["hf", "gguf"])
def test_the_pack_keeps_deepseek_s_yarn(yarn, src):
    s = Pack.open(yarn[2][src]).shape
    y = s.yarn
    assert (y.factor, y.orig_ctx) == (40.0, 32)
    assert (y.beta_fast, y.beta_slow, y.truncate) == (32.0, 1.0, True)
    assert y.attn == pytest.approx(1.0)
    assert y.kq == pytest.approx((0.1 * math.log(40.0) + 1.0) ** 2, rel=1e-6)


def test_the_bound_is_derived_and_tight(yarn):
    assert 0 < yarn[1] < 1e-4


@pytest.mark.parametrize("src", ["hf", "gguf"])
@pytest.mark.parametrize("how", ["resident", "streamed"])
def test_logits_equal_transformers(yarn, tmp_path, src, how):
    want, bound, packs = yarn
    extra = ["--experts", "ref", "--chunk", "5"]
    if how == "streamed":
        extra += ["--vram", "2GiB", "--cache", "3MiB", "--ring", "4"]
    got = _prefill(packs[src], tmp_path, *extra)
    assert got.shape == want.shape and rel(got, want) < bound


def test_the_triton_expert_gemm_reads_it_too(yarn, tmp_path):
    want, _, packs = yarn
    got = _prefill(packs["hf"], tmp_path, "--experts", "kernel", "--chunk", "9")
    assert rel(got, want) < BF16_FFN_REL


def test_without_yarn_the_logits_are_far_off(yarn):
    """The same weights read with plain RoPE, or with YaRN's frequencies but no softmax mscale
    (transformers with mscale_all_dim 0), miss transformers' YaRN logits by far more than the
    bound: each of the two parts is held by the parity tests above."""
    want, bound, _ = yarn
    plain = hf_logits(make_hf_family(DS_TINY, seed=3))
    no_mscale = hf_logits(make_hf_family(DS_TINY, seed=3, rope={**DS_YARN, "mscale_all_dim": 0.0,
                                                                 "mscale": 0.0}))
    assert rel(plain, want) > 100 * bound and rel(no_mscale, want) > 100 * bound


@pytest.mark.gpu
@pytest.mark.parametrize("how", ["resident", "streamed"])
def test_on_the_gpu(yarn, tmp_path, how):
    """CUDA: bf16 dense math, the Triton expert GEMM and MLA's CUDA attention path read the same
    YaRN tables and softmax scale; against transformers' fp32 logits within the bound of bf16
    dense math (test_family's GPU read: 2e-2, norm-relative)."""
    want, _, packs = yarn
    extra = ["--device", "cuda", "--chunk", "5"]
    if how == "streamed":
        extra += ["--vram", "1GiB", "--cache", "3MiB", "--ring", "4"]
    out = tmp_path / "g.npy"
    assert main(["prefill", str(packs["hf"]), "--tokens", ",".join(map(str, TOKENS)),
                 "--dump-logits", str(out), *extra]) == 0
    got = np.load(out)
    assert float(np.linalg.norm(got - want) / np.linalg.norm(want)) < 2e-2
