"""Activations quantized per row in blocks of 32, as llama.cpp's q8_1 holds them (the int8
expert GEMM's input, strata.kernels.moe.int8).

Legend: R rows, D features (D % 32 == 0), B = D / 32 blocks a row.

    for each row and block b of 32 features x[0:32]:
        d = amax|x| / 127            (fp32)
        q = roundf(x * (1/d))        (int8; 0 when d == 0; roundf: halves away from zero)
        s = sum(q) * d               (fp32)
    stored as q int8 [R, D], d fp16 [R, B], s fp16 [R, B]: block_q8_1's fields (ggml's d and s
    are fp16 too), each rounded to nearest even.

This is ggml's CPU reference quantize_row_q8_1_ref bit for bit (tests compare against the C
function). llama.cpp's CUDA MMQ quantizer (quantize_mmq_q8_1) differs in the last place: it
computes 127/amax and d = 1/(127/amax) and, built with -use_fast_math, divides approximately,
so no plain reference reproduces its bits; the reference one does on every device here.

`order` stores the codes in the order of a plane-layout matrix's codes (d and s unchanged), so an
integer dot of the two is the dot in weight order (strata.kernels.moe.plane_int8): "Q8_0" (or
True) each 16-group in strata.planes' Q8_ORDER, "Q4_0" (or "Q4_K", whose codes unpack in the same
places) each 32-block in the order its 4-bit codes unpack in (strata.planes.act_order).

`quantize_q8_1` (Triton) and `quantize_q8_1_torch` (plain torch) share one signature and give the
same bits.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton

from strata.errors import StrataError
from strata.formats._util import round_away
from strata.kernels.moe import _q8_kernel as _k
from strata.planes import act_order

QK = 32          # features a block (ggml's QK8_1)
BLOCK_ROWS = 16  # rows a program
# an `order` -> the kernel's ORDER (code_order) and the format whose plane order it is
ORDERS = {False: (0, None), None: (0, None), True: (1, "Q8_0"), "Q8_0": (1, "Q8_0"),
          "Q4_0": (2, "Q4_0"), "Q4_K": (2, "Q4_K")}


class Q8Rows(NamedTuple):
    """Rows quantized to q8_1: q int8 [R, D], d fp16 [R, D/32], s fp16 [R, D/32]."""
    q: torch.Tensor
    d: torch.Tensor
    s: torch.Tensor


def _check(x: torch.Tensor, order=False) -> None:
    if order not in ORDERS:
        raise StrataError(f"q8_1 stores codes in a plane order of Q8_0, Q4_0 or Q4_K (or none), "
                          f"got {order!r}")
    if x.dim() != 2 or x.shape[1] % QK:
        raise StrataError(f"q8_1 quantizes [R, D] rows with D a multiple of {QK}, got "
                          f"{tuple(x.shape)}")
    if x.dtype not in (torch.float32, torch.bfloat16):
        raise StrataError(f"q8_1 quantizes fp32 or bf16 rows, got {x.dtype}")


def _empty(x: torch.Tensor) -> Q8Rows:
    R, D = x.shape
    return Q8Rows(torch.empty(R, D, dtype=torch.int8, device=x.device),
                  torch.empty(R, D // QK, dtype=torch.float16, device=x.device),
                  torch.empty(R, D // QK, dtype=torch.float16, device=x.device))


def quantize_q8_1(x: torch.Tensor, out: Q8Rows | None = None, order=False) -> Q8Rows:
    """x [R, D] fp32/bf16 -> Q8Rows (see module docstring); `out`: buffers to write instead;
    `order`: the codes' plane order (False, True / "Q8_0", "Q4_0", "Q4_K")."""
    _check(x, order)
    out = out or _empty(x)
    R, D = x.shape
    if R:
        x = x if x.stride(1) == 1 else x.contiguous()
        grid = (triton.cdiv(R, BLOCK_ROWS), D // QK)
        # no fused multiply-add: roundf's fraction v - trunc(v) must read the rounded product
        # v = x * id (contracted into fma(x, id, -t) it rounds codes at a half otherwise than
        # ggml and the twin: the GPU's default, which the interpreter never does)
        _k._q8_1_kernel[grid](x, x.stride(0), out.q, out.q.stride(0), out.d, out.s,
                              out.d.stride(0), R, BR=BLOCK_ROWS, ORDER=ORDERS[order][0],
                              enable_fp_fusion=False)
    return out


def quantize_q8_1_torch(x: torch.Tensor, out: Q8Rows | None = None,
                        order=False) -> Q8Rows:
    """Plain-torch reference of `quantize_q8_1` (same signature, same bits)."""
    _check(x, order)
    R, D = x.shape
    xb = x.float().reshape(R, D // QK, QK)
    # both divisions in fp64, rounded once to fp32: the correctly rounded fp32 quotient (53 bits >
    # 2 * 24 + 2) on every device; CUDA torch divides by a Python scalar as a multiply by its
    # reciprocal, one ulp off ggml's amax / 127 (the H100 run's first int8 assert)
    amax = xb.abs().amax(dim=2)                                          # [R, B]
    d = (amax.double() / 127).float()
    inv = torch.where(d == 0, torch.zeros_like(d), (1 / d.double()).float())
    q = round_away(xb * inv[..., None]).to(torch.int32)                  # [R, B, 32]
    s = q.sum(dim=2).to(torch.float32) * d
    q = q.to(torch.int8).reshape(R, D)
    fmt = ORDERS[order][1]
    res = Q8Rows(act_order(q, fmt) if fmt else q, d.to(torch.float16), s.to(torch.float16))
    if out is None:
        return res
    for o, r in zip(out, res):
        o.copy_(r)
    return out

