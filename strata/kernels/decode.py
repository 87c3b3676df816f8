"""Triton decode helpers: ggml blocks -> exact fp32 values in registers.

Every helper is element-addressed, so any tile shape works (the expert GEMM's inner loop):

    decode_<fmt>(w_ptr, row_bytes, offs_n, offs_k, mask) -> fp32 [BN, BK]
        w_ptr     uint8 pointer at the matrix's first byte (a GGUF [N, K] matrix, rows contiguous),
                  2-byte aligned (blob offsets are 256-aligned, GGUF tensor data 32-aligned)
        row_bytes bytes per row (K / block blocks of block_bytes; `Format.row_bytes(K)`)
        offs_n    [BN] row indices (output features)
        offs_k    [BK] weight indices along the row
        mask      [BN, BK] bool; masked-off elements return 0
    decode_iq3_s takes one more argument, tab_ptr: the int32 IQ3_S grid on the device,
        `strata.formats.tables.device_table("iq3s", device)`.
    decode_tile(FMT, w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr=None) dispatches at compile
        time on FMT = `Format.ggml_type`; only IQ3_S (21) needs tab_ptr.
    decode_tile_runs(same arguments): the same values, for tiles whose offs_k are whole aligned
        runs of 32 weights (16 for Q6_K): block scales are loaded once per (row, run) and
        broadcast instead of once per weight. Which is faster on a given tile is for the GEMM's
        benchmark to say (the broadcast is a reshape Triton may lay out through shared memory).

Split helpers, for GEMMs that scale partial sums instead of weights (SCALED_CODE_FORMATS: one
multiplicative scale per block times an exact small-integer code, w = s * c):
    decode_codes(FMT, w_ptr, row_bytes, offs_n, offs_k, mask) -> fp32 [BN, BK] codes c
    decode_run_scale(FMT, w_ptr, row_bytes, offs_n, k_run, n_mask) -> fp32 [BN] scale s of the
        block holding weight k_run (a scalar)
    load_code_bytes / codes_from_bytes (Q8_0, Q4_0): a block's raw code words as a load that can
        be issued ahead of its use, and the codes (two 16-wide halves) from them.
    s * c equals decode_tile bit for bit (tests/test_decode_codes.py).

Values equal `strata.formats.dequantize` (and gguf-py) bit for bit: each helper forms the same fp32
products in the same order as the torch reference. Every product of scale and code is exact in
fp32 (an fp16 significand times small integers), so FMA contraction cannot change a result.

Type ids, block sizes and block bytes come from the format table (strata.formats.table); the
offsets of fields inside a block are the layout each helper's docstring spells out.

Speed notes. Addresses are int64 (N * row_bytes passes 2**31 on big experts). Block sizes are
constexpr powers of two, so block/lane splits are shifts and masks. fp16 scales are read with one
16-bit load: every block with an fp16 field has an even size (34, 18, 22, 144, 210, 110 bytes), so
with an even w_ptr each field is 2-byte aligned. IQ4_NL and MXFP4 look their 16 levels up in
registers (packed constants built from `strata.formats.tables`), not in memory.
"""
import triton
import triton.language as tl

from strata.formats.table import FORMATS
from strata.formats.tables import KVALUES_IQ4NL, KVALUES_MXFP4


def _signed32(v: int) -> int:
    return v - (1 << 32) if v >= (1 << 31) else v


def _pack_bytes(values) -> list[int]:
    """Signed bytes, 4 per int32 word, lowest byte first."""
    words = []
    for i in range(0, len(values), 4):
        words.append(_signed32(sum((v & 0xFF) << (8 * j) for j, v in enumerate(values[i:i + 4]))))
    return words


_IQ4NL_W = _pack_bytes(KVALUES_IQ4NL)
IQ4NL_W0 = tl.constexpr(_IQ4NL_W[0])
IQ4NL_W1 = tl.constexpr(_IQ4NL_W[1])
IQ4NL_W2 = tl.constexpr(_IQ4NL_W[2])
IQ4NL_W3 = tl.constexpr(_IQ4NL_W[3])

# MXFP4 codes: bit 3 is the sign, bits 0-2 index 8 magnitudes (packed 4 bits each, < 16).
assert all(KVALUES_MXFP4[8 + i] == -KVALUES_MXFP4[i] for i in range(8))
assert all(0 <= v < 16 for v in KVALUES_MXFP4[:8])
MXFP4_MAGS = tl.constexpr(_signed32(sum(v << (4 * i) for i, v in enumerate(KVALUES_MXFP4[:8]))))

# the formats decode_tile decodes (ggml type ids below); everything else is a compile-time error
TRITON_FORMATS = ("BF16", "F16", "Q8_0", "Q4_0", "Q5_0", "IQ4_NL", "Q2_0", "MXFP4", "Q4_K", "Q6_K",
                  "IQ3_S")

def _fmt(name: str):
    """(ggml type id, log2 weights per block, bytes per block) of `name`, from the format table."""
    f = FORMATS[name]
    assert f.block & (f.block - 1) == 0, f"{name}: block size must be a power of two"
    return (tl.constexpr(f.ggml_type), tl.constexpr(f.block.bit_length() - 1),
            tl.constexpr(f.block_bytes))


