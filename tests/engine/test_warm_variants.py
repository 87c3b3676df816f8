"""The warm-up launches every kernel variant the prompt will (issue 17 item 1), also when the
prompt's later chunks attend a long prefix cut into pieces (issue 14's int8 KV).

Each case reads a prompt of N = 52 tokens in chunks of 16 (8 resident, 44 in host memory)
through the CPU engine with the Triton attention (the interpreter: pin_attention("triton")), an
expansion scratch of ROWS = 16 rows (pin_expand_rows: the plan's one count, so the carve and the
launcher agree) and key tiles of 16 (pin_attn_tile): the third chunk's 32-token prefix takes two
launches, the last chunk's (4 tokens after 44 host-held and 4 resident ones) three — first,
middle and last, the host and resident pieces in one launch. The dry prompt is 16 + 4 tokens:
its own attention never needs more than one launch. strata.engine.variants records Triton's
specialization of every launch; the prompt's set must lie inside the warm-up's, and must not lie
inside the set the warm-up launched outside its probes (the dry prompt alone: the warm-up before
the probes), so the case cannot pass by being too easy.
"""
from __future__ import annotations

import contextlib
import inspect
import re

import pytest
import torch

from strata.engine.prefill import EngineConfig, PrefillEngine
from strata.engine.variants import KernelLaunches
from strata.engine.warm import ProbePlan
from strata.kernels.attention import _kernel as attn_kernel
from strata.kernels.attention import pin_attention, pin_attn_tile, pin_expand_rows
from strata.packs.synth import ExpertFormats, synth_pack
from strata.shapes import get_preset

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py

# one layer, two kv heads of one query head each: the interpreter runs few programs (one kv
# head would trip the launcher: k from a transposed [1, T, hd] has strides v does not)
SHAPE = get_preset("tiny").with_(n_layer=1, n_head=2, n_kv_head=2)
N = 52                         # chunks of 16: 3 full, then 4 tokens after a 48-token prefix
CHUNK = 16
RESIDENT = 8
ROWS = 16                      # int8 prefix rows expanded per launch
BLOCK_N = 16


@contextlib.contextmanager
def long_prefix(attention: str = "triton"):
    with pin_attention(attention), pin_expand_rows(ROWS), pin_attn_tile(BLOCK_N=BLOCK_N):
        yield


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    return synth_pack(tmp_path_factory.mktemp("wv") / "tiny.pack", SHAPE,
                      ExpertFormats.of("Q8_0"), progress=False)


def prompt(n: int) -> torch.Tensor:
    return torch.randint(0, SHAPE.vocab, (n,), generator=torch.Generator().manual_seed(5))


def engine(pack, ffn: str = "ref", **kw) -> PrefillEngine:
    return PrefillEngine(pack, EngineConfig(vram=1 << 30, cache=128 * 1024, max_prompt=64,
                                            device="cpu", chunk=CHUNK, ring=4, ffn=ffn, **kw))


def attention_specs(variants) -> list[dict[str, str]]:
    """The AttnSpec fields (name -> value as text) of the attention kernel's recorded variants:
    its constexpr `S`, recorded as its repr."""
    names = list(inspect.signature(attn_kernel._chunk_attn_fwd_kernel.fn).parameters)
    s = names.index("S")
    return [dict(re.findall(r"(\w+)=(\w+)", v[1][s][1])) for v in variants
            if v[0] == "_chunk_attn_fwd_kernel"]


def attention_launches(variants) -> set[tuple[bool, bool]]:
    """(RESUME, FINISH) of the attention kernel's recorded variants."""
    return {(f["RESUME"] == "True", f["FINISH"] == "True") for f in attention_specs(variants)}


def sets(pack, n: int, attention: str = "triton", **kw):
    """(warm-up's, prompt's, the warm-up's outside its probes) variants, and the engine; the
    warm-up leaves the cache as it found it."""
    with long_prefix(attention):
        eng = engine(pack, **kw)
        before, index = eng.cache.buffer.clone(), dict(eng.cache.index)
        with KernelLaunches() as warm:
            assert eng.warmup(n) > 0
        assert torch.equal(eng.cache.buffer, before) and eng.cache.index == index
        assert eng.warmup(n) == 0.0, "already warm for this prompt"
        with KernelLaunches() as run:
            eng.run(prompt(n), logits="last")
    assert run.variants <= warm.variants, (
        f"the prompt launched variants the warm-up did not: {run.variants - warm.variants}")
    return warm.variants, run.variants, warm.plain, eng


# (kv, prompt tokens, resident): int8 with 44 of 52 tokens' KV in host memory; int8 all
# resident (the pieces cut the resident segment, longer than the dry prompt's); bf16 with one
# token in host memory (N = 41 = 40 resident + 1: the chunks after the first see a host segment
# of exactly 1 token, an argument Triton specializes, the dry prompt's 25 tokens none)
CASES = {"int8-host": ("int8", N, RESIDENT), "int8-resident": ("int8", N, None),
         "bf16-host": ("bf16", 41, 40)}


