"""A later chunk's attention over bf16 prefix segments by flash blocks merged by their log-sum-exp
(strata.kernels.attention.flash_prefix) against chunk_attention_torch, the reference of
chunk_attention's meaning, on fresh random data: on the CPU through the plain-torch stand-in of
flash's block (the blocking, the masks and the merge), on the GPU through FlashAttention-2 and
the Triton merge; and the route the plan and the KV share.

Bounds: the stand-in computes each block's softmax in fp32 as the reference does over all keys at
once; the merge rescales by exp(lse_b - lse) in fp32: a few fp32 ulps of |o|, then one rounding
of the output to q's dtype (fp32 here: 1e-5 of max |v| covers both). On the GPU flash's bf16
P.V products and its bf16 block outputs: each block's o rounded once to bf16 before the merge
(2^-8 relative), the reference in fp32 throughout: 1e-2 of max |v| (tests/kernels/
test_chunk_attention.py holds chunk_attention itself to its own bound).
"""
from __future__ import annotations

import pytest
import torch

from strata.errors import StrataError
from strata.kernels.attention import KVSegment, chunk_attention_torch
from strata.kernels.attention.flash_prefix import (CUDNN_MIN_HD, FLASH_MIN_HD, blocks_kernel,
                                                   flash_rows, flash_state_floats,
                                                   pin_prefix_route, prefix_flash_attention,
                                                   prefix_route)


def case(T, lens, H=4, Hkv=2, hd=16, dtype=torch.float32, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen).to(dtype).to(device)     # noqa: E731
    q, k, v = r(T, H, hd), r(T, Hkv, hd), r(T, Hkv, hd)
    # segments as the KV keeps them: head-major [Hkv, S, hd] caches passed transposed
    prefix = [KVSegment(r(Hkv, n, hd).transpose(0, 1), r(Hkv, n, hd).transpose(0, 1))
              for n in lens]
    return q, k, v, prefix


@pytest.mark.parametrize("T,lens,block", [(37, [20, 13], 8), (37, [5], 37), (1, [9, 1], 4),
                                          (64, [64], 16), (30, [], 7)],
                         ids=["two-segs-blocks", "one-block", "one-query", "even", "no-prefix"])
def test_blocks_and_merge_equal_the_reference(T, lens, block):
    """Query blocks (a partial last one), one to two prefix segments of any length, GQA, the
    chunk's own keys bottom-right masked per block; the output poisoned before the call."""
    q, k, v, prefix = case(T, lens, seed=T + len(lens))
    got = prefix_flash_attention(q, k, v, prefix, block=block)
    want = chunk_attention_torch(q, k, v, prefix)
    assert not got.isnan().any()
    assert (got - want).abs().max() <= 1e-5 * v.abs().max()


@pytest.mark.parametrize("T,lens,block", [(37, [20, 13], 8), (30, [], 7), (16, [5], 16)],
                         ids=["two-segs-blocks", "no-prefix", "one-block"])
def test_the_cudnn_route_s_blocks_equal_the_reference(T, lens, block):
    """The cudnn route's decomposition (the chunk's keys before a query block unmasked, its own
    square block causal: no non-square mask asked of cuDNN), through the CPU stand-in."""
    q, k, v, prefix = case(T, lens, seed=2 * T + len(lens))
    got = prefix_flash_attention(q, k, v, prefix, block=block, route="cudnn")
    want = chunk_attention_torch(q, k, v, prefix)
    assert (got - want).abs().max() <= 1e-5 * v.abs().max()
    with pytest.raises(StrataError):
        prefix_flash_attention(q, k, v, prefix, route="cutlass")


@pytest.mark.parametrize("route", ["flash", "cudnn"])
@pytest.mark.parametrize("T,lens,block", [(37, [20, 13], 8), (30, [], 7), (9, [40], 9)],
                         ids=["two-segs-blocks", "no-prefix", "one-block"])
def test_sinks_fold_into_the_blocks(T, lens, block, route):
    """GPT-OSS's sinks (a logit a head in every row's denominator, no value) after the blocks'
    merge equal chunk_attention's sinks, both routes' decompositions, a first chunk (no
    prefix) among them; sinks drawn around the rows' own lse (|lse| ~ 3 here) so they weigh,
    and a sink far above them drives the rows towards 0 as the reference does."""
    q, k, v, prefix = case(T, lens, seed=3 * T + len(lens))
    gen = torch.Generator().manual_seed(T)
    for sinks in (torch.randn(4, generator=gen) * 2 + 3, torch.tensor([40.0, -40.0, 0.0, 5.0])):
        got = prefix_flash_attention(q, k, v, prefix, block=block, route=route, sinks=sinks)
        want = chunk_attention_torch(q, k, v, prefix, sinks=sinks)
        plain = chunk_attention_torch(q, k, v, prefix)
        assert not got.isnan().any()
        assert (got - want).abs().max() <= 1e-5 * v.abs().max()
        assert (want - plain).abs().max() > 1e-2 * v.abs().max()    # the sinks weigh here
    with pytest.raises(StrataError, match="sinks"):
        prefix_flash_attention(q, k, v, prefix, sinks=torch.zeros(3))