GGML_BF16, _, _ = _fmt("BF16")
GGML_F16, _, _ = _fmt("F16")
GGML_Q8_0, Q8_0_LOG2, Q8_0_BYTES = _fmt("Q8_0")
GGML_Q4_0, Q4_0_LOG2, Q4_0_BYTES = _fmt("Q4_0")
GGML_Q5_0, Q5_0_LOG2, Q5_0_BYTES = _fmt("Q5_0")
GGML_IQ4_NL, IQ4_NL_LOG2, IQ4_NL_BYTES = _fmt("IQ4_NL")
GGML_Q2_0, Q2_0_LOG2, Q2_0_BYTES = _fmt("Q2_0")
GGML_MXFP4, MXFP4_LOG2, MXFP4_BYTES = _fmt("MXFP4")
GGML_Q4_K, Q4_K_LOG2, Q4_K_BYTES = _fmt("Q4_K")
GGML_Q6_K, Q6_K_LOG2, Q6_K_BYTES = _fmt("Q6_K")
GGML_IQ3_S, IQ3_S_LOG2, IQ3_S_BYTES = _fmt("IQ3_S")


# ---------------------------------------------------------------- shared pieces

@triton.jit
def _block_off(row_bytes, offs_n, offs_k, LOG2_QK: tl.constexpr, QB: tl.constexpr):
    """[BN, BK] int64 byte offset of each element's block (blocks of 2**LOG2_QK weights, QB B)."""
    kb = (offs_k >> LOG2_QK).to(tl.int64) * QB                            # [BK]
    return offs_n.to(tl.int64)[:, None] * row_bytes + kb[None, :]


@triton.jit
def _ld_u8(w_ptr, off, mask):
    return tl.load(w_ptr + off, mask=mask, other=0).to(tl.int32)


@triton.jit
def _ld_f16(w_ptr, off, mask):
    """fp32 value of the fp16 at even byte offset `off`; 0 where masked. The scalar base is cast,
    not a tensor of pointers (triton 3.6's coalesce pass can assert on the latter)."""
    p = w_ptr.to(tl.pointer_type(tl.float16))
    return tl.load(p + (off >> 1), mask=mask, other=0.0).to(tl.float32)


# ---------------------------------------------------------------- plain formats

@triton.jit
def decode_bf16(w_ptr, row_bytes, offs_n, offs_k, mask):
    """bf16 -> fp32 is the 16 bits moved up: exact, NaN payloads included (as gguf-py)."""
    p = w_ptr.to(tl.pointer_type(tl.uint16))
    idx = offs_n.to(tl.int64)[:, None] * (row_bytes >> 1) + offs_k[None, :]
    u = tl.load(p + idx, mask=mask, other=0).to(tl.uint32)
    return (u << 16).to(tl.float32, bitcast=True)


@triton.jit
def decode_f16(w_ptr, row_bytes, offs_n, offs_k, mask):
    p = w_ptr.to(tl.pointer_type(tl.float16))
    idx = offs_n.to(tl.int64)[:, None] * (row_bytes >> 1) + offs_k[None, :]
    return tl.load(p + idx, mask=mask, other=0.0).to(tl.float32)


# ---------------------------------------------------------------- quantized formats
#
# Each format is split in two: _<fmt>_scale gives the per-block (or per-sub-block) fp32 factor(s)
# and _<fmt>_code the per-weight code as fp32; decode_<fmt> combines them. decode_tile evaluates
# both per weight; decode_tile_runs evaluates the scale once per (row, run of RUN weights) and
# broadcasts it. The combining expression is written once per format (_<fmt>_value), so the two
# paths form identical fp32 products.

@triton.jit
def _q8_0_scale(w_ptr, row_bytes, offs_n, offs_k, mask):
    return _ld_f16(w_ptr, _block_off(row_bytes, offs_n, offs_k, Q8_0_LOG2, Q8_0_BYTES), mask)


@triton.jit
def _q8_0_code(w_ptr, row_bytes, offs_n, offs_k, mask):
    blk = _block_off(row_bytes, offs_n, offs_k, Q8_0_LOG2, Q8_0_BYTES)   # [BN, BK]
    q = tl.load(w_ptr + blk + 2 + (offs_k & 31)[None, :], mask=mask, other=0)
    return q.to(tl.int8, bitcast=True).to(tl.float32)


@triton.jit
def _q8_0_value(d, q):
    return q * d


@triton.jit
def decode_q8_0(w_ptr, row_bytes, offs_n, offs_k, mask):
    """Q8_0 (34 B): fp16 d; int8 qs[32]. w = q * d."""
    return _q8_0_value(_q8_0_scale(w_ptr, row_bytes, offs_n, offs_k, mask),
                       _q8_0_code(w_ptr, row_bytes, offs_n, offs_k, mask))


@triton.jit
def _q4_0_scale(w_ptr, row_bytes, offs_n, offs_k, mask):
    return _ld_f16(w_ptr, _block_off(row_bytes, offs_n, offs_k, Q4_0_LOG2, Q4_0_BYTES), mask)


@triton.jit
def _nibble32(w_ptr, blk, j, mask, QS: tl.constexpr):
    """Weight j (0..31) of a 32-weight block whose qs[16] start at byte QS: low nibble of
    qs[j] for j < 16, high nibble of qs[j - 16] otherwise (ggml's order)."""
    byte = _ld_u8(w_ptr, blk + QS + (j & 15)[None, :], mask)
    return (byte >> ((j >> 4) * 4)[None, :]) & 15


@triton.jit
def _q4_0_code(w_ptr, row_bytes, offs_n, offs_k, mask):
    blk = _block_off(row_bytes, offs_n, offs_k, Q4_0_LOG2, Q4_0_BYTES)
    return (_nibble32(w_ptr, blk, offs_k & 31, mask, 2) - 8).to(tl.float32)


@triton.jit
def _scale_first(d, q):
    return d * q


@triton.jit
def decode_q4_0(w_ptr, row_bytes, offs_n, offs_k, mask):
    """Q4_0 (18 B): fp16 d; qs[16], weight j in qs[j % 16] (low nibble j < 16). w = d * (q - 8)."""
    return _scale_first(_q4_0_scale(w_ptr, row_bytes, offs_n, offs_k, mask),
                        _q4_0_code(w_ptr, row_bytes, offs_n, offs_k, mask))


