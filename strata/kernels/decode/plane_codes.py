"""The plane layout's decode (strata.planes: a matrix's codes in one plane, its scales in
another), shared by the plane GEMM and its dequantize (strata.kernels.moe._plane_kernel).

A format with a plane layout says so in its bundle: PLANE_PACK weights a code byte (Q8_0 1, Q4_0 /
Q4_K 2), plane_codes(b, MAGIC, BIASED, INTERP) its codes from a tile of code bytes, plane_scales(
s_ptr, n_in, offs_n, n_mask, k0, BK) a step's factors, PAIR a min to subtract, PLANE_FMA that its
codes come biased (CODE_BIAS + q) so a weight is one fused multiply-add.

Legend: BN rows, BK weights a step, R = BK / 32 scale runs a step; b code bytes [BN, BK / PACK].
Each weight is formed in fp32 as the ggml decoder does (q * d, d * (q - 8), (d·sc) * q - dmin·m:
the products are exact, so an FMA cannot change the one rounding of the last); MAGIC: the codes
to float by a float add on their bits, full rate, where an int->float convert runs at a quarter.
"""
import triton
import triton.language as tl

# 1.5 * 2**23: a float whose ulp is 1 on [2**23, 2**24), so its bits plus a small signed int q are
# the float CODE_BIAS + q
CODE_BIAS = tl.constexpr(12582912.0)
CODE_BIAS_BITS = tl.constexpr(0x4B400000)


@triton.jit
def load_codes(c_ptr, row_bytes, offs_n, n_mask, k0, BK: tl.constexpr, FMT: tl.constexpr,
               EVEN: tl.constexpr = False):
    """uint8 [BN, BK / PLANE_PACK]: the code bytes of weights k0 .. k0+BK of rows offs_n of a
    code plane (row stride row_bytes; 0 where masked). EVEN: k0 + BK is inside the row."""
    BB: tl.constexpr = BK // FMT.PLANE_PACK
    offs_b = k0 // FMT.PLANE_PACK + tl.arange(0, BB)
    if EVEN:
        m = n_mask[:, None]
    else:
        m = n_mask[:, None] & (offs_b < row_bytes)[None, :]
    return tl.load(c_ptr + offs_n[:, None].to(tl.int64) * row_bytes + offs_b[None, :], mask=m,
                   other=0)


@triton.jit
def load_scales(s_ptr, n_in, offs_n, n_mask, k0, BK: tl.constexpr):
    """(d, d) fp32 [BN, BK // 32]: the fp16 scales of the runs k0 .. k0+BK of rows offs_n (0
    where masked or past the row), as a (scale, min) pair whose min is unused (Q8_0, Q4_0)."""
    R: tl.constexpr = BK // 32
    rr = n_in // 32
    r = k0 // 32 + tl.arange(0, R)
    m = n_mask[:, None] & (r < rr)[None, :]
    s = tl.load(s_ptr + offs_n[:, None].to(tl.int64) * rr + r[None, :], mask=m, other=0.0)
    s = s.to(tl.float32)
    return s, s


@triton.jit
def _nibble_bits(b, INTERP: tl.constexpr):
    """(lo, hi) int32: (b & 15) | 0x4B000000 and (b >> 4) | 0x4B000000 of code bytes b, the
    floats 2**23 + each nibble. On the GPU by word operations on four bytes at once (the bytes a
    thread holds sit packed four to a register): one AND masks four low nibbles, a shift and an
    AND four high ones, and one PRMT a nibble sets its float's bits (a byte each from the masked
    word and 0x4B000000), where byte by byte took a load, a LOP3 and a LEA.HI a byte."""
    if INTERP:
        u = b.to(tl.int32) & 255
        return (u & 15) | 0x4B000000, (u >> 4) | 0x4B000000
    else:
        return tl.inline_asm_elementwise(
            "{ .reg .b32 t, m; mov.b32 m, 0x4B000000; and.b32 t, $8, 0x0F0F0F0F; "
            "prmt.b32 $0, t, m, 0x7440; prmt.b32 $1, t, m, 0x7441; "
            "prmt.b32 $2, t, m, 0x7442; prmt.b32 $3, t, m, 0x7443; "
            "shr.b32 t, $8, 4; and.b32 t, t, 0x0F0F0F0F; "
            "prmt.b32 $4, t, m, 0x7440; prmt.b32 $5, t, m, 0x7441; "
            "prmt.b32 $6, t, m, 0x7442; prmt.b32 $7, t, m, 0x7443; }",
            "=r,=r,=r,=r,=r,=r,=r,=r,r", [b], dtype=(tl.int32, tl.int32), is_pure=True, pack=4)