def test_the_state_is_the_given_buffer():
    """The merged state lives in the buffer handed in (the layout's attn_flash: uint8 bytes or
    fp32), and one too small for a query block is refused in one line."""
    q, k, v, prefix = case(20, [11], seed=3)
    need = flash_rows(20) * flash_state_floats(4, 16)
    raw = torch.zeros(need * 4, dtype=torch.uint8)
    got = prefix_flash_attention(q, k, v, prefix, state=raw)
    assert raw.any()
    assert torch.equal(got, prefix_flash_attention(q, k, v, prefix,
                                                   state=torch.empty(need)))
    with pytest.raises(StrataError) as e:
        prefix_flash_attention(q, k, v, prefix, state=torch.empty(need - 1))
    assert "\n" not in str(e.value)


def test_int8_segments_are_refused():
    q, k, v, _ = case(4, [])
    seg = KVSegment(torch.zeros(3, 2, 16, dtype=torch.int8), torch.zeros(3, 2, 16,
                    dtype=torch.int8), torch.ones(3, 2), torch.ones(3, 2))
    with pytest.raises(StrataError) as e:
        prefix_flash_attention(q, k, v, [seg])
    assert "\n" not in str(e.value)


def test_the_route():
    """bf16 KV past hd 128 goes to blocks (up to flash's 256), cuDNN's where blocks_kernel says
    so, else FlashAttention-2's; int8 and narrower heads stay on chunk_attention; a pin
    overrides bf16's choice, never int8's nor a width flash refuses."""
    blocks = blocks_kernel()
    assert prefix_route(256, "bf16") == blocks and prefix_route(136, "bf16") == blocks
    assert FLASH_MIN_HD == 129 and prefix_route(132, "bf16") == "triton"   # not a multiple of 8
    assert CUDNN_MIN_HD == 128 and prefix_route(512, "bf16") == "triton"
    assert prefix_route(128, "bf16") == ("cudnn" if blocks == "cudnn" else "triton")
    assert prefix_route(120, "bf16") == "triton"
    assert prefix_route(256, "int8") == "triton" and prefix_route(256, "fp32") == "triton"
    with pin_prefix_route("flash"):
        assert prefix_route(128, "bf16") == "flash" and prefix_route(128, "int8") == "triton"
        assert prefix_route(512, "bf16") == "triton" and prefix_route(100, "bf16") == "triton"
        assert prefix_route(256, "bf16") == "flash"
    with pin_prefix_route("triton"):
        assert prefix_route(256, "bf16") == "triton"
    with pin_prefix_route("cudnn"):
        assert prefix_route(256, "bf16") == "cudnn" and prefix_route(256, "int8") == "triton"
    with pytest.raises(StrataError):
        with pin_prefix_route("cutlass"):
            pass


def test_the_plan_carves_the_state_where_the_route_is_flash():
    """The layout holds attn_flash [min(T, FLASH_ROWS), H (hd + 1)] fp32 in its attention phase
    for a bf16-KV hd-256 model (Qwen3.5) read through the engine's KV (a resident window) whose
    prompt takes more than one chunk (no rows for one chunk: nothing before it); none with the
    model's own cache, under int8, or at hd 128 unless cuDNN's blocks take it (one count: the
    planner asks prefix_route as the KV does)."""
    from strata.planning import KVPolicy, dims_for, layout_spec
    from strata.shapes import get_preset
    q35, q3 = get_preset("qwen3.5-35b-a3b"), get_preset("qwen3-30b-a3b")
    bf16 = KVPolicy("bf16", 32768, 131072)       # a resident window: the engine's own KV
    names = lambda shape, kv: set(layout_spec(kv=kv, shape=shape).names())  # noqa: E731
    assert "attn_flash" in names(q35, bf16)
    assert "attn_flash" not in names(q35, KVPolicy("bf16", None, 131072))   # the model's cache
    assert "attn_flash" not in names(q35, KVPolicy("int8", None, 131072))
    assert ("attn_flash" in names(q3, bf16)) == (prefix_route(128, "bf16") == "cudnn")
    with pin_prefix_route("cudnn"):
        assert "attn_flash" in names(q3, bf16)
    d = dims_for(q35, 32768, kv=bf16)
    assert (d["FQ"], d["FS"]) == (4096, q35.n_head * (q35.head_dim + 1))
    assert dims_for(q35, 131072, kv=bf16)["FQ"] == 0       # one chunk: no prefix, no state
    with pin_prefix_route("triton"):
        assert "attn_flash" not in names(q35, bf16)