@pytest.mark.parametrize("case", list(CASES))
def test_the_warmup_launches_what_a_long_prompt_does(pack, case):
    kv, n, resident = CASES[case]
    warm, run, dry, eng = sets(pack, n, kv=kv, kv_resident=resident)
    assert run - dry, "the case is too easy: the dry prompt alone launches everything"
    if kv == "int8":   # pieces: a first, a middle and a last launch; the dry prompt: one
        assert {(False, False), (True, False), (True, True)} <= attention_launches(run)
        assert attention_launches(dry) == {(False, True)}
    t = eng.timings
    assert t["warmup_probes"] > 0 and t["warmup_variants"] == len(warm) >= len(run)
    assert t["warmup_launches"] >= t["warmup_variants"] > 0 and t["warmup_s"] > 0


def test_the_warmup_launches_what_sliding_layers_with_sinks_do(tmp_path_factory):
    """GPT-OSS-like: layer 0 slides over 5 keys, both have sinks; the window's absolute
    positions and the sinks (in the last launch only) are launch arguments too."""
    from tests.models.hf_archs import GPT_OSS_TINY
    shape = GPT_OSS_TINY.with_(n_layer=2)
    pack = synth_pack(tmp_path_factory.mktemp("wv-oss") / "oss.pack", shape,
                      ExpertFormats.of("BF16"), progress=False)
    with long_prefix():
        eng = PrefillEngine(pack, EngineConfig(
            vram=1 << 30, cache=512 * 1024, max_prompt=64, device="cpu", chunk=CHUNK, ring=4,
            ffn="ref", kv="int8", kv_resident=RESIDENT))
        with KernelLaunches() as warm:
            eng.warmup(N)
        with KernelLaunches() as run:
            eng.run(torch.randint(0, shape.vocab, (N,), generator=torch.Generator().manual_seed(5)),
                    logits="last")
    assert run.variants <= warm.variants, run.variants - warm.variants
    assert run.variants - warm.plain
    flags = {(f["WIN"], f["SINKS"]) for f in attention_specs(run.variants)}
    assert ("True", "True") in flags and ("False", "True") in flags, flags


@pytest.mark.parametrize("ffn,kernel", [("kernel", "_moe_gemm_kernel"),
                                        ("decoded", "_dequant_fwd_kernel")])
def test_the_warmup_launches_what_the_expert_ffn_does(pack, ffn, kernel):
    """The expert FFN's launches follow the chunk, not the routing: the dry prompt's chunks
    (other tokens, other experts) cover a spilling int8 prompt's of the same sizes (the
    attention in torch here: its launches are the case above)."""
    warm, run, dry, eng = sets(pack, 20, attention="torch", ffn=ffn, kv="int8",
                               kv_resident=RESIDENT)   # chunks of 16 and 4
    assert kernel in {v[0] for v in run}


def test_probe_plan_gives_each_chunk_its_prefix():
    p = ProbePlan(n_tokens=60, chunk=8, resident=8)       # 52 host-held, 8 resident
    assert list(p.prefixes(8)) == [(0, 0), (8, 0), (16, 0), (24, 0), (32, 0), (40, 0), (48, 0)]
    assert list(p.prefixes(4)) == [(52, 4)]
    assert p.kept() == (8, 52) and p.kept(window=5) == (4, 0) and p.starts(4) == [56]
    assert list(ProbePlan(16, 8, None).prefixes(8)) == [(0, 0), (0, 8)]
    assert list(ProbePlan(16, 8, None).prefixes(3)) == []
    # a resumed read: 50 positions restored, the 10 after them in chunks of 8 (then 2)
    r = ProbePlan(n_tokens=60, chunk=8, resident=8, start=50)
    assert r.starts(8) == [50] and r.starts(2) == [58] and r.starts(4) == []
    assert list(r.prefixes(8)) == [(50, 0)] and list(r.prefixes(2)) == [(52, 6)]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (runs on the GPU machine)")
@pytest.mark.parametrize("case", list(CASES))
def test_on_cuda_the_timed_read_compiles_nothing(pack, case):
    """Triton's own caches: after the warm-up, the prompt adds no compiled kernel (the pieces
    pinned small as above, so the tiny prompt has the long prompt's launches)."""
    kv, n, resident = CASES[case]
    with pin_expand_rows(ROWS), pin_attn_tile(BLOCK_N=BLOCK_N):
        eng = PrefillEngine(pack, EngineConfig(vram=1 << 30, cache=128 * 1024, max_prompt=64,
                                               device="cuda", chunk=CHUNK, ring=4,
                                               ffn="kernel", kv=kv, kv_resident=resident))
        before = eng.cache.buffer.clone()
        with KernelLaunches() as warm:
            eng.warmup(n)
        assert torch.equal(eng.cache.buffer, before)
        with KernelLaunches() as run:
            eng.run(prompt(n), logits="last")
    assert run.variants <= warm.variants, run.variants - warm.variants
    assert warm.compiled is not None and run.compiled == 0, (
        f"the timed read compiled {run.compiled} kernels")
    assert eng.timings["warmup_compiled"] == warm.compiled
