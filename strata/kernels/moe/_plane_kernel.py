"""Triton kernels over plane-layout Q8_0 / Q4_0 / Q4_K experts (strata.planes; the op:
strata.kernels.moe.plane).

Legend: BM/BN/BK tile sizes, R = BK / 32 scale runs per step, RB row blocks a program; a *tile*
is RB·BM sorted rows (one expert) x BN output features, data-parallel (one program a tile, the
whole reduction).

    GATE_UP: h[r, f]  = act(x[tok(r)] . gate_e[f] (+ bg), x[tok(r)] . up_e[f] (+ bu))
    DOWN:    yk[a, d] = w[a] * (h[r(a)] . down_e[d] (+ bd))

Each reduction step loads the codes as one plain byte tile (Q8_0 [BN, BK], Q4_0 / Q4_K [BN, BK / 2]
nibble pairs; rows 16-byte aligned: vector loads, cp.async / TMA pipelined by num_stages), the
step's scales apart (Q8_0 / Q4_0 [BN, R] fp16 d; Q4_K each 32-weight sub-block's d·sc and dmin·m
[BN, R] from its super-block's 16-byte entry), forms each weight in fp32 as the ggml decoder
does (q * d, d * (q - 8), (d·sc) * q - dmin·m: the products are exact, so an FMA cannot change
the one rounding of the last; MAGIC: the codes to float by a float add on their bits, full rate,
where an int->float convert runs at a quarter), rounds it to bf16 once and runs one bf16 tl.dot
with fp32 accumulation. SWAP puts the
weights first (acc [BN, BM] = w @ a^T): the decoded weights stay in registers as the MMA's A
operand and the token rows, the short side at small T, become the MMA's N (Hopper's wgmma needs
M >= 64, not N). The routing rows, the epilogue (activation, biases, routing weight) and the bf16
rounding are the fused GEMM's own (strata.kernels.moe._ffn_kernel), so both kernels compute the same
function.
"""
from __future__ import annotations

import triton
import triton.language as tl

from strata.kernels.moe._ffn_kernel import GATE_UP, _bf16, _dot, _epilogue, _tile_rows
from strata.kernels.decode.kquants import GGML_Q4_K
from strata.kernels.decode.legacy import GGML_Q4_0, GGML_Q8_0


@triton.jit
def load_codes(c_ptr, row_bytes, offs_n, n_mask, k0, BK: tl.constexpr, FMT: tl.constexpr,
               EVEN: tl.constexpr = False):
    """uint8 [BN, BK / codes-per-byte]: the code bytes of weights k0 .. k0+BK of rows offs_n of a
    code plane (row stride row_bytes; 0 where masked). EVEN: k0 + BK is inside the row."""
    BB: tl.constexpr = BK if FMT == GGML_Q8_0 else BK // 2
    offs_b = k0 // (BK // BB) + tl.arange(0, BB)
    if EVEN:
        m = n_mask[:, None]
    else:
        m = n_mask[:, None] & (offs_b < row_bytes)[None, :]
    return tl.load(c_ptr + offs_n[:, None].to(tl.int64) * row_bytes + offs_b[None, :], mask=m,
                   other=0)


@triton.jit
def load_scales(s_ptr, n_in, offs_n, n_mask, k0, BK: tl.constexpr):
    """fp32 [BN, BK // 32]: the scales of the runs k0 .. k0+BK of rows offs_n (0 where masked)."""
    R: tl.constexpr = BK // 32
    rr = n_in // 32
    r = k0 // 32 + tl.arange(0, R)
    m = n_mask[:, None] & (r < rr)[None, :]
    s = tl.load(s_ptr + offs_n[:, None].to(tl.int64) * rr + r[None, :], mask=m, other=0.0)
    return s.to(tl.float32)