@pytest.mark.gpu
@pytest.mark.parametrize("route", ["flash", "cudnn"])
@pytest.mark.parametrize("hd,T,lens", [(256, 5000, [3000, 4100]), (256, 64, [100]),
                                       (128, 300, [700])], ids=["hd256-blocks", "hd256-short",
                                                                "hd128"])
def test_flash_blocks_on_the_gpu(hd, T, lens, route):
    """FlashAttention-2 or cuDNN (GQA 16 / 2 heads as Qwen3.5) and the Triton merge against the
    fp32 reference on the same bf16 data, two query blocks at T 5000."""
    q, k, v, prefix = case(T, lens, H=16, Hkv=2, hd=hd, dtype=torch.bfloat16, device="cuda",
                           seed=hd + T)
    got = prefix_flash_attention(q, k, v, prefix, route=route).float()
    f = lambda t: t.float()                                                   # noqa: E731
    want = chunk_attention_torch(f(q), f(k), f(v), [KVSegment(f(s.k), f(s.v)) for s in prefix])
    assert not got.isnan().any()
    assert (got - want).abs().max() <= 1e-2 * v.float().abs().max()


def test_blocks_kernel_is_cudnn_on_hopper_with_cudnn_9():
    """cuDNN's blocks where they measured faster (Hopper, cuDNN 9+); FlashAttention-2's on an
    older GPU, an older cuDNN or none (the CPU: capability (0, 0))."""
    assert blocks_kernel((9, 0), 90100) == "cudnn" and blocks_kernel((10, 0), 91000) == "cudnn"
    assert blocks_kernel((8, 0), 91000) == "flash" and blocks_kernel((8, 9), 91000) == "flash"
    assert blocks_kernel((9, 0), 8907) == "flash" and blocks_kernel((9, 0), 0) == "flash"
    if not torch.cuda.is_available():
        assert blocks_kernel() == "flash"


def test_a_gpu_plan_on_a_host_without_one_counts_cudnn_s_blocks(monkeypatch):
    """strata plan on a host without CUDA plans strata's target GPU (Hopper, cuDNN 9): the
    prefix goes by cuDNN's blocks from hd 128 there, so the plan carves their state (more than
    an older GPU's plan, never less); outside a plan this host's own choice stands. (The host
    is one without CUDA or cuDNN whatever runs the test.)"""
    from strata.kernels.attention import flash_prefix
    from strata.kernels.pins import planning_for
    monkeypatch.setattr(flash_prefix, "_machine", lambda: ((0, 0), 0))
    from strata.planning import KVPolicy, layout_spec
    from strata.shapes import get_preset
    q3, bf16 = get_preset("qwen3-30b-a3b"), KVPolicy("bf16", 32768, 131072)
    with planning_for("cuda"):
        assert blocks_kernel() == "cudnn" and prefix_route(128, "bf16") == "cudnn"
        assert "attn_flash" in layout_spec(kv=bf16, shape=q3).names()
        assert blocks_kernel((8, 0), 90100) == "flash"          # a named machine is itself
    assert blocks_kernel() == "flash" and prefix_route(128, "bf16") == "triton"
    assert "attn_flash" not in layout_spec(kv=bf16, shape=q3).names()


@pytest.mark.gpu
@pytest.mark.parametrize("route", ["flash", "cudnn"])
@pytest.mark.parametrize("T,lens", [(5000, [3000]), (300, [])], ids=["blocks", "first-chunk"])
def test_sinks_on_the_gpu(T, lens, route):
    """GPT-OSS's full layers (hd 64, GQA 64 / 8, sinks) through the blocks and the sink fold
    against the fp32 reference with the same sinks, the bound of test_flash_blocks_on_the_gpu
    (the fold is one fp32 product a row)."""
    q, k, v, prefix = case(T, lens, H=64, Hkv=8, hd=64, dtype=torch.bfloat16, device="cuda",
                           seed=T + 64)
    sinks = torch.randn(64, generator=torch.Generator().manual_seed(5)).cuda() * 2 + 3
    got = prefix_flash_attention(q, k, v, prefix, route=route, sinks=sinks).float()
    f = lambda t: t.float()                                                   # noqa: E731
    want = chunk_attention_torch(f(q), f(k), f(v), [KVSegment(f(s.k), f(s.v)) for s in prefix],
                                 sinks=sinks)
    assert not got.isnan().any()
    assert (got - want).abs().max() <= 1e-2 * v.float().abs().max()


