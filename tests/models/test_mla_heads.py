"""MLA's block launches over groups of heads (strata.models.mla_launch.launch_heads): a launch
whose output would pass the launch's out_bytes goes over the most heads that fit, each group
merged into its own rows of the state. The heads are independent, so the result is the one
launch's: bit for bit on the CPU (the reference kernel a head at a time is the same products),
under every backend and merge, with one key block and with many."""
from __future__ import annotations

import pytest
import torch

from strata.errors import StrataError
from strata.models import mla_attend
from strata.models.mla import mla_chunk_attention
from strata.models.mla_launch import (BACKENDS, MERGES, OUT_BYTES, MLALaunch, launch_heads,
                                      pin_mla_launch, value_bytes)
from strata.models.mla_scratch import MLAScratch, mla_value_width
from tests.models.test_mla_blocks import draw


def test_launch_heads_keeps_the_output_within_out_bytes():
    at = MLALaunch(out_bytes=OUT_BYTES)
    # DeepSeek-V3: 128 value heads of 128 in bf16; B 4096 is one launch of 128 MiB
    assert launch_heads(128, 4096, 128, 2, at) == 128
    assert launch_heads(128, 16384, 128, 2, at) == 32          # 4 launches of 128 MiB
    assert launch_heads(128, 32768, 192, 2, at) == 10          # flash's padded values
    assert launch_heads(3, 5, 7, 4, MLALaunch(out_bytes=1)) == 1    # at least one head
    assert launch_heads(3, 5, 7, 4, MLALaunch(out_bytes=2 * 5 * 7 * 4)) == 2
    for n in (1, 77, 4096, 32768):
        for width in (16, 128, 192):
            h = launch_heads(128, n, width, 2, at)
            assert 1 <= h <= 128 and (h == 1 or h * n * width * 2 <= OUT_BYTES)
            assert h == 128 or (h + 1) * n * width * 2 > OUT_BYTES
    # the efficient kernel's fp32 accumulator beside its output; the others hold the output
    assert [value_bytes(b, 2) for b in ("efficient", "flash", "triton", "cudnn")] == [6, 2, 2, 2]
    for bad in (0, -1, True, 1.5):
        with pytest.raises(StrataError, match="out_bytes must be a positive int"):
            MLALaunch(out_bytes=bad)


LAUNCHES = [(b, m) for b in BACKENDS for m in MERGES if b != "triton" or m == "fused"]


@pytest.mark.parametrize("backend,merge", LAUNCHES)
@pytest.mark.parametrize("T,P,block", [(9, 0, 16), (9, 14, 4)], ids=["one-block", "blocks"])
def test_groups_of_heads_read_as_one_launch(backend, merge, T, P, block, monkeypatch):
    H, N, R, Hv, L = 5, 6, 2, 4, 7
    ins = draw(H, T, P, N, R, Hv, L, seed=T + P)
    kw = dict(v_head_dim=Hv, scale=(N + R) ** -0.5, block=block)
    heads, real = [], mla_attend.attend_block_ref

    def spy(q, k, v, masked, scale):
        o, lse = real(q, k, v, masked, scale)
        heads.append((q.shape[0], q.shape[1], o.numel() * o.element_size()))
        return o, lse
    monkeypatch.setattr("strata.models.mla_attend.attend_block_ref", spy)

    def read(out_bytes):
        heads.clear()
        with pin_mla_launch(backend=backend, merge=merge, block=block, out_bytes=out_bytes):
            sc = MLAScratch.of(H, N + R, Hv, T, P + T, "cpu", dtype=torch.float32, block=block)
            out = torch.full((T, H, Hv), float("nan"))
            return mla_chunk_attention(*ins, sdpa=True, scratch=sc, out=out, **kw), list(heads)
    whole, launches = read(OUT_BYTES)
    vw = mla_value_width(N + R, Hv, backend)
    item = value_bytes(backend, 4)                       # its output (+ fp32 accumulator)
    per_head = min(block, T) * vw * item                 # one head's bytes of a query block
    got, split = read(2 * per_head)                      # two heads a launch at most
    assert torch.isfinite(got).all() and torch.equal(got, whole)
    if backend == "triton":                              # it writes the state: nothing to split
        assert split == launches
        return
    assert launches and all(h == H for h, _, _ in launches)
    # every launch of a full query block in groups of 2, 2 and 1 heads; a shorter block's
    # groups hold more (its heads' output is smaller); every group within the bytes
    assert sum(h for h, _, _ in split) == H * len(launches) and len(split) > len(launches)
    assert all(h == launch_heads(H, n, vw, item, MLALaunch(out_bytes=2 * per_head))
               or h == H % launch_heads(H, n, vw, item, MLALaunch(out_bytes=2 * per_head))
               for h, n, _ in split)
    assert [h for h, n, _ in split if n == min(block, T)][:3] == [2, 2, 1]
    assert all(b * item // 4 <= 2 * per_head for _, _, b in split)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cudnn", "efficient"])
def test_a_grown_block_stays_within_out_bytes_on_the_gpu(backend):
    """DeepSeek-V3's heads (128, q/k 192, v 128), one masked block of 4,096 queries: under an
    out_bytes of a quarter of its 128 MiB output the launch goes over groups of heads (cudnn:
    four of 32; efficient, whose fp32 accumulator counts beside its output: of 10), and what
    the call allocates beyond its scratch and output is the chunk's joined q and one group's
    launch (its output and lse), not the whole launch's; the result reads as the one
    launch's."""
    from tests.models.test_mla_blocks import BF16_REL, SLACK, transient_beyond
    H, N, R, Hv, L, T, block = 128, 128, 64, 128, 512, 4096, 4096
    ins = draw(H, T, 0, N, R, Hv, L, seed=5, dtype=torch.bfloat16, device="cuda")
    out = torch.empty(T, H, Hv, dtype=torch.bfloat16, device="cuda")
    quarter = T * H * Hv * 2 // 4
    got = {}
    for ob in (OUT_BYTES, quarter):
        with pin_mla_launch(backend=backend, block=block, out_bytes=ob):
            sc = MLAScratch.of(H, N + R, Hv, T, T, "cuda", block=block)
            kw = dict(v_head_dim=Hv, scale=(N + R) ** -0.5, block=block, scratch=sc, out=out)
            extra = transient_beyond(ins, kw)
            got[ob] = out.clone()
    item = value_bytes(backend, 2)                   # bf16 output (+ fp32 accumulator)
    heads = launch_heads(H, T, Hv, item, MLALaunch(out_bytes=quarter))
    assert heads == (32 if backend == "cudnn" else 10)
    per = T * Hv * item + -(-T // 32) * 32 * 4
    bound = H * T * (N + R) * 2 + heads * per + SLACK
    assert extra <= bound, f"{backend}: {extra} B beyond the scratch, bound {bound} B"
    a, b = got[OUT_BYTES].float(), got[quarter].float()
    assert float((a - b).abs().max() / a.abs().max()) < BF16_REL