@triton.jit
def from_group_order(b, PERM: tl.constexpr):
    """Code bytes [BN, BB] whose 16-byte groups are in a wgmma order (strata.planes.Q8_ORDER,
    Q4_ORDER) back in weight (pair) order: each group viewed as [4, 2, 2] and its axes permuted
    by PERM (over [BN, BB / 16, 4, 2, 2]), only a relabelling of registers."""
    BN: tl.constexpr = b.shape[0]
    BB: tl.constexpr = b.shape[1]
    return tl.reshape(tl.permute(tl.reshape(b, (BN, BB // 16, 4, 2, 2)), PERM), (BN, BB))


@triton.jit
def nibble_codes(b, BIAS: tl.constexpr, MAGIC: tl.constexpr, INTERP: tl.constexpr):
    """fp32 [BN, 2 BB] codes q - BIAS in weight order from 4-bit code pairs b [BN, BB] (low
    nibble the even weight; the pairs in strata.planes.Q4_ORDER). MAGIC: the nibbles ORed under
    2**23 (as strata.kernels.decode._common._f32_of), then one float subtract."""
    BN: tl.constexpr = b.shape[0]
    BB: tl.constexpr = b.shape[1]
    # byte 4i + 2s + h of each 16 holds pair 8s + 4h + i (strata.planes.Q4_ORDER)
    b = from_group_order(b, (0, 1, 3, 4, 2))
    if MAGIC:
        lo, hi = _nibble_bits(b, INTERP)                              # 2**23 + each nibble
        f = tl.reshape(tl.join(lo, hi), (BN, 2 * BB)).to(tl.float32, bitcast=True)
        f = f - (8388608.0 + BIAS)
    else:
        u = b.to(tl.int32) & 255
        n = tl.reshape(tl.join(u & 15, u >> 4), (BN, 2 * BB))         # weight order
        f = (n - BIAS).to(tl.float32)
    return f


@triton.jit
def plane_scales(s_ptr, n_in, offs_n, n_mask, k0, BK: tl.constexpr, FMT: tl.constexpr):
    """(s, m) fp32 [BN, BK // 32] each: the factors of the runs k0 .. k0+BK of rows offs_n (0
    where masked or past the row): the fp16 d (m = s, unused), or Q4_K's d·sc and dmin·m."""
    return FMT.plane_scales(s_ptr, n_in, offs_n, n_mask, k0, BK)


@triton.jit
def _fma_exact(a, b, c, INTERP: tl.constexpr):
    """a * b + c rounded once, for operands whose a * b + c is exact in fp32 (the interpreter's
    fma rounds a * b first; in float64 that product and sum are exact)."""
    if INTERP:
        return (a.to(tl.float64) * b.to(tl.float64) + c.to(tl.float64)).to(tl.float32)
    else:
        return tl.fma(a, b, c)


@triton.jit
def plane_weights(b, s, m, FMT: tl.constexpr, MAGIC: tl.constexpr, FMA: tl.constexpr,
                  INTERP: tl.constexpr):
    """fp32 [BN, BK]: the weights from their code bytes b and their runs' factors (s, m) of
    plane_scales, the ggml decoder's values bit for bit: q * d, d * (q - 8), (d·sc) * q - dmin·m
    (q * s is exact in fp32, so Q4_K's one rounding is its subtraction of m, as in ggml).
    FMA (PLANE_FMA formats, Q8_0, with MAGIC): one fused (CODE_BIAS + q) * d - CODE_BIAS * d in
    place of a subtract and a product (CODE_BIAS has two significant bits, so CODE_BIAS * d and
    the result q * d are exact): the same value, except +0 where ggml gives -0 (q = 0, d < 0),
    which no dot can show (a product of +-0 adds nothing to a sum, and the sum starts at +0)."""
    BN: tl.constexpr = b.shape[0]
    if FMT.PLANE_FMA and MAGIC and FMA:
        f = FMT.plane_codes(b, MAGIC, True, INTERP)
        BK: tl.constexpr = f.shape[1]
        R: tl.constexpr = BK // 32
        s3 = s[:, :, None]
        w = _fma_exact(tl.reshape(f, (BN, R, 32)), s3, -(s3 * CODE_BIAS), INTERP)   # exact
    else:
        f = FMT.plane_codes(b, MAGIC, False, INTERP)
        BK: tl.constexpr = f.shape[1]
        R: tl.constexpr = BK // 32
        w = tl.reshape(f, (BN, R, 32)) * s[:, :, None]
        if FMT.PAIR:
            w = w - m[:, :, None]
    return tl.reshape(w, (BN, BK))
