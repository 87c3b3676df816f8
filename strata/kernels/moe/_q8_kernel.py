"""Triton kernel of the q8_1 activation quantizer (see strata.kernels.moe.q8 for the op).

Legend: R rows, D features, one program a BR x 32 tile (BR rows of one 32-feature block).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def roundf(v):
    """C roundf (halves away from zero) of fp32 v, as int32: trunc, then one step away from zero
    where the dropped fraction is at least a half. (floor(v + 0.5) is wrong for 0.49999997,
    whose sum rounds up to 1.0 in fp32.) The conversion truncates and v - trunc(v) is exact."""
    t = v.to(tl.int32)
    f = v - t.to(tl.float32)
    return t + (f >= 0.5).to(tl.int32) - (f <= -0.5).to(tl.int32)


@triton.jit
def q8_1_block(x):
    """fp32 [BR, 32] -> (codes int32 [BR, 32], d fp32 [BR], s fp32 [BR]) as ggml's
    quantize_row_q8_1_ref: d = amax / 127, id = 1/d (0 when d == 0), q = roundf(x * id),
    s = sum(q) * d. IEEE divisions (div_rn), so the GPU's approximate '/' never enters."""
    amax = tl.max(tl.abs(x), axis=1)                                   # [BR]
    d = tl.math.div_rn(amax, tl.full(amax.shape, 127.0, tl.float32))
    one = tl.full(d.shape, 1.0, tl.float32)
    inv = tl.where(d == 0.0, 0.0, tl.math.div_rn(one, tl.where(d == 0.0, one, d)))
    q = roundf(x * inv[:, None])                                       # [BR, 32]
    s = tl.sum(q, axis=1).to(tl.float32) * d
    return q, d, s


@triton.jit
def q8_order(q):
    """Codes [R, 32 n] with each 16-group put in strata.planes' Q8_ORDER (weight 8h + 2i + p at
    byte 4i + 2h + p): the swap of two axes of [2, 4, 2], moved in registers so a store of the
    result stays contiguous."""
    R: tl.constexpr = q.shape[0]
    G: tl.constexpr = q.shape[1] // 16
    return tl.reshape(tl.permute(tl.reshape(q, (R, G, 2, 4, 2)), (0, 1, 3, 2, 4)),
                      (R, G * 16))


@triton.jit
def q4_order(q):
    """Codes [R, 32 n] with each 32-block put in the order a plane-layout 4-bit block unpacks
    in (strata.planes._q4_act_order: weight 16s + 8h + 2i + t at place 16t + 4i + 2s + h), moved
    in registers as q8_order."""
    R: tl.constexpr = q.shape[0]
    G: tl.constexpr = q.shape[1] // 32
    return tl.reshape(tl.permute(tl.reshape(q, (R, G, 2, 2, 4, 2)), (0, 1, 5, 4, 2, 3)),
                      (R, G * 32))


@triton.jit
def code_order(q, ORDER: tl.constexpr):
    """q's codes in weight order (ORDER 0), Q8_ORDER (1: plane Q8_0's) or q4_order (2: plane
    Q4_0's)."""
    if ORDER == 1:
        q = q8_order(q)
    elif ORDER == 2:
        q = q4_order(q)
    return q


@triton.jit
def _q8_1_kernel(x_ptr, stride_x, q_ptr, stride_q, d_ptr, s_ptr, stride_d, n_rows,
                 BR: tl.constexpr, ORDER: tl.constexpr = 0):
    """x [R, D] (fp32 or bf16) -> q int8 [R, D], d fp16 [R, D/32], s fp16 [R, D/32]; ORDER: the
    codes stored in a plane format's order (code_order)."""
    pid_r = tl.program_id(0)
    kb = tl.program_id(1)                                              # 32-feature block
    rows = pid_r * BR + tl.arange(0, BR)                               # [BR]
    rmask = rows < n_rows
    cols = kb * 32 + tl.arange(0, 32)                                  # [32]
    r64 = rows.to(tl.int64)[:, None]
    x = tl.load(x_ptr + r64 * stride_x + cols[None, :], mask=rmask[:, None], other=0.0)
    q, d, s = q8_1_block(x.to(tl.float32))
    q = q.to(tl.int8)
    q = code_order(q, ORDER)
    tl.store(q_ptr + r64 * stride_q + cols[None, :], q, mask=rmask[:, None])
    at = rows.to(tl.int64) * stride_d + kb
    tl.store(d_ptr + at, d.to(tl.float16), mask=rmask)
    tl.store(s_ptr + at, s.to(tl.float16), mask=rmask)
