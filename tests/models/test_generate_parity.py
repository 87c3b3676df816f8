"""`strata generate` against transformers' greedy `generate` on tiny random HF models of every
architecture (tests/models/hf_tiny, hf_archs, hf_family), packed from their HF folders in BF16
(lossless: the weights are BF16-exact), on the CPU with the fp32 reference experts.

The prompt's logits match transformers' within FP32_REL (tests/models/test_parity_archs); the
models' routing is decisive and their logits' top two are far apart next to that, so greedy
decoding picks the same tokens: the generated ids are compared exactly. The decode runs all
resident, streamed through the engine's expert cache (a cache smaller than the experts: misses
stream through the ring), and after a --resume of the saved prompt.
"""
from __future__ import annotations

import json

import pytest
import torch

from strata.cli import main
from tests.models.hf_archs import GPT_OSS_TINY, MIXTRAL_TINY, make_gpt_oss, make_mixtral
from tests.models.hf_family import DS_TINY, GLM_TINY, make_hf_family
from tests.models.hf_tiny import TINY, make_hf_model

PROMPT = [3, 250, 17, 17, 0, 128, 64, 9, 200, 31, 5, 77, 1]
N = 6
ARCHS = {"qwen3moe": (make_hf_model, TINY), "mixtral": (make_mixtral, MIXTRAL_TINY),
         "gpt-oss": (make_gpt_oss, GPT_OSS_TINY), "glm4moe": (make_hf_family, GLM_TINY),
         "deepseek2": (make_hf_family, DS_TINY)}
CPU = ["--device", "cpu", "--experts", "ref"]


def hf_generate(hf, prompt, n):
    g = hf.generation_config
    g.eos_token_id, g.pad_token_id, g.do_sample = None, 0, False
    x = torch.tensor([prompt])
    with torch.no_grad():   # the mask given: a prompt token equal to pad_token_id is no padding
        out = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n,
                          min_new_tokens=n, do_sample=False)
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="module", params=list(ARCHS))
def model(request, tmp_path_factory):
    """(arch, pack path, the prompt in its vocabulary, transformers' N greedy tokens)."""
    make, shape = ARCHS[request.param]
    hf = make(shape, seed=5)
    d = tmp_path_factory.mktemp(request.param.replace("-", ""))
    hf.save_pretrained(d / "hf")
    pack = d / "hf.pack"
    assert main(["pack", str(d / "hf"), "--quant", "BF16", "-o", str(pack)]) == 0
    prompt = [t % shape.vocab for t in PROMPT]
    return request.param, pack, prompt, hf_generate(hf, prompt, N)


def generate(capsys, pack, *argv):
    rc = main(["generate", str(pack), "-n", str(N), "--json", *CPU, *map(str, argv)])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return json.loads(out.out)


def ids(xs):
    return ",".join(map(str, xs))


def test_resident_greedy_equals_transformers(model, capsys):
    arch, pack, prompt, want = model
    r = generate(capsys, pack, "--tokens", ids(prompt), "--chunk", "5")
    assert r["generated"] == want, arch
    assert r["decode"]["bound"] == "resident" and r["decode"]["forwards"] == N - 1


def test_streamed_greedy_equals_transformers(model, capsys):
    """The streaming engine's decode: a 12-blob cache (fewer than a layer's experts), ring 2,
    so decoded tokens miss the cache and stream their experts."""
    arch, pack, prompt, want = model
    from strata.packs import Pack
    blob = Pack.open(pack).max_blob
    r = generate(capsys, pack, "--tokens", ids(prompt), "--cache", 12 * blob, "--chunk", "5",
                 "--ring", "2", "--no-warmup")
    assert r["generated"] == want, arch
    d = r["decode"]
    assert d["bound"] == "pcie" and d["routed"] > 0
    assert d["bytes_streamed"] > 0 and d["bound_tokens_per_s"] > 0
    # a decode step stages its routed experts: at most K blobs a MoE layer cross, not the
    # layer's every missing expert (the prompt's stream mode)
    assert d["bytes_streamed"] <= d["forwards"] * d["routed_bytes_per_token"]


def test_resume_then_generate_equals_transformers(model, capsys, tmp_path):
    """--save-kv after the first 8 prompt tokens, then --resume with the other 5: the same
    tokens as transformers over the whole prompt."""
    arch, pack, prompt, want = model
    st = tmp_path / "p.kv"
    assert main(["prefill", str(pack), "--tokens", ids(prompt[:8]), "--save-kv", str(st),
                 *CPU]) == 0
    capsys.readouterr()
    r = generate(capsys, pack, "--tokens", ids(prompt[8:]), "--resume", st)
    assert r["generated"] == want, arch
    assert (r["kv_state"]["restored"], r["kv_state"]["read"]) == (8, len(prompt) - 8)


def test_a_streamed_decode_over_host_held_kv_counts_it_in_its_bound(model, capsys):
    """With the prompt's older tokens held in host memory (--kv-resident 4), each decode step
    stages them back: the decode counts those bytes, and its bound is the H2D rate over the
    expert and KV bytes a token together (the tokens still transformers')."""
    arch, pack, prompt, want = model
    from strata.packs import Pack
    blob = Pack.open(pack).max_blob
    r = generate(capsys, pack, "--tokens", ids(prompt), "--cache", 12 * blob, "--chunk", "5",
                 "--ring", "2", "--no-warmup", "--kv-resident", "4")
    assert r["generated"] == want, arch
    d = r["decode"]
    assert d["kv_bytes_streamed"] > 0 and d["kv_bytes_per_token"] > 0
    assert d["kv_bytes_per_token"] == d["kv_bytes_streamed"] / d["forwards"]
    per = d["bytes_streamed_per_token"] + d["kv_bytes_per_token"]
    assert d["bound_tokens_per_s"] == pytest.approx(d["pcie_gbps"] * 1e9 / per)
