"""The int8 KV codes -> bf16 expansion kernel. See strata.kernels.attention.expand.

Legend: R rows (token, kv head) = S·Hkv, hd head width, BR rows per program.
"""
import triton
import triton.language as tl


@triton.jit
def _expand_codes_kernel(src_ptr, dst_ptr, R, Hkv, stride_st, stride_sh, stride_dt, stride_dh,
                         HD: tl.constexpr, BR: tl.constexpr):
    rows = tl.program_id(0) * BR + tl.arange(0, BR)                  # [BR] token·Hkv + head
    live = rows < R
    tok = (rows // Hkv).to(tl.int64)
    head = (rows % Hkv).to(tl.int64)
    offs_d = tl.arange(0, HD)
    src = tok[:, None] * stride_st + head[:, None] * stride_sh + offs_d[None, :]   # [BR, HD]
    dst = tok[:, None] * stride_dt + head[:, None] * stride_dh + offs_d[None, :]
    x = tl.load(src_ptr + src, mask=live[:, None], other=0)          # [BR, HD] int8
    # int8 -> fp32 -> bf16: every |code| <= 127 is exact in bf16 (8 significant bits)
    tl.store(dst_ptr + dst, x.to(tl.float32).to(tl.bfloat16), mask=live[:, None])
