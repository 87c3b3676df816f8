"""The interleaved-pair RoPE (DeepSeek's MLA rope key and query; GGUF rope type NORM) rotated in
place: no fp32 copies of the rotated columns beside the query.

Legend: G heads (or any leading groups), T tokens, R rotated dims (even), P = R / 2 pairs.

    rope_pairs_(x [G, T, R], cos, sin [T, >= P])   x[..., 2i], x[..., 2i + 1] rotated by the
        angle of column i, in fp32, rounded back to x's dtype, written into x (any strides with
        a unit last one: MLA's q_pe is a column range of the query)
    rope_pairs_torch_                                    its plain-torch twin, the same signature:
        rotated_pairs a group of TORCH_HEADS at a time, copied back
    rotated_pairs(x [..., T, R], cos, sin) -> a new tensor: the arithmetic itself (the models'
        strata.models.layers.apply_rope_pairs, the key's rope)

rotated_pairs computes a * c - b * s and b * c + a * s with each product and sum rounded to
fp32 apart; the kernel does the same with fp fusion off, so the two agree bit for bit
(tests/kernels/test_rope_pairs.py). The twin's fp32 temporaries are six [TORCH_HEADS, T, P] a
group, where the kernel keeps none: 384 MiB of DeepSeek-V3's 32K chunk at 16 heads a group.
"""
from __future__ import annotations

import torch
import triton

from strata._backend import INTERPRET
from strata.errors import StrataError
from strata.kernels.norm import FLOATS, NormTile, _on_device

TORCH_HEADS = 16     # the twin's heads a group (its fp32 temporaries grow with it)
ROWS_ELEMS = 2048    # pairs_tile: a program's pairs (rows x next_pow2(P))


def pairs_tile(R: int) -> NormTile:
    """The default launch of rows R wide: ROWS_ELEMS pairs a program (one row at least), 4
    warps (sm_90: 64 registers, no spills at R 64; tests/kernels/compile_norm.py)."""
    return NormTile(max(1, ROWS_ELEMS // triton.next_power_of_2(max(1, R // 2))), 4)


def _check(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    ok = (isinstance(x, torch.Tensor) and x.dim() == 3 and x.dtype in FLOATS
          and x.shape[-1] % 2 == 0 and (x.shape[-1] == 0 or x.stride(-1) == 1))
    P = x.shape[-1] // 2 if ok else 0
    ok = ok and all(isinstance(m, torch.Tensor) and m.dim() == 2 and m.shape[0] == x.shape[1]
                    and m.shape[1] >= P and m.device == x.device and m.stride(-1) == 1
                    and m.dtype in FLOATS for m in (cos, sin))
    if not ok:
        raise StrataError(
            f"rope_pairs_ takes x [G, T, R] float with R even and a unit last stride, cos / sin "
            f"[T, >= R/2] float with a unit last stride on x's device; got x "
            f"{getattr(x, 'dtype', None)} {list(getattr(x, 'shape', []))} strides "
            f"{x.stride() if isinstance(x, torch.Tensor) else None}, cos "
            f"{getattr(cos, 'dtype', None)} {list(getattr(cos, 'shape', []))}, sin "
            f"{getattr(sin, 'dtype', None)} {list(getattr(sin, 'shape', []))}")


def rope_pairs_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *,
                tile: NormTile | None = None) -> torch.Tensor:
    """x [G, T, R] rotated in place by cos / sin [T, >= R/2] (the module docstring) -> x.
    `tile` pins the launch (block_m rows a program, num_warps; default: pairs_tile(R))."""
    from strata.kernels._rope_pairs_kernel import _rope_pairs_kernel
    _check(x, cos, sin)
    G, T, R = x.shape
    n = G * T
    if n == 0 or R == 0:
        return x
    P = R // 2
    t = tile or pairs_tile(R)
    with _on_device(x):
        _rope_pairs_kernel[(triton.cdiv(n, t.block_m),)](
            x, cos, sin, n, T, x.stride(0), x.stride(1), cos.stride(0), sin.stride(0), P=P,
            PB=triton.next_power_of_2(P), BM=t.block_m, INTERP=INTERPRET,
            num_warps=t.num_warps, enable_fp_fusion=False)
    return x


def rotated_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., T, R]: pairs (x[2i], x[2i+1]) rotated by angle i (cos/sin [T, >= R/2]: column i
    the angle of pair i, as rope_cos_sin gives them), in fp32, rounded to x's dtype: a new
    tensor of x's shape."""
    R = x.shape[-1]
    c, s = cos[..., :R // 2], sin[..., :R // 2]
    a, b = x[..., 0::2].float(), x[..., 1::2].float()
    out = torch.stack([a * c - b * s, b * c + a * s], dim=-1)     # [..., T, R/2, 2]
    return out.flatten(-2).to(x.dtype)


def rope_pairs_torch_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *,
                      tile: NormTile | None = None) -> torch.Tensor:
    """rope_pairs_'s twin: rotated_pairs a group of TORCH_HEADS at a time, copied into x
    (`tile` accepted and ignored: the signature's)."""
    _check(x, cos, sin)
    for h in range(0, x.shape[0], TORCH_HEADS):
        x[h:h + TORCH_HEADS].copy_(rotated_pairs(x[h:h + TORCH_HEADS], cos, sin))
    return x


__all__ = ["TORCH_HEADS", "pairs_tile", "rope_pairs_", "rope_pairs_torch_", "rotated_pairs"]
