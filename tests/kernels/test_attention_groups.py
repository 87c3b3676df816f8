"""Attention launches whose output torch allocates beside the carve, bounded
(strata.kernels.attention.flash: OUT_BYTES, launch_groups): a first chunk's SDPA over groups of
whole GQA head groups where one launch's output would pass the bound, each group's output into
the caller's buffer; the flash / cuDNN prefix blocks' o into the caller's buffer. The heads are
independent, so the groups read as the one launch: bit for bit on the CPU."""
from __future__ import annotations

import pytest
import torch

from strata.kernels.attention.flash import OUT_BYTES, first_chunk_attention, launch_groups
from strata.kernels.attention.flash_prefix import prefix_flash_attention
from tests.kernels.test_flash_prefix import case


def test_launch_groups_take_whole_gqa_groups_within_the_bound():
    # qwen3-30b-a3b: 32 query heads over 4 key heads of 128; 32K tokens in one launch is 256 MiB
    assert launch_groups(32, 4, 8192, 128, 2) == [slice(0, 32)]
    assert launch_groups(32, 4, 32768, 128, 2) == [slice(0, 16), slice(16, 32)]
    # GLM-4.5-Air: 96 over 8 of 128: 768 MiB at 32K; a key head's 12 query heads take 96 MiB
    assert [g.stop - g.start for g in launch_groups(96, 8, 32768, 128, 2)] == [12] * 8
    # a key head's queries past the bound alone still launch (one group at least)
    assert launch_groups(8, 1, 1 << 20, 256, 2) == [slice(0, 8)]
    for H, Hkv, rows in ((32, 4, 32768), (64, 8, 131072), (12, 3, 5), (40, 2, 65536)):
        gs = launch_groups(H, Hkv, rows, 128, 2)
        assert gs[0].start == 0 and gs[-1].stop == H
        assert all(a.stop == b.start for a, b in zip(gs, gs[1:]))
        assert all(g.start % (H // Hkv) == 0 and g.stop % (H // Hkv) == 0 for g in gs)
        G = H // Hkv
        assert all((g.stop - g.start) * rows * 256 <= OUT_BYTES or g.stop - g.start == G
                   for g in gs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_first_chunk_in_groups_reads_as_one_launch(dtype, monkeypatch):
    T, H, Hkv, hd = 40, 6, 3, 16
    q, k, v, _ = case(T, [], H=H, Hkv=Hkv, hd=hd, dtype=dtype, seed=7)
    whole = first_chunk_attention(q, k, v)
    launches, real = [], torch.nn.functional.scaled_dot_product_attention

    def spy(q, *a, **kw):
        launches.append(q.shape[1])
        return real(q, *a, **kw)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    two = T * hd * q.element_size() * 2                  # the output of two query heads
    out = torch.full_like(q, float("nan"))
    got = first_chunk_attention(q, k, v, out=out, out_bytes=two)
    assert launches == [2, 2, 2] and got.data_ptr() == out.data_ptr()
    assert torch.equal(got, whole)
    launches.clear()
    alloc = first_chunk_attention(q, k, v, out_bytes=two)      # no buffer: one launch's own
    assert launches == [6] and torch.equal(alloc, whole)
    launches.clear()
    got = first_chunk_attention(q, k, v, out=out, out_bytes=3 * two)
    assert launches == [6] and got.data_ptr() == out.data_ptr()   # one launch, into out
    assert torch.equal(got, whole)


def test_the_prefix_blocks_write_the_given_output():
    q, k, v, prefix = case(37, [20, 13], seed=11)
    for route in ("flash", "cudnn"):
        out = torch.full_like(q, float("nan"))
        got = prefix_flash_attention(q, k, v, prefix, block=8, route=route, out=out)
        assert got.data_ptr() == out.data_ptr()
        assert torch.equal(got, prefix_flash_attention(q, k, v, prefix, block=8, route=route))


@pytest.mark.gpu
def test_a_first_chunk_in_groups_on_the_gpu():
    """qwen3-30b-a3b's heads (32 over 4, hd 128) at 16,384 tokens, bf16: under a bound of a
    quarter of the 128 MiB output the chunk launches four times, allocates one group's output
    beside the buffer it writes, and reads as the one launch (its rows, head by head, the same
    kernel's)."""
    T, H, Hkv, hd = 16384, 32, 4, 128
    q, k, v, _ = case(T, [], H=H, Hkv=Hkv, hd=hd, dtype=torch.bfloat16, device="cuda", seed=3)
    whole = first_chunk_attention(q, k, v)
    out = torch.empty_like(q)
    quarter = T * H * hd * 2 // 4
    first_chunk_attention(q, k, v, out=out, out_bytes=quarter)       # warm
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    got = first_chunk_attention(q, k, v, out=out, out_bytes=quarter)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    assert extra <= quarter + H * T * 4 + (1 << 20), extra          # o, its lse, slack
    a, b = whole.float(), got.float()
    assert float((a - b).abs().max() / a.abs().max()) < 2e-2