@triton.jit
def _q5_0_scale(w_ptr, row_bytes, offs_n, offs_k, mask):
    return _ld_f16(w_ptr, _block_off(row_bytes, offs_n, offs_k, Q5_0_LOG2, Q5_0_BYTES), mask)


@triton.jit
def _q5_0_code(w_ptr, row_bytes, offs_n, offs_k, mask):
    j = offs_k & 31
    blk = _block_off(row_bytes, offs_n, offs_k, Q5_0_LOG2, Q5_0_BYTES)
    hb = _ld_u8(w_ptr, blk + 2 + (j >> 3)[None, :], mask)
    q = _nibble32(w_ptr, blk, j, mask, 6) | (((hb >> (j & 7)[None, :]) & 1) << 4)
    return (q - 16).to(tl.float32)


@triton.jit
def decode_q5_0(w_ptr, row_bytes, offs_n, offs_k, mask):
    """Q5_0 (22 B): fp16 d; qh[4] (bit j = 5th bit of weight j); qs[16] as Q4_0. w = d*(q - 16)."""
    return _scale_first(_q5_0_scale(w_ptr, row_bytes, offs_n, offs_k, mask),
                        _q5_0_code(w_ptr, row_bytes, offs_n, offs_k, mask))


@triton.jit
def _iq4nl_level(q):
    """kvalues_iq4nl[q] for int32 q in [0, 16), from packed register constants."""
    word = tl.where(q < 8, tl.where(q < 4, IQ4NL_W0, IQ4NL_W1),
                    tl.where(q < 12, IQ4NL_W2, IQ4NL_W3))
    return (word << (24 - 8 * (q & 3))) >> 24                           # sign-extend the byte


@triton.jit
def _iq4_nl_scale(w_ptr, row_bytes, offs_n, offs_k, mask):
    return _ld_f16(w_ptr, _block_off(row_bytes, offs_n, offs_k, IQ4_NL_LOG2, IQ4_NL_BYTES), mask)


@triton.jit
def _iq4_nl_code(w_ptr, row_bytes, offs_n, offs_k, mask):
    blk = _block_off(row_bytes, offs_n, offs_k, IQ4_NL_LOG2, IQ4_NL_BYTES)
    return _iq4nl_level(_nibble32(w_ptr, blk, offs_k & 31, mask, 2)).to(tl.float32)


@triton.jit
def decode_iq4_nl(w_ptr, row_bytes, offs_n, offs_k, mask):
    """IQ4_NL (18 B): fp16 d; qs[16] nibbles as Q4_0 index kvalues_iq4nl. w = d * kv[q]."""
    return _scale_first(_iq4_nl_scale(w_ptr, row_bytes, offs_n, offs_k, mask),
                        _iq4_nl_code(w_ptr, row_bytes, offs_n, offs_k, mask))


@triton.jit
def _q2_0_scale(w_ptr, row_bytes, offs_n, offs_k, mask):
    return _ld_f16(w_ptr, _block_off(row_bytes, offs_n, offs_k, Q2_0_LOG2, Q2_0_BYTES), mask)


@triton.jit
def _q2_0_code(w_ptr, row_bytes, offs_n, offs_k, mask):
    j = offs_k & 63
    blk = _block_off(row_bytes, offs_n, offs_k, Q2_0_LOG2, Q2_0_BYTES)
    byte = _ld_u8(w_ptr, blk + 2 + (j >> 2)[None, :], mask)
    return (((byte >> ((j & 3) * 2)[None, :]) & 3) - 1).to(tl.float32)


@triton.jit
def decode_q2_0(w_ptr, row_bytes, offs_n, offs_k, mask):
    """Q2_0 (18 B / 64 weights): fp16 d; weight j at bits 2*(j%4) of qs[j/4]. w = (q - 1) * d."""
    return _q8_0_value(_q2_0_scale(w_ptr, row_bytes, offs_n, offs_k, mask),
                       _q2_0_code(w_ptr, row_bytes, offs_n, offs_k, mask))


