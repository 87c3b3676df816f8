"""Triton decode helpers: ggml blocks -> exact fp32 values in registers.

Every helper is element-addressed, so any tile shape works (the expert GEMM's inner loop):

    decode_<fmt>(w_ptr, row_bytes, offs_n, offs_k, mask) -> fp32 [BN, BK]
        w_ptr     uint8 pointer at the matrix's first byte (a GGUF [N, K] matrix, rows contiguous)
        row_bytes bytes per row (K / block blocks of block_bytes; `Format.row_bytes(K)`)
        offs_n    [BN] row indices (output features)
        offs_k    [BK] weight indices along the row
        mask      [BN, BK] bool; masked-off elements return 0
    decode_tile(FMT, ...) dispatches at compile time on FMT = `Format.ggml_type`.

Values equal `strata.formats.dequantize` (and gguf-py) bit for bit: each helper forms the same fp32
products in the same order as the torch reference beside it.

Addresses are int64 (N * row_bytes passes 2**31 on big experts). Block scales are fp16 at odd
offsets (blocks of 34, 18, 22, 110, 210 bytes), so they are read as two bytes and bitcast; plain
BF16/F16 rows are 2-byte aligned and read as 16-bit words. Block/lane splits use shifts and masks
on constexpr block sizes, never integer division.
"""
import triton
import triton.language as tl


# ---------------------------------------------------------------- shared pieces

@triton.jit
def _row_base(row_bytes, offs_n):
    """[BN, 1] int64 byte offset of each row's start."""
    return offs_n.to(tl.int64)[:, None] * row_bytes


@triton.jit
def _ld_u8(p, mask):
    return tl.load(p, mask=mask, other=0).to(tl.uint32)


@triton.jit
def _ld_f16(p, mask):
    """fp32 value of the little-endian fp16 at byte pointer p (any alignment); 0 where masked."""
    lo = tl.load(p, mask=mask, other=0).to(tl.uint16)
    hi = tl.load(p + 1, mask=mask, other=0).to(tl.uint16)
    return (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)


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


# ---------------------------------------------------------------- 32-weight blocks

@triton.jit
def decode_q8_0(w_ptr, row_bytes, offs_n, offs_k, mask):
    """Q8_0 (34 B): fp16 d; int8 qs[32]. w = q * d."""
    blk = _row_base(row_bytes, offs_n) + ((offs_k >> 5) * 34)[None, :]      # [BN, BK]
    d = _ld_f16(w_ptr + blk, mask)
    q = tl.load(w_ptr + blk + 2 + (offs_k & 31)[None, :], mask=mask, other=0)
    return q.to(tl.int8, bitcast=True).to(tl.float32) * d


@triton.jit
def decode_q4_0(w_ptr, row_bytes, offs_n, offs_k, mask):
    """Q4_0 (18 B): fp16 d; qs[16], weight j in qs[j % 16] (low nibble j < 16). w = d * (q - 8)."""
    j = offs_k & 31
    blk = _row_base(row_bytes, offs_n) + ((offs_k >> 5) * 18)[None, :]
    d = _ld_f16(w_ptr + blk, mask)
    byte = _ld_u8(w_ptr + blk + 2 + (j & 15)[None, :], mask)
    q = (byte >> ((j >> 4) * 4)[None, :]) & 15
    return d * (q.to(tl.int32) - 8).to(tl.float32)


# ---------------------------------------------------------------- dispatch

@triton.jit
def decode_tile(FMT: tl.constexpr, w_ptr, row_bytes, offs_n, offs_k, mask):
    """decode_<fmt> chosen at compile time by FMT = the format's ggml type id."""
    if FMT == 30:
        return decode_bf16(w_ptr, row_bytes, offs_n, offs_k, mask)
    elif FMT == 1:
        return decode_f16(w_ptr, row_bytes, offs_n, offs_k, mask)
    elif FMT == 8:
        return decode_q8_0(w_ptr, row_bytes, offs_n, offs_k, mask)
    elif FMT == 2:
        return decode_q4_0(w_ptr, row_bytes, offs_n, offs_k, mask)
    else:
        tl.static_assert(False, "decode_tile: no Triton decoder for this ggml type")
