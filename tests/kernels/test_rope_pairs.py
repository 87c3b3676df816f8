"""The interleaved-pair RoPE in place (strata.kernels.rope_pairs): the kernel (Triton's
interpreter here, CUDA on the GPU) and its twin write into x exactly the bits rotated_pairs
returns (the models' apply_rope_pairs), on MLA's layout (q_pe a column range of the [H, T, hd]
view of a [T, H, hd] query) and on plain tensors, leaving every other column as it was; bad
operands are refused in one line."""
from __future__ import annotations

import pytest
import torch

from strata.errors import StrataError
from strata.kernels.norm import NormTile
from strata.kernels.rope_pairs import rope_pairs_, rope_pairs_torch_, rotated_pairs
from strata.models.layers import apply_rope_pairs, rope_cos_sin, yarn_cos_sin

FNS = pytest.mark.parametrize("fn", [rope_pairs_, rope_pairs_torch_], ids=["kernel", "twin"])


def _query(T, H, N, R, dt, g, device="cpu"):
    """A [T, H, N + R] query's [H, T, hd] view, its q_pe columns, cos / sin [T, R]."""
    q = (torch.randn(T, H, N + R, generator=g) * 4).to(dt).to(device).transpose(0, 1)
    cos, sin = rope_cos_sin(torch.arange(T) * 37 + 5, R, 10000.0)
    return q, q[..., N:], cos.to(device), sin.to(device)


@FNS
@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("T,H,N,R", [(37, 5, 16, 8), (1, 1, 0, 2), (70, 18, 128, 64),
                                     (9, 3, 24, 6)])
def test_in_place_is_the_models_bits_on_mlas_layout(fn, dt, T, H, N, R):
    g = torch.Generator().manual_seed(T * H + R)
    q, q_pe, cos, sin = _query(T, H, N, R, dt, g)
    before = q.clone()
    want = rotated_pairs(q_pe, cos, sin)
    assert torch.equal(want, apply_rope_pairs(q_pe, cos, sin))       # the models' own call
    assert fn(q_pe, cos, sin).data_ptr() == q_pe.data_ptr()
    assert torch.equal(q[..., N:], want)
    assert torch.equal(q[..., :N], before[..., :N])                    # q_nope untouched
    assert not torch.equal(want, before[..., N:]) or T == 1 and R == 2 # it did rotate


@FNS
@pytest.mark.parametrize("tile", [None, NormTile(1, 1), NormTile(8, 2), NormTile(512, 8)])
def test_a_pinned_tile_is_the_same_bits(fn, tile):
    """A pinned launch (rows a program, warps) rotates as the default one (the twin ignores it)."""
    g = torch.Generator().manual_seed(9)
    q, q_pe, cos, sin = _query(37, 5, 16, 8, torch.bfloat16, g)
    want = rotated_pairs(q_pe, cos, sin)
    assert torch.equal(fn(q_pe, cos, sin, tile=tile), want)


@FNS
def test_yarn_angles_and_a_wider_cos_table(fn):
    """DeepSeek's YaRN cos / sin (scaled by its attention factor), given wider than R/2: the
    kernel reads columns 0..R/2 of each row, as the twin slices them."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 33, 64, generator=g).bfloat16()
    cos, sin = yarn_cos_sin(torch.arange(33) * 101, 64, 10000.0, 40.0, 4096)
    want = rotated_pairs(x, cos, sin)
    assert torch.equal(fn(x, cos, sin), want)


@FNS
def test_bad_operands_are_refused_in_one_line(fn):
    x, cos = torch.zeros(2, 4, 8, dtype=torch.bfloat16), torch.zeros(4, 8)
    for bad in ((x[..., :7], cos, cos), (x.transpose(1, 2), cos, cos), (x, cos[:3], cos),
                (x, cos, cos[:, :3]), (x[0], cos, cos), (x.int(), cos, cos)):
        with pytest.raises(StrataError, match="rope_pairs_ takes x"):
            fn(*bad)


@pytest.mark.gpu
@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float32])
def test_the_kernel_is_the_twins_bits_on_the_gpu(dt):
    """CUDA: DeepSeek-V3's heads (128 of 128 + 64) at 3,000 tokens, the kernel against the twin
    (fp fusion off in the launch: the same three roundings of each rotated value)."""
    g = torch.Generator().manual_seed(11)
    q, q_pe, cos, sin = _query(3000, 128, 128, 64, dt, g, "cuda")
    q2 = q.clone()
    rope_pairs_(q_pe, cos, sin)
    rope_pairs_torch_(q2[..., 128:], cos, sin)
    assert torch.equal(q, q2)