@triton.jit
def _mxfp4_scale(w_ptr, row_bytes, offs_n, offs_k, mask):
    """2**(e - 128) built from bits (subnormal for e < 2), as ggml_e8m0_to_fp32_half."""
    e = _ld_u8(w_ptr, _block_off(row_bytes, offs_n, offs_k, MXFP4_LOG2, MXFP4_BYTES), mask)
    return tl.where(e < 2, 0x00200000 << e, (e - 1) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _mxfp4_code(w_ptr, row_bytes, offs_n, offs_k, mask):
    blk = _block_off(row_bytes, offs_n, offs_k, MXFP4_LOG2, MXFP4_BYTES)
    q = _nibble32(w_ptr, blk, offs_k & 31, mask, 1)
    mag = (MXFP4_MAGS >> ((q & 7) * 4)) & 15
    return tl.where(q >= 8, -mag, mag).to(tl.float32)                  # int: code 8 is +0


@triton.jit
def decode_mxfp4(w_ptr, row_bytes, offs_n, offs_k, mask):
    """MXFP4 (17 B): e8m0 e; qs[16] nibbles as Q4_0 index the doubled e2m1 values.
    w = d * kv[q], d = 2**(e - 128) (half the e8m0 scale, since kv is doubled)."""
    return _scale_first(_mxfp4_scale(w_ptr, row_bytes, offs_n, offs_k, mask),
                        _mxfp4_code(w_ptr, row_bytes, offs_n, offs_k, mask))


# ---------------------------------------------------------------- 256-weight blocks

@triton.jit
def _q4_k_scale(w_ptr, row_bytes, offs_n, offs_k, mask):
    """(d * sc[s], dmin * m[s]) for sub-block s = w/32, 6-bit sc/m as get_scale_min_k4."""
    s = (offs_k & 255) >> 5
    blk = _block_off(row_bytes, offs_n, offs_k, Q4_K_LOG2, Q4_K_BYTES)
    d = _ld_f16(w_ptr, blk, mask)
    dmin = _ld_f16(w_ptr, blk + 2, mask)
    sj = (s & 3)[None, :]
    b_d = _ld_u8(w_ptr, blk + 4 + sj, mask)
    b_m = _ld_u8(w_ptr, blk + 8 + sj, mask)
    b_md = _ld_u8(w_ptr, blk + 12 + sj, mask)
    first = (s < 4)[None, :]
    sc = tl.where(first, b_d & 63, (b_md & 15) | ((b_d >> 6) << 4))
    mn = tl.where(first, b_m & 63, (b_md >> 4) | ((b_m >> 6) << 4))
    return d * sc.to(tl.float32), dmin * mn.to(tl.float32)


@triton.jit
def _q4_k_code(w_ptr, row_bytes, offs_n, offs_k, mask):
    w = offs_k & 255
    s = w >> 5
    blk = _block_off(row_bytes, offs_n, offs_k, Q4_K_LOG2, Q4_K_BYTES)
    byte = _ld_u8(w_ptr, blk + 16 + ((s >> 1) * 32 + (w & 31))[None, :], mask)
    return ((byte >> ((s & 1) * 4)[None, :]) & 15).to(tl.float32)


@triton.jit
def _q4_k_value(dsc, dm, q):
    return dsc * q - dm


@triton.jit
def decode_q4_k(w_ptr, row_bytes, offs_n, offs_k, mask):
    """Q4_K (144 B): fp16 d, dmin; scales[12]; qs[128]. Sub-block s = w/32 takes nibble s%2 of
    qs[32*(s/2) + w%32] and 6-bit (sc, m) from get_scale_min_k4. w = (d*sc)*q - dmin*m."""
    dsc, dm = _q4_k_scale(w_ptr, row_bytes, offs_n, offs_k, mask)
    return _q4_k_value(dsc, dm, _q4_k_code(w_ptr, row_bytes, offs_n, offs_k, mask))


@triton.jit
def _q6_k_scale(w_ptr, row_bytes, offs_n, offs_k, mask):
    """d * scale[w/16] (int8 scales, one per 16 weights)."""
    blk = _block_off(row_bytes, offs_n, offs_k, Q6_K_LOG2, Q6_K_BYTES)
    d = _ld_f16(w_ptr, blk + 208, mask)
    sc = tl.load(w_ptr + blk + 192 + ((offs_k & 255) >> 4)[None, :], mask=mask, other=0)
    return d * sc.to(tl.int8, bitcast=True).to(tl.float32)


@triton.jit
def _q6_k_code(w_ptr, row_bytes, offs_n, offs_k, mask):
    w = offs_k & 255
    h = w >> 7
    r = w & 127
    blk = _block_off(row_bytes, offs_n, offs_k, Q6_K_LOG2, Q6_K_BYTES)
    lb = _ld_u8(w_ptr, blk + (h * 64 + (r & 63))[None, :], mask)
    hb = _ld_u8(w_ptr, blk + 128 + (h * 32 + (r & 31))[None, :], mask)
    q = ((lb >> ((r >> 6) * 4)[None, :]) & 15) | (((hb >> ((r >> 5) * 2)[None, :]) & 3) << 4)
    return (q - 32).to(tl.float32)


@triton.jit
def decode_q6_k(w_ptr, row_bytes, offs_n, offs_k, mask):
    """Q6_K (210 B): ql[128]; qh[64]; int8 scales[16]; fp16 d. h = w/128, r = w%128:
    q = ql[64h + r%64] >> 4*(r/64) & 15 | (qh[32h + r%32] >> 2*(r/32) & 3) << 4.
    w = (d * scale[w/16]) * (q - 32)."""
    return _scale_first(_q6_k_scale(w_ptr, row_bytes, offs_n, offs_k, mask),
                        _q6_k_code(w_ptr, row_bytes, offs_n, offs_k, mask))


@triton.jit
def _iq3_s_scale(w_ptr, row_bytes, offs_n, offs_k, mask):
    """d * (1 + 2*sc), sc = nibble w/32 of scales[4] (low nibble first)."""
    w = offs_k & 255
    blk = _block_off(row_bytes, offs_n, offs_k, IQ3_S_LOG2, IQ3_S_BYTES)
    d = _ld_f16(w_ptr, blk, mask)
    scb = _ld_u8(w_ptr, blk + 106 + (w >> 6)[None, :], mask)
    sc = (scb >> (((w >> 5) & 1) * 4)[None, :]) & 15
    return d * (1 + 2 * sc).to(tl.float32)


@triton.jit
def _iq3_s_code(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr):
    """(magnitude as fp32, negative?) of weight w: grid point g = w/4 has index
    qs[g] | (bit g of qh) << 8; magnitude = byte w%4 of the grid word; sign = bit w of signs."""
    w = offs_k & 255
    g = w >> 2
    blk = _block_off(row_bytes, offs_n, offs_k, IQ3_S_LOG2, IQ3_S_BYTES)
    lo = _ld_u8(w_ptr, blk + 2 + g[None, :], mask)
    hb = _ld_u8(w_ptr, blk + 66 + (g >> 3)[None, :], mask)
    idx = lo | (((hb >> (g & 7)[None, :]) & 1) << 8)
    word = tl.load(tab_ptr + idx, mask=mask, other=0)
    mag = (word >> ((w & 3) * 8)[None, :]) & 255
    sb = _ld_u8(w_ptr, blk + 74 + (w >> 3)[None, :], mask)
    return mag.to(tl.float32), (sb >> (w & 7)[None, :]) & 1


@triton.jit
def _iq3_s_value(db, mag, neg):
    v = db * mag
    # flip the sign bit, as ggml's * -1.0f: Triton's -v is 0 - v, which turns -0 into +0
    return (v.to(tl.uint32, bitcast=True) ^ (neg.to(tl.uint32) << 31)).to(tl.float32, bitcast=True)


@triton.jit
def decode_iq3_s(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr):
    """IQ3_S (110 B): fp16 d; qs[64]; qh[8]; signs[32]; scales[4]; tab_ptr: int32 grid [512].
    w = (d * (1 + 2*sc)) * magnitude * (+-1), in that order (see _iq3_s_code)."""
    mag, neg = _iq3_s_code(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr)
    return _iq3_s_value(_iq3_s_scale(w_ptr, row_bytes, offs_n, offs_k, mask), mag, neg)


# ---------------------------------------------------------------- dispatch

@triton.jit
def decode_tile(FMT: tl.constexpr, w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr=None):
    """decode_<fmt> chosen at compile time by FMT = the format's ggml type id."""
    if FMT == GGML_BF16:
        return decode_bf16(w_ptr, row_bytes, offs_n, offs_k, mask)
    elif FMT == GGML_F16:
        return decode_f16(w_ptr, row_bytes, offs_n, offs_k, mask)
    elif FMT == GGML_Q8_0:
        return decode_q8_0(w_ptr, row_bytes, offs_n, offs_k, mask)
    elif FMT == GGML_Q4_0:
        return decode_q4_0(w_ptr, row_bytes, offs_n, offs_k, mask)
    elif FMT == GGML_Q5_0:
        return decode_q5_0(w_ptr, row_bytes, offs_n, offs_k, mask)
    elif FMT == GGML_IQ4_NL:
        return decode_iq4_nl(w_ptr, row_bytes, offs_n, offs_k, mask)
    elif FMT == GGML_Q2_0:
        return decode_q2_0(w_ptr, row_bytes, offs_n, offs_k, mask)
    elif FMT == GGML_MXFP4:
        return decode_mxfp4(w_ptr, row_bytes, offs_n, offs_k, mask)
    elif FMT == GGML_Q4_K:
        return decode_q4_k(w_ptr, row_bytes, offs_n, offs_k, mask)
    elif FMT == GGML_Q6_K:
        return decode_q6_k(w_ptr, row_bytes, offs_n, offs_k, mask)
    elif FMT == GGML_IQ3_S:
        tl.static_assert(tab_ptr is not None, "IQ3_S needs tab_ptr: the device IQ3_S grid")
        return decode_iq3_s(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr)
    else:
        tl.static_assert(False, "decode_tile: no Triton decoder for this ggml type")


@triton.jit
def _spread(x, RUN: tl.constexpr):
    """[BN, R] -> [BN, R * RUN]: each value repeated over its run of RUN weights."""
    BN: tl.constexpr = x.shape[0]
    R: tl.constexpr = x.shape[1]
    return tl.reshape(tl.broadcast_to(x[:, :, None], (BN, R, RUN)), (BN, R * RUN))


@triton.jit
def decode_tile_runs(FMT: tl.constexpr, w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr=None):
    """decode_tile's values, with each (row, sub-block) scale loaded once instead of per weight.

    offs_k must be whole aligned runs of 32 weights (BK % 32 == 0 and every run of 32 lanes
    starts at a multiple of 32, e.g. offs_k = k0 + tl.arange(0, BK) with k0 % 32 == 0); Q6_K's
    runs are 16 weights (one int8 scale per 16). BF16/F16 have no scales: decode_tile."""
    if (FMT == GGML_BF16) | (FMT == GGML_F16):
        return decode_tile(FMT, w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr)
    else:
        RUN: tl.constexpr = 16 if FMT == GGML_Q6_K else 32
        BN: tl.constexpr = offs_n.shape[0]
        BK: tl.constexpr = offs_k.shape[0]
        R: tl.constexpr = BK // RUN
        tl.static_assert(BK % RUN == 0, "decode_tile_runs: BK must be a multiple of the run")
        k_run = tl.min(tl.reshape(offs_k, (R, RUN)), axis=1)              # [R] first weight
        m_run = tl.max(tl.reshape(mask, (BN, R, RUN)).to(tl.int32), axis=2) > 0  # [BN, R]
        if FMT == GGML_Q8_0:
            d = _spread(_q8_0_scale(w_ptr, row_bytes, offs_n, k_run, m_run), RUN)
            v = _q8_0_value(d, _q8_0_code(w_ptr, row_bytes, offs_n, offs_k, mask))
        elif FMT == GGML_Q4_0:
            d = _spread(_q4_0_scale(w_ptr, row_bytes, offs_n, k_run, m_run), RUN)
            v = _scale_first(d, _q4_0_code(w_ptr, row_bytes, offs_n, offs_k, mask))
        elif FMT == GGML_Q5_0:
            d = _spread(_q5_0_scale(w_ptr, row_bytes, offs_n, k_run, m_run), RUN)
            v = _scale_first(d, _q5_0_code(w_ptr, row_bytes, offs_n, offs_k, mask))
        elif FMT == GGML_IQ4_NL:
            d = _spread(_iq4_nl_scale(w_ptr, row_bytes, offs_n, k_run, m_run), RUN)
            v = _scale_first(d, _iq4_nl_code(w_ptr, row_bytes, offs_n, offs_k, mask))
        elif FMT == GGML_Q2_0:
            d = _spread(_q2_0_scale(w_ptr, row_bytes, offs_n, k_run, m_run), RUN)
            v = _q8_0_value(d, _q2_0_code(w_ptr, row_bytes, offs_n, offs_k, mask))
        elif FMT == GGML_MXFP4:
            d = _spread(_mxfp4_scale(w_ptr, row_bytes, offs_n, k_run, m_run), RUN)
            v = _scale_first(d, _mxfp4_code(w_ptr, row_bytes, offs_n, offs_k, mask))
        elif FMT == GGML_Q4_K:
            dsc, dm = _q4_k_scale(w_ptr, row_bytes, offs_n, k_run, m_run)
            v = _q4_k_value(_spread(dsc, RUN), _spread(dm, RUN),
                            _q4_k_code(w_ptr, row_bytes, offs_n, offs_k, mask))
        elif FMT == GGML_Q6_K:
            d = _spread(_q6_k_scale(w_ptr, row_bytes, offs_n, k_run, m_run), RUN)
            v = _scale_first(d, _q6_k_code(w_ptr, row_bytes, offs_n, offs_k, mask))
        else:
            tl.static_assert(FMT == GGML_IQ3_S, "decode_tile_runs: no decoder for this type")
            tl.static_assert(tab_ptr is not None, "IQ3_S needs tab_ptr: the device IQ3_S grid")
            mag, neg = _iq3_s_code(w_ptr, row_bytes, offs_n, offs_k, mask, tab_ptr)
            db = _spread(_iq3_s_scale(w_ptr, row_bytes, offs_n, k_run, m_run), RUN)
            v = _iq3_s_value(db, mag, neg)
        # a run's scale is loaded when any of its weights is used: zero the others explicitly
        return tl.where(mask, v, 0.0)


# ---------------------------------------------------------------- codes and run scales, split
#
# For the formats below a weight is one multiplicative scale per run (the block) times an exact
# small-integer code: w = s[n, run] * c[n, k], every c exact in bf16 (|c| <= 128). A GEMM can
# then feed the codes to the tensor cores and scale each run's partial sum once,
#     sum_k x[k] * w[n, k] = sum_runs s[n, run] * (sum_{k in run} x[k] * c[n, k]),
# instead of multiplying and rounding every weight. `s * c` (fp32) equals decode_tile bit for bit.

SCALED_CODE_FORMATS = ("Q8_0", "Q4_0", "Q5_0", "IQ4_NL", "Q2_0", "MXFP4")


def code_run(name: str) -> int:
    """Weights sharing one scale in a SCALED_CODE_FORMATS format (the block: 32, Q2_0 64)."""
    assert name in SCALED_CODE_FORMATS, name
    return FORMATS[name].block


@triton.jit
def decode_codes(FMT: tl.constexpr, w_ptr, row_bytes, offs_n, offs_k, mask):
    """fp32 [BN, BK] codes c of a SCALED_CODE_FORMATS format (0 where masked); arguments as
    decode_tile. Exact small integers (bf16-exact)."""
    if FMT == GGML_Q8_0:
        c = _q8_0_code(w_ptr, row_bytes, offs_n, offs_k, mask)
    elif FMT == GGML_Q4_0:
        c = _q4_0_code(w_ptr, row_bytes, offs_n, offs_k, mask)
    elif FMT == GGML_Q5_0:
        c = _q5_0_code(w_ptr, row_bytes, offs_n, offs_k, mask)
    elif FMT == GGML_IQ4_NL:
        c = _iq4_nl_code(w_ptr, row_bytes, offs_n, offs_k, mask)
    elif FMT == GGML_Q2_0:
        c = _q2_0_code(w_ptr, row_bytes, offs_n, offs_k, mask)
    else:
        tl.static_assert(FMT == GGML_MXFP4, "decode_codes: not a SCALED_CODE_FORMATS type")
        c = _mxfp4_code(w_ptr, row_bytes, offs_n, offs_k, mask)
    return tl.where(mask, c, 0.0)


@triton.jit
def decode_run_scale(FMT: tl.constexpr, w_ptr, row_bytes, offs_n, k_run, n_mask):
    """fp32 [BN] scale s of the run holding weight k_run (a scalar) in each row offs_n; 0 where
    n_mask is False. decode_tile's value is s * c (see decode_codes)."""
    BN: tl.constexpr = offs_n.shape[0]
    ok = k_run + tl.zeros((1,), tl.int32)                                # [1]
    m = n_mask[:, None]                                                  # [BN, 1]
    if FMT == GGML_Q8_0:
        s = _q8_0_scale(w_ptr, row_bytes, offs_n, ok, m)
    elif FMT == GGML_Q4_0:
        s = _q4_0_scale(w_ptr, row_bytes, offs_n, ok, m)
    elif FMT == GGML_Q5_0:
        s = _q5_0_scale(w_ptr, row_bytes, offs_n, ok, m)
    elif FMT == GGML_IQ4_NL:
        s = _iq4_nl_scale(w_ptr, row_bytes, offs_n, ok, m)
    elif FMT == GGML_Q2_0:
        s = _q2_0_scale(w_ptr, row_bytes, offs_n, ok, m)
    else:
        tl.static_assert(FMT == GGML_MXFP4, "decode_run_scale: not a SCALED_CODE_FORMATS type")
        s = _mxfp4_scale(w_ptr, row_bytes, offs_n, ok, m)
    return tl.reshape(tl.where(m, s, 0.0), (BN,))


# ---------------------------------------------------------------- raw code bytes, split from decode
#
# Q8_0 / Q4_0 only: a run's code bytes as a load that can be issued ahead of its use (a GEMM
# prefetches the next run while the tensor cores work on this one), and the codes from them.
# Codes come in two halves, weights [0, 16) and [16, 32) of the run: Q4_0 keeps them in the low
# and high nibbles of the same 16 bytes, so halves need no shuffle. WIDE: 16-bit loads (every
# field of a 34/18-byte block is 2-byte aligned), half the load instructions of byte loads.

FAST_CODE_FORMATS = ("Q8_0", "Q4_0")


@triton.jit
def load_code_bytes(FMT: tl.constexpr, w_ptr, row_bytes, offs_n, k_run, mask_n,
                    WIDE: tl.constexpr):
    """(lo, hi) raw code words of the 32-weight block holding weight k_run (a multiple of 32) in
    each row offs_n; mask_n [BN] bool (0 where False). Q8_0: int8 [BN, 16] each (codes 0-15,
    16-31), WIDE int16 [BN, 8]. Q4_0: lo = the 16 qs bytes (uint8 [BN, 16]; WIDE int16 [BN, 8]),
    hi = lo (both halves are in the same bytes)."""
    QB: tl.constexpr = Q8_0_BYTES if FMT == GGML_Q8_0 else Q4_0_BYTES
    tl.static_assert((FMT == GGML_Q8_0) | (FMT == GGML_Q4_0), "load_code_bytes: Q8_0 / Q4_0")
    base = offs_n.to(tl.int64) * row_bytes + (k_run >> 5).to(tl.int64) * QB + 2   # [BN] even
    m = mask_n[:, None]
    if WIDE:
        p16 = w_ptr.to(tl.pointer_type(tl.int16))
        b16 = (base >> 1)[:, None]
        lo = tl.load(p16 + b16 + tl.arange(0, 8)[None, :], mask=m, other=0)
        if FMT == GGML_Q8_0:
            hi = tl.load(p16 + b16 + 8 + tl.arange(0, 8)[None, :], mask=m, other=0)
        else:
            hi = lo
    else:
        if FMT == GGML_Q8_0:
            p8 = w_ptr.to(tl.pointer_type(tl.int8))
            lo = tl.load(p8 + base[:, None] + tl.arange(0, 16)[None, :], mask=m, other=0)
            hi = tl.load(p8 + base[:, None] + 16 + tl.arange(0, 16)[None, :], mask=m, other=0)
        else:
            lo = tl.load(w_ptr + base[:, None] + tl.arange(0, 16)[None, :], mask=m, other=0)
            hi = lo
    return lo, hi


@triton.jit
def _pairs(a, b):
    """[BN, H] x 2 -> [BN, 2H] interleaved: a[:, i] at 2i, b[:, i] at 2i + 1."""
    return tl.reshape(tl.join(a, b), (a.shape[0], 2 * a.shape[1]))


@triton.jit
def _f32_of(u, bias: tl.constexpr):
    """u - bias as fp32 for int32 0 <= u < 2**23 without an int->float conversion (quarter rate
    on the GPU): the bits 0x4B000000 | u are the float 2**23 + u, and subtracting 2**23 + bias
    is exact."""
    return (u | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + bias)


@triton.jit
def codes_from_bytes(FMT: tl.constexpr, lo, hi, WIDE: tl.constexpr, MAGIC: tl.constexpr = False):
    """(c_lo, c_hi) fp32 [BN, 16]: codes of weights [0, 16) and [16, 32) of the block whose
    load_code_bytes are (lo, hi); decode_tile's value is decode_run_scale * code. MAGIC: the
    same values through _f32_of (float add) instead of int->float conversions."""
    if FMT == GGML_Q8_0:
        if WIDE:   # little-endian: code 2i in the low byte of word i, 2i + 1 in the high byte
            wl = lo.to(tl.int32)
            wh = hi.to(tl.int32)
            if MAGIC:   # q + 128 = the byte with its top bit flipped
                c_lo = _f32_of(_pairs((wl & 255) ^ 128, ((wl >> 8) & 255) ^ 128), 128.0)
                c_hi = _f32_of(_pairs((wh & 255) ^ 128, ((wh >> 8) & 255) ^ 128), 128.0)
            else:
                c_lo = _pairs((wl << 24) >> 24, wl >> 8).to(tl.float32)
                c_hi = _pairs((wh << 24) >> 24, wh >> 8).to(tl.float32)
        else:
            if MAGIC:
                c_lo = _f32_of((lo.to(tl.int32) & 255) ^ 128, 128.0)
                c_hi = _f32_of((hi.to(tl.int32) & 255) ^ 128, 128.0)
            else:
                c_lo = lo.to(tl.float32)
                c_hi = hi.to(tl.float32)
    else:
        tl.static_assert(FMT == GGML_Q4_0, "codes_from_bytes: Q8_0 / Q4_0")
        if WIDE:
            u = lo.to(tl.int32) & 0xFFFF
            n_lo = _pairs(u & 15, (u >> 8) & 15)
            n_hi = _pairs((u >> 4) & 15, u >> 12)
        else:
            u = lo.to(tl.int32)
            n_lo = u & 15
            n_hi = u >> 4
        if MAGIC:
            c_lo = _f32_of(n_lo, 8.0)
            c_hi = _f32_of(n_hi, 8.0)
        else:
            c_lo = (n_lo - 8).to(tl.float32)
            c_hi = (n_hi - 8).to(tl.float32)
    return c_lo, c_hi


# ---------------------------------------------------------------- aligned word loads of block pairs
#
# Q8_0 / Q4_0 blocks are 34 / 18 bytes (fp16 scale, then codes), so a block's codes start 2 bytes
# off a 4-byte boundary every other block: byte or 16-bit loads, which the software pipeliner
# cannot stage through cp.async (it needs >= 32 bits a thread). Two blocks make 68 / 36 bytes, a
# multiple of 4: when a row's byte length is too, every load below is of aligned int32 words.
# In a pair starting at word P (little-endian): block 0's code word i is the top half of word
# P+i and the bottom half of word P+1+i; block 1's codes are whole words from P+(QB+2)/4; the
# scales are the bottom half of word P and the top half of word P+(QB-2)/4. The whole pair
# decodes into one [BN, 64] tile, so a GEMM step is one dot of K = 64.

def pair_words_fit(fmt_name: str, n_in: int, row_bytes: int, byte_offset: int) -> bool:
    """Whether pair_tile can read a matrix: Q8_0/Q4_0, rows of whole block pairs (n_in % 64)
    and whole 4-byte words, starting 4-byte aligned (byte_offset: of the matrix's first row
    from an aligned base). The one statement of the word path's precondition."""
    return (fmt_name in FAST_CODE_FORMATS and n_in % 64 == 0 and row_bytes % 4 == 0
            and byte_offset % 4 == 0)


@triton.jit
def _interleave4(b0, b1, b2, b3):
    """[BN, W] x 4 -> [BN, 4W]: b_k[:, i] at 4i + k (byte k of word i is code 4i + k)."""
    return _pairs(_pairs(b0, b2), _pairs(b1, b3))


@triton.jit
def _half_f32(bits):
    """fp32 of the fp16 whose bits are the low 16 of int32 `bits`."""
    return (bits & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def pair_tile(FMT: tl.constexpr, w_ptr, row_bytes, offs_n, pair, mask_n, MAGIC: tl.constexpr):
    """fp32 [BN, 64]: weights [64 pair, 64 pair + 64) of rows offs_n, decoded with their scales
    (0 where mask_n is False). Needs row_bytes % 4 == 0 and w_ptr 4-aligned; every load is of
    whole int32 words (see above). MAGIC: codes to float by a float add (_f32_of)."""
    QB: tl.constexpr = Q8_0_BYTES if FMT == GGML_Q8_0 else Q4_0_BYTES
    NW: tl.constexpr = (QB - 2) // 4                    # code words a block: 8 (Q8_0), 4 (Q4_0)
    tl.static_assert((FMT == GGML_Q8_0) | (FMT == GGML_Q4_0), "pair_tile: Q8_0 / Q4_0")
    p32 = w_ptr.to(tl.pointer_type(tl.int32))
    P = offs_n.to(tl.int64) * (row_bytes // 4) + pair * (QB // 2)      # [BN] first word
    m = mask_n[:, None]
    i = tl.arange(0, 2 * NW)[None, :]                   # code word i: block i // NW
    blk1 = i >= NW
    idx = P[:, None] + i + blk1.to(tl.int32)            # block 1's words sit one further on
    x = tl.load(p32 + idx, mask=m, other=0)
    y = tl.load(p32 + idx + 1, mask=m & ~blk1, other=0)   # (block 1's would pass the pair's end)
    # block 0's codes straddle words: top half of word i, bottom half of word i + 1
    words = tl.where(blk1, x, ((x >> 16) & 0xFFFF) | (y << 16))        # [BN, 2 NW]
    s0 = _half_f32(tl.load(p32 + P, mask=mask_n, other=0))
    s1 = _half_f32(tl.load(p32 + P + NW, mask=mask_n, other=0) >> 16)
    s = tl.where(blk1, s1[:, None], s0[:, None])                       # [BN, 2 NW]
    if FMT == GGML_Q8_0:
        # byte j of code word i is weight 4 i + j
        if MAGIC:
            c = _interleave4(_f32_of((words & 255) ^ 128, 128.0) * s,
                             _f32_of(((words >> 8) & 255) ^ 128, 128.0) * s,
                             _f32_of(((words >> 16) & 255) ^ 128, 128.0) * s,
                             _f32_of(((words >> 24) & 255) ^ 128, 128.0) * s)
        else:
            c = _interleave4(((words << 24) >> 24).to(tl.float32) * s,
                             ((words << 16) >> 24).to(tl.float32) * s,
                             ((words << 8) >> 24).to(tl.float32) * s,
                             (words >> 24).to(tl.float32) * s)
    else:
        # byte j of a block's code word i' holds weight 4 i' + j (low nibble) and 16 + 4 i' + j
        # (high): [BN, 2, 16] per nibble half, joined and ordered (block, half, 16)
        lo = _interleave4(_nib(words, 0, MAGIC) * s, _nib(words, 8, MAGIC) * s,
                          _nib(words, 16, MAGIC) * s, _nib(words, 24, MAGIC) * s)
        hi = _interleave4(_nib(words, 4, MAGIC) * s, _nib(words, 12, MAGIC) * s,
                          _nib(words, 20, MAGIC) * s, _nib(words, 28, MAGIC) * s)
        BN: tl.constexpr = lo.shape[0]
        c = tl.join(tl.reshape(lo, (BN, 2, 16)), tl.reshape(hi, (BN, 2, 16)))   # [BN, 2, 16, 2]
        c = tl.reshape(tl.permute(c, (0, 1, 3, 2)), (BN, 64))
    return tl.where(m, c, 0.0)


@triton.jit
def _nib(words, SH: tl.constexpr, MAGIC: tl.constexpr):
    """fp32 Q4_0 code (nibble at bit SH, minus 8) of every word."""
    n = (words >> SH) & 15
    if MAGIC:
        v = _f32_of(n, 8.0)
    else:
        v = (n - 8).to(tl.float32)
    return v