@pytest.mark.gpu
@pytest.mark.parametrize("preset", ["tiny-qwen35moe", "tiny-gpt-oss"])
def test_the_engine_reads_through_flash_blocks_on_the_gpu(tmp_path, monkeypatch, preset):
    """A tiny Qwen3.5 and a tiny GPT-OSS (hd 16; GPT-OSS's full layers with sinks) streamed
    in chunks of 16 through the engine's KV (32 tokens a layer resident, the rest host-held)
    with its bf16 prefix pinned to flash (and to cuDNN's) blocks: the warm-up (whose probes
    skip those layers) and the read run, and the logits agree with the chunk_attention route's
    within two bf16 reads' bound (2e-2, norm-relative, as test_packed_sequences)."""
    from strata.engine.prefill import EngineConfig, PrefillEngine
    from strata.packs.synth import ExpertFormats, synth_pack
    from strata.shapes import get_preset
    from strata.kernels.attention import flash_prefix
    pack = synth_pack(tmp_path / "h.pack", get_preset(preset), ExpertFormats.of("Q8_0"),
                      progress=False)
    tok = torch.arange(48) % 97 + 3
    got, calls = {}, []
    blocks = flash_prefix.prefix_flash_attention
    monkeypatch.setattr(flash_prefix, "prefix_flash_attention",
                        lambda *a, **kw: calls.append(kw.get("sinks") is not None) or
                        blocks(*a, **kw))
    for route in ("flash", "cudnn", "triton"):
        calls.clear()
        with pin_prefix_route(route):
            eng = PrefillEngine(pack, EngineConfig(vram=1 << 30, cache=200 << 10,
                                                   chunk=16, ring=2, max_prompt=48, device="cuda",
                                                   kv="bf16", kv_resident=32))
            eng.warmup(tok.numel())
            got[route] = eng.run(tok).logits.float().cpu()
        # the blocks ran for the full layers (GPT-OSS's with their sinks), and only when asked
        assert bool(calls) == (route != "triton"), route
        assert set(calls) <= {preset == "tiny-gpt-oss"}, route      # sinks only GPT-OSS's
    t = got["triton"]
    for route in ("flash", "cudnn"):
        assert not got[route].isnan().any(), route
        assert float((got[route] - t).norm() / t.norm()) < 2e-2, route


def test_a_pin_that_cannot_take_effect_is_refused(tmp_path, capsys):
    """--prefix-attention is used or refused, never dropped: refused in one line (exit 2) for
    an all-resident read, a read keeping the model's own KV cache, a route the KV cannot take
    (flash for int8), or the CPU."""
    from strata.cli import main
    from strata.engine.prompt_plan import check_prefix_pin
    from strata.engine.engine_config import EngineConfig
    from strata.shapes import get_preset
    q35 = get_preset("qwen3.5-35b-a3b")
    window = EngineConfig(vram=12 << 30, kv="bf16", kv_resident=32768, max_prompt=131072)
    with pin_prefix_route("triton"):
        check_prefix_pin(q35, window, "cuda")                    # it applies: no refusal
        check_prefix_pin(q35, EngineConfig(vram=12 << 30, kv="int8", max_prompt=131072),
                         "cuda")                 # int8's prefix goes by chunk_attention: it applies
        for cfg, dev, said in ((EngineConfig(vram=12 << 30, max_prompt=131072), "cuda",
                                "model's own KV cache"),
                               (window, "cpu", "on the CPU")):
            with pytest.raises(StrataError, match=said) as e:
                check_prefix_pin(q35, cfg, dev)
            assert "\n" not in str(e.value)
    with pin_prefix_route("flash"), pytest.raises(StrataError, match="int8"):
        check_prefix_pin(q35, EngineConfig(vram=12 << 30, kv="int8", kv_resident=32768,
                                           max_prompt=131072), "cuda")
    assert main(["plan", "--preset", "qwen3.5-35b-a3b", "--quant", "Q4_K", "--vram", "12GiB",
                 "--prompt-tokens", "8192", "--prefix-attention", "flash"]) == 2
    assert "--prefix-attention flash does not apply" in capsys.readouterr().err
    from strata.packs.synth import ExpertFormats, synth_pack
    pack = synth_pack(tmp_path / "t.pack", get_preset("tiny-qwen35moe"), ExpertFormats.of("Q8_0"),
                      progress=False)
    assert main(["prefill", str(pack), "--tokens", "1,2,3", "--prefix-attention", "flash"]) == 2
    err = capsys.readouterr().err
    assert "--prefix-attention shapes the streaming engine" in err and "Traceback" not in err