@triton.jit
def load_scales_k(s_ptr, n_in, offs_n, n_mask, k0, BK: tl.constexpr):
    """(d·sc, dmin·m) fp32 [BN, BK // 32] each: the factors of the 32-weight sub-blocks k0 ..
    k0+BK of rows offs_n of a Q4_K scale plane (a 16-byte entry a super-block, read as four int32
    words: word 0 the fp16 d and dmin; byte 4 + s = sc[s] | (m[s] >> 4) << 6; word 3's nibble s
    the low nibble of m[s]; strata.planes), 0 where masked. Each sub-block's entry is one 16-byte
    load (a step inside one super-block reads the same entry for each of its sub-blocks: L1
    hits), where byte and fp16 gathers took four. The products are exact in fp32.
    The entries load as one [BN, R·4] word tile: Triton lays that out with warps along the rows
    only, so the factors reach the decode's layout inside each warp. Loaded as [BN, R, 4], R was
    split across warps and each of a step's four factor tensors crossed warps through shared
    memory (9 barriers a step of 32x64x64/w4s4/r2's gate/up on sm_90, 5 now; Q4_0 has 3)."""
    R: tl.constexpr = BK // 32
    r = k0 // 32 + tl.arange(0, R)                                   # sub-block along the row
    wrd = s_ptr.to(tl.pointer_type(tl.int32), bitcast=True)
    row = offs_n.to(tl.int64) * (n_in // 64)                         # entry words a row: K/256 * 4
    c = tl.arange(0, R * 4)                                          # (sub-block, word)
    rc = k0 // 32 + c // 4
    at = row[:, None] + ((rc >> 3) * 4 + c % 4)[None, :]
    at = tl.max_contiguous(tl.multiple_of(at, [1, 4]), [1, 4])        # 16-byte entries
    mc = n_mask[:, None] & (rc < n_in // 32)[None, :]
    e = tl.reshape(tl.load(wrd + at, mask=mc, other=0), (at.shape[0], R, 4))
    w01, w23 = tl.split(tl.reshape(e, (e.shape[0], R, 2, 2)))       # [BN, R, 2]: (w0, w2), (w1, w3)
    w0, w2 = tl.split(w01)
    w1, w3 = tl.split(w23)
    sub = (r & 7)[None, :]
    b = (tl.where(sub < 4, w1, w2) >> ((sub & 3) * 8)) & 255
    sc = b & 63
    mn = ((b >> 6) << 4) | ((w3 >> (sub * 4)) & 15)
    d = (w0 & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    dmin = ((w0 >> 16) & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return d * sc.to(tl.float32), dmin * mn.to(tl.float32)


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


# 1.5 * 2**23: a float whose ulp is 1 on [2**23, 2**24), so its bits plus a small signed int q are
# the float CODE_BIAS + q
CODE_BIAS = tl.constexpr(12582912.0)
CODE_BIAS_BITS = tl.constexpr(0x4B400000)


@triton.jit
def _from_group_order(b, PERM: tl.constexpr):
    """Code bytes [BN, BB] whose 16-byte groups are in a wgmma order (strata.planes.Q8_ORDER,
    Q4_ORDER) back in weight (pair) order: each group viewed as [4, 2, 2] and its axes permuted
    by PERM (over [BN, BB / 16, 4, 2, 2]), only a relabelling of registers."""
    BN: tl.constexpr = b.shape[0]
    BB: tl.constexpr = b.shape[1]
    return tl.reshape(tl.permute(tl.reshape(b, (BN, BB // 16, 4, 2, 2)), PERM), (BN, BB))


@triton.jit
def codes_f32(b, FMT: tl.constexpr, MAGIC: tl.constexpr, BIASED: tl.constexpr = False,
              INTERP: tl.constexpr = True):
    """fp32 [BN, BK] codes in weight order from code bytes b: Q8_0 the int8 q (BK = b's width;
    the bytes in strata.planes.Q8_ORDER),
    Q4_0 q - 8 of each nibble pair, Q4_K q of each (BK = twice it; low nibble the even weight;
    the pairs in strata.planes.Q4_ORDER).
    MAGIC: by a float subtract on the bits of a biased float, not an int->float convert (a
    quarter rate on the GPU): Q8_0's sign-extended q added to CODE_BIAS's bits (one PRMT and one
    add a code in sm_90's SASS, where flipping the top bit to q + 128 and masking cost four),
    the nibbles ORed under 2**23 (as strata.kernels.decode._common._f32_of). BIASED (Q8_0 with
    MAGIC): CODE_BIAS + q, the subtraction left to the caller."""
    if FMT == GGML_Q8_0:
        # byte 4i + 2h + p of each 16 holds weight 8h + 2i + p (strata.planes.Q8_ORDER)
        b = _from_group_order(b, (0, 1, 3, 2, 4))
        q = b.to(tl.int8, bitcast=True).to(tl.int32)                  # sign-extended
        if MAGIC:
            f = (q + CODE_BIAS_BITS).to(tl.float32, bitcast=True)     # CODE_BIAS + q
            if not BIASED:
                f = f - CODE_BIAS
        else:
            f = q.to(tl.float32)
    else:
        tl.static_assert(FMT == GGML_Q4_0 or FMT == GGML_Q4_K, "plane codes: Q8_0, Q4_0 or Q4_K")
        BN: tl.constexpr = b.shape[0]
        BB: tl.constexpr = b.shape[1]
        # byte 4i + 2s + h of each 16 holds pair 8s + 4h + i (strata.planes.Q4_ORDER)
        b = _from_group_order(b, (0, 1, 3, 4, 2))
        if MAGIC:
            lo, hi = _nibble_bits(b, INTERP)                          # 2**23 + each nibble
            f = tl.reshape(tl.join(lo, hi), (BN, 2 * BB)).to(tl.float32, bitcast=True)
            f = f - (8388608.0 + (8.0 if FMT == GGML_Q4_0 else 0.0))
        else:
            u = b.to(tl.int32) & 255
            n = tl.reshape(tl.join(u & 15, u >> 4), (BN, 2 * BB))     # weight order
            f = (n - (8 if FMT == GGML_Q4_0 else 0)).to(tl.float32)
    return f


@triton.jit
def step_scales(s_ptr, n_in, offs_n, n_mask, k0, BK: tl.constexpr, FMT: tl.constexpr):
    """(s, m) fp32 [BN, BK // 32] each: the factors of the runs k0 .. k0+BK of rows offs_n (0
    where masked or past the row). Q8_0 / Q4_0: s = d (m = s, unused); Q4_K: s = d·sc,
    m = dmin·m."""
    if FMT == GGML_Q4_K:
        s, m = load_scales_k(s_ptr, n_in, offs_n, n_mask, k0, BK)
    else:
        s = load_scales(s_ptr, n_in, offs_n, n_mask, k0, BK)
        m = s
    return s, m


@triton.jit
def _fma_exact(a, b, c, INTERP: tl.constexpr):
    """a * b + c rounded once, for operands whose a * b + c is exact in fp32 (the interpreter's
    fma rounds a * b first; in float64 that product and sum are exact)."""
    if INTERP:
        return (a.to(tl.float64) * b.to(tl.float64) + c.to(tl.float64)).to(tl.float32)
    else:
        return tl.fma(a, b, c)


@triton.jit
def decoded(b, s, m, FMT: tl.constexpr, MAGIC: tl.constexpr, FMA: tl.constexpr,
            INTERP: tl.constexpr):
    """fp32 [BN, BK]: the weights from their code bytes b and their runs' factors (s, m) of
    step_scales, the ggml decoder's values bit for bit: q * d, d * (q - 8), (d·sc) * q - dmin·m
    (q * s is exact in fp32, so Q4_K's one rounding is its subtraction of m, as in ggml).
    FMA (Q8_0 with MAGIC): one fused (CODE_BIAS + q) * d - CODE_BIAS * d in place of a subtract
    and a product (CODE_BIAS has two significant bits, so CODE_BIAS * d and the result q * d are
    exact): the same value, except +0 where ggml gives -0 (q = 0, d < 0), which no dot can show
    (a product of +-0 adds nothing to a sum, and the sum starts at +0)."""
    BN: tl.constexpr = b.shape[0]
    if FMT == GGML_Q8_0 and MAGIC and FMA:
        f = codes_f32(b, FMT, MAGIC, True, INTERP)
        BK: tl.constexpr = f.shape[1]
        R: tl.constexpr = BK // 32
        s3 = s[:, :, None]
        w = _fma_exact(tl.reshape(f, (BN, R, 32)), s3, -(s3 * CODE_BIAS), INTERP)   # exact
    else:
        f = codes_f32(b, FMT, MAGIC, False, INTERP)
        BK: tl.constexpr = f.shape[1]
        R: tl.constexpr = BK // 32
        w = tl.reshape(f, (BN, R, 32)) * s[:, :, None]
        if FMT == GGML_Q4_K:
            w = w - m[:, :, None]
    return tl.reshape(w, (BN, BK))


@triton.jit
def _weights(c_ptr, desc, s, m, n_in, offs_n, n_mask, nb, k0, BN: tl.constexpr,
             BK: tl.constexpr, FMT: tl.constexpr, TMA: tl.constexpr, MAGIC: tl.constexpr,
             INTERP: tl.constexpr, EVEN: tl.constexpr):
    """bf16 [BN, BK]: one step's decoded weights (code bytes by TMA when TMA, else vector loads;
    the step's factors s, m loaded a step ahead), each rounded to bf16 once."""
    if TMA:
        b = desc.load([nb * BN, k0 if FMT == GGML_Q8_0 else k0 // 2])   # out of bounds: 0
    else:
        rb = n_in if FMT == GGML_Q8_0 else n_in // 2
        b = load_codes(c_ptr, rb, offs_n, n_mask, k0, BK, FMT, EVEN)
    return _bf16(decoded(b, s, m, FMT, MAGIC, True, INTERP), INTERP)


@triton.jit
def _span_rows(MODE: tl.constexpr, sorted_ids_ptr, mb, row_end, n_assign, TOPK: tl.constexpr,
               BM: tl.constexpr, ROWS: tl.constexpr):
    """_tile_rows over ROWS padded rows from block mb's first, those at or past row_end (the
    next expert's) invalid like padding."""
    offs_m = mb * BM + tl.arange(0, ROWS)
    ids = tl.load(sorted_ids_ptr + offs_m, mask=offs_m < row_end, other=n_assign)
    valid = ids < n_assign
    if MODE == GATE_UP:
        a_rows = ids // TOPK
    else:
        a_rows = offs_m
    return offs_m, ids, valid, a_rows


@triton.jit
def _acc_dot(w, a, acc, SWAP: tl.constexpr, INTERP: tl.constexpr):
    if SWAP:
        acc = _dot(w, a, acc, INTERP)          # [BN, BM] += w @ a^T
    else:
        acc = _dot(a, w, acc, INTERP)          # [BM, BN] += a @ w^T
    return acc


@triton.jit
def _plane_gemm_kernel(
        a_ptr, stride_a, sorted_ids_ptr, block_expert_ptr, n_assign,
        arena_ptr, slot_ptr, c1_off, s1_off, c2_off, s2_off,
        out_ptr, stride_out, tw_ptr, n_out, n_in, n_blocks_ptr, padded_ptr, boff1, boff2, alpha,
        limit, MODE: tl.constexpr, TOPK: tl.constexpr, BM: tl.constexpr, RB: tl.constexpr,
        BN: tl.constexpr, BK: tl.constexpr, FMT1: tl.constexpr, FMT2: tl.constexpr,
        SWAP: tl.constexpr, TMA: tl.constexpr, MAGIC: tl.constexpr, INTERP: tl.constexpr,
        EVEN: tl.constexpr = False, BIAS: tl.constexpr = False, ACT: tl.constexpr = 0):
    """One tile of GATE_UP (MODE 0: gate c1/s1 and up c2/s2) or DOWN (MODE 1: c1/s1). c*_off /
    s*_off: byte offsets of the code and scale planes from the blob's start; FMT1 / FMT2 their
    ggml types (Q8_0, Q4_0, Q4_K). The grid is an upper bound; the row-block count is read on the
    device (n_blocks_ptr). RB > 1: a program takes RB consecutive BM-row blocks of one expert
    (the first, RB-th, ... of its blocks; the others' programs return at once), so the weights
    are decoded once for RB·BM rows while the routing, and the workspace the planner sized for
    it, keep BLOCK_M = BM; padded_ptr (the routing's padded offsets, int64 [E+1]) says where the
    expert's blocks end. EVEN: n_out a multiple of BN and n_in of BK (the real shapes), so the
    loads keep only their row masks."""
    pid = tl.program_id(0)
    NB = tl.cdiv(n_out, BN)
    mb = pid // NB
    lead = pid < tl.load(n_blocks_ptr) * NB
    if RB > 1:
        e = tl.load(block_expert_ptr + mb, mask=lead, other=0)
        lead &= (mb - tl.load(padded_ptr + e) // BM) % RB == 0
    if lead:
        TWO: tl.constexpr = MODE == GATE_UP
        nb = pid % NB
        e = tl.load(block_expert_ptr + mb)
        # blobs start 256-byte aligned and planes 16 (strata.planes): code rows load as vectors
        blob = arena_ptr + tl.multiple_of(tl.load(slot_ptr + e), 256)
        f16 = tl.pointer_type(tl.float16)
        c1 = blob + c1_off
        s1 = (blob + s1_off).to(f16, bitcast=True)
        c2 = blob + c2_off
        s2 = (blob + s2_off).to(f16, bitcast=True)
        if TMA:
            B1: tl.constexpr = BK if FMT1 == GGML_Q8_0 else BK // 2   # code bytes a step
            B2: tl.constexpr = BK if FMT2 == GGML_Q8_0 else BK // 2
            rb1 = n_in if FMT1 == GGML_Q8_0 else n_in // 2
            rb2 = n_in if FMT2 == GGML_Q8_0 else n_in // 2
            d1 = tl.make_tensor_descriptor(c1, shape=[n_out, rb1], strides=[rb1, 1],
                                           block_shape=[BN, B1])
            d2 = tl.make_tensor_descriptor(c2, shape=[n_out, rb2], strides=[rb2, 1],
                                           block_shape=[BN, B2])
        else:
            d1 = c1
            d2 = c2
        if RB > 1:
            row_end = tl.load(padded_ptr + e + 1)                   # the expert's blocks end here
            offs_m, ids, valid, a_rows = _span_rows(MODE, sorted_ids_ptr, mb, row_end, n_assign,
                                                    TOPK, BM, RB * BM)
        else:
            row_end = None
            offs_m, ids, valid, a_rows = _tile_rows(MODE, sorted_ids_ptr, mb, n_assign, TOPK, BM)
        offs_n = nb * BN + tl.arange(0, BN)
        if EVEN:    # no masks on whole tiles (their compares and selects cost a step ~7%)
            n_mask = tl.full((BN,), True, tl.int1)
        else:
            n_mask = offs_n < n_out
        ROWS: tl.constexpr = RB * BM
        if SWAP:
            acc1 = tl.zeros((BN, ROWS), tl.float32)
            acc2 = tl.zeros((BN, ROWS), tl.float32)
        else:
            acc1 = tl.zeros((ROWS, BN), tl.float32)
            acc2 = tl.zeros((ROWS, BN), tl.float32)
        a_base = a_ptr + a_rows[:, None].to(tl.int64) * stride_a           # [ROWS, 1]
        # Q8_0 / Q4_0's scales are 2-byte gathers the cp.async pipeline does not take: each
        # step's are loaded one step ahead, so their latency hides behind a step of decode and
        # MMA (Q4_K's 16-byte entries it would stage if loaded in their step: the same SASS
        # count at 32x64x64/w4s4/r2, so one path for all)
        f1, g1 = step_scales(s1, n_in, offs_n, n_mask, 0, BK, FMT1)
        f2, g2 = step_scales(s2, n_in, offs_n, n_mask & TWO, 0, BK, FMT2)
        # without it the loop may run zero times, that path sets the accumulators to zero by
        # plain moves, and ptxas (C7515) then waits on every wgmma before the next issues
        tl.assume(n_in > 0)
        for k0 in range(0, n_in, BK):
            offs_k = k0 + tl.arange(0, BK)
            if EVEN:
                a_mask = valid[:, None]
            else:
                a_mask = valid[:, None] & (offs_k < n_in)[None, :]
            a = tl.load(a_base + offs_k[None, :], mask=a_mask, other=0.0)   # [ROWS, BK] bf16
            nf1, ng1 = step_scales(s1, n_in, offs_n, n_mask, k0 + BK, BK, FMT1)
            w1 = _weights(c1, d1, f1, g1, n_in, offs_n, n_mask, nb, k0, BN, BK, FMT1, TMA,
                          MAGIC, INTERP, EVEN)
            f1 = nf1
            g1 = ng1
            if TWO:
                nf2, ng2 = step_scales(s2, n_in, offs_n, n_mask, k0 + BK, BK, FMT2)
                w2 = _weights(c2, d2, f2, g2, n_in, offs_n, n_mask, nb, k0, BN, BK, FMT2, TMA,
                              MAGIC, INTERP, EVEN)
                f2 = nf2
                g2 = ng2
            acc1 = _acc_dot(w1, a, acc1, SWAP, INTERP)
            if TWO:
                acc2 = _acc_dot(w2, a, acc2, SWAP, INTERP)
        if SWAP:
            acc1 = tl.trans(acc1)
            acc2 = tl.trans(acc2)
        f32 = tl.pointer_type(tl.float32)
        _epilogue(MODE, acc1, acc2, out_ptr, stride_out, offs_m, ids, valid, offs_n, n_mask,
                  tw_ptr, INTERP, (blob + boff1).to(f32, bitcast=True),
                  (blob + boff2).to(f32, bitcast=True), alpha, limit, BIAS, ACT, row_end)


@triton.jit
def _plane_dequant_kernel(c_ptr, s_ptr, out_ptr, n_rows, n_in, BN: tl.constexpr,
                          BK: tl.constexpr, FMT: tl.constexpr, MAGIC: tl.constexpr,
                          FMA: tl.constexpr, INTERP: tl.constexpr):
    """fp32 out [n_rows, n_in] of one matrix's planes (FMT Q8_0 / Q4_0 / Q4_K), through the GEMM's
    own loads and products (load_codes, decoded; FMA True is the GEMM's form), a [BN, BK] tile a
    program (axis 0 rows, axis 1 columns). s_ptr: the scale plane (fp16 d, or Q4_K's bytes)."""
    offs_n = tl.program_id(0) * BN + tl.arange(0, BN)
    k0 = tl.program_id(1) * BK
    n_mask = offs_n < n_rows
    rb = n_in if FMT == GGML_Q8_0 else n_in // 2
    b = load_codes(c_ptr, rb, offs_n, n_mask, k0, BK, FMT)
    s, m = step_scales(s_ptr, n_in, offs_n, n_mask, k0, BK, FMT)
    v = decoded(b, s, m, FMT, MAGIC, FMA, INTERP)
    offs_k = k0 + tl.arange(0, BK)
    tl.store(out_ptr + offs_n[:, None].to(tl.int64) * n_in + offs_k[None, :], v,
             mask=n_mask[:, None] & (offs_k < n_in)[None, :])
