"""The int8 KV codes -> bf16 expansion kernel. See strata.kernels.attention.expand.

Legend: R rows (token, kv head) = S·Hkv, hd head width, BR rows per program.
"""
import triton
import triton.language as tl

from strata.kernels.moe._ffn_kernel import _bf16


@triton.jit
def _expand_codes_kernel(src_ptr, dst_ptr, sc_ptr, R, Hkv, stride_st, stride_sh, stride_dt,
                         stride_dh, stride_ct, stride_ch, HD: tl.constexpr, BR: tl.constexpr,
                         SCALE: tl.constexpr, INTERP: tl.constexpr):
    rows = tl.program_id(0) * BR + tl.arange(0, BR)                  # [BR] token·Hkv + head
    live = rows < R
    tok = (rows // Hkv).to(tl.int64)
    head = (rows % Hkv).to(tl.int64)
    offs_d = tl.arange(0, HD)
    src = tok[:, None] * stride_st + head[:, None] * stride_sh + offs_d[None, :]   # [BR, HD]
    dst = tok[:, None] * stride_dt + head[:, None] * stride_dh + offs_d[None, :]
    x = tl.load(src_ptr + src, mask=live[:, None], other=0)          # [BR, HD] int8
    x = x.to(tl.float32)
    if SCALE:   # one fp32 product, then one round to nearest even (as the torch twin)
        sc = tl.load(sc_ptr + tok * stride_ct + head * stride_ch, mask=live, other=0)
        x = x * sc.to(tl.float32)[:, None]
    # without SCALE: every |code| <= 127 is exact in bf16 (8 significant bits)
    tl.store(dst_ptr + dst, _bf16(x, INTERP), mask=live[:, None])
