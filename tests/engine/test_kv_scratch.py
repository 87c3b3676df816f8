"""PromptKV's int8 attention through the Triton kernel's "expand" path, as the engine drives it
on CUDA, here in the interpreter: host-held KV staged back, a resident window, and an expansion
scratch shorter than the prefix, so later chunks run in pieces that carry the softmax state.

Legend: T chunk tokens, H query heads, Hkv kv heads, hd head width.
"""
from __future__ import annotations

import pytest
import torch

from strata.kernels.attention import AttnScratch, kv_token_bytes, pin_attention
from strata.models.kv import PromptKV

H, HKV, HD, N, RES, T = 4, 2, 16, 100, 40, 20      # 60 host-held tokens, chunks of 20


def read(scratch, device="cpu"):
    """Per-chunk outputs of one layer's attention over the whole prompt."""
    gen = torch.Generator().manual_seed(5)
    stage = torch.empty((N - RES) * kv_token_bytes("int8", HKV, HD), dtype=torch.uint8,
                        device=device)
    kv = PromptKV(1, HKV, HD, N, kv="int8", resident=RES, devices=[device], stages={0: stage},
                  scratch={0: scratch} if scratch is not None else None)
    outs = []
    for _ in range(N // T):
        q, k, v = (torch.randn(T, h, HD, generator=gen).to(torch.bfloat16).to(device)
                   for h in (H, HKV, HKV))
        outs.append(kv.attend(0, q, k, v))
        kv.commit(T)
    return outs


@pytest.fixture
def kernel_on_cpu():
    """PromptKV picks the torch reference on the CPU; pin it to the kernel (interpreter)."""
    with pin_attention("triton"):
        yield


def test_pieces_through_prompt_kv(kernel_on_cpu):
    """64 scratch rows against prefixes of up to 80 int8 tokens (60 staged + 20 resident): the
    last chunks take two launches. Their outputs equal the one-launch outputs (the launcher's
    own scratch of the whole prefix) bit for bit, and the carved scratch was written."""
    sc = AttnScratch.of(HKV, HD, 64, "cpu", T=T, H=H)        # NaN-poisoned (conftest)
    one = read(None)
    pieced = read(sc)
    for a, b in zip(one, pieced):
        assert torch.isfinite(b).all() and torch.equal(a, b)
    assert torch.isfinite(sc.k[:N - RES]).all() and torch.isfinite(sc.state).all()  # 60 staged rows


@pytest.mark.gpu
def test_pieces_through_prompt_kv_gpu():
    """The same on CUDA, where PromptKV calls chunk_attention itself: the same kernel on the
    same GPU, launched in pieces or once, gives the same bits."""
    dev = torch.device("cuda")
    sc = AttnScratch.of(HKV, HD, 64, dev, T=T, H=H)
    for a, b in zip(read(None, dev), read(sc, dev)):
        assert torch.isfinite(b).all() and torch.equal(a, b)


def test_a_flash_buffer_is_not_a_tile_scratch(kernel_on_cpu):
    """A layer whose plan carved the flash blocks' buffer keeps it in `flash_state`, apart from
    the AttnScratch chunk_attention takes in `scratch`: a chunk of such a layer that goes to
    chunk_attention after all (the packed sequences of a perplexity read), and the warm-up's
    probe of those launches, never take the flash buffer for an AttnScratch (the GPU read `.k`
    of that tensor when both shared `scratch`)."""
    buf = torch.empty(64, dtype=torch.uint8)
    sc = AttnScratch(torch.empty(8, HKV, HD, dtype=torch.bfloat16),
                     torch.empty(8, HKV, HD, dtype=torch.bfloat16))
    kv = PromptKV(2, HKV, HD, N, kv="bf16", devices=["cpu"] * 2, scratch={1: sc})
    kv.flash_state = {0: buf}
    gen = torch.Generator().manual_seed(1)
    for l in (0, 1):     # a bf16 prefix through the kernel with the flash buffer in place
        q, k, v = (torch.randn(T, h, HD, generator=gen).to(torch.bfloat16) for h in (H, HKV, HKV))
        kv.attend(l, q, k, v)
    kv.commit(T)
    q, k, v = (torch.randn(T, h, HD, generator=gen).to(torch.bfloat16) for h in (H, HKV, HKV))
    assert torch.isfinite(kv.attend(0, q, k, v).float()).all()
    kv.release()
    assert kv.flash_state == {} and kv.scratch == {}
    # the warm-up probes the real prompt's launches through chunk_attention beside the flash
    # buffer (where the GPU read `.k` of it)
    from strata.engine.warm import ProbePlan, WarmKV
    warm = WarmKV(1, HKV, HD, 2 * T, kv="bf16", devices=["cpu"], stages={},
                  probe=ProbePlan(N, T, None), stage_bufs={})
    warm.flash_state = {0: buf}
    q, k, v = (torch.randn(T, h, HD, generator=gen).to(torch.bfloat16) for h in (H, HKV, HKV))
    warm.attend(0, q, k, v)
    assert warm.probes > 0

