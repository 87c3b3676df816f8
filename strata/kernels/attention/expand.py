"""int8 KV codes expanded to bf16: the input of the attention's bf16 tile path for int8 segments.

Legend: S tokens, Hkv kv heads, hd head width.

    out[s, h, d] = bf16(codes[s, h, d])                   scale None ("expand"): exact, |code| <=
                                                          127 needs 7 bits and bf16 has 8
    out[s, h, d] = bf16(fp32(codes[s, h, d]) * scale[s, h])   ("dequant": one fp32 product, one
                                                          round to nearest even)

"dequant" (AttnTile.int8's default) hands the attention plain bf16 K/V: the kernel is then the
bf16 kernel itself, at its rate. The price is one bf16 rounding of each dequantized K and V
element (relative 2^-8, the rounding bf16 KV has anyway); "expand" keeps the exact codes and puts
the scales on the scores and probabilities inside the kernel, which the H200 measured at 0.64-0.72
of the bf16 rate over a long prefix (two scale vectors a tile and 255 registers a thread,
experiments/results/attention_bench-NVIDIA_H200-e923e68.csv).

The per-token scales stay where the int8 path puts them (on the scores and the probabilities,
strata.kernels.attention._kernel), so the attention over expanded codes computes the same products
as the in-kernel int8 path: only the int8 -> bf16 conversion moves out of the attention's inner
loop (where it cost ~45% of the int8 rate on the H200: 253-288 against 422-482 TFLOP/s for bf16,
experiments/results/attention_bench-NVIDIA_H200-5b184e5.csv, with 255 registers a thread against
211) into one streaming pass.

Cost: the pass reads S·Hkv·hd·2 bytes (k and v codes) and writes S·Hkv·hd·4 (bf16). For
qwen3-30b-a3b (Hkv = 4, hd = 128, H = 32) that is 3 KiB a prefix token per layer, ~0.77 µs per
1000 tokens at ~4 TB/s (a copy's share of the H200's 4.8); the attention of a chunk of T queries
over the same 1000 keys is 4·hd·H·T·1000 FLOPs, 36 ns·T at 450 TFLOP/s: the pass costs 21/T of
the attention (0.5% at T = 4096, 2% at T = 1024). It is redone for every chunk, and both scale
with the prefix, so the ratio holds at every prefix length.

`expand_codes` (Triton) and `expand_codes_torch` share the signature and are bit-identical.
"""
from __future__ import annotations

import torch

from strata._backend import INTERPRET
from strata.errors import StrataError

ROWS_PER_PROGRAM = 64     # (token, head) rows of hd codes a program converts: 8 KiB read at hd 128


def _check(codes: torch.Tensor, out: torch.Tensor | None, scale=None) -> torch.Tensor:
    if scale is not None and (scale.shape != codes.shape[:2] or scale.device != codes.device
                              or scale.dtype not in (torch.float32, torch.float16)):
        raise StrataError(f"expand_codes: scale must be fp32/fp16 {list(codes.shape[:2])} on "
                          f"{codes.device}; got {scale.dtype} {list(scale.shape)}")
    if codes.ndim != 3 or codes.dtype != torch.int8 or codes.stride(-1) != 1:
        raise StrataError(f"expand_codes takes int8 codes [S, Hkv, hd] with a unit last stride; "
                          f"got {codes.dtype} {list(codes.shape)} strides {codes.stride()}")
    if codes.shape[-1] & (codes.shape[-1] - 1):
        raise StrataError(f"expand_codes needs a power-of-two head width, got {codes.shape[-1]}")
    if out is None:
        return torch.empty(codes.shape, dtype=torch.bfloat16, device=codes.device)
    if (out.shape != codes.shape or out.dtype != torch.bfloat16 or out.device != codes.device
            or out.stride(-1) != 1):
        raise StrataError(f"expand_codes: out must be bf16 {list(codes.shape)} on {codes.device} "
                          f"with a unit last stride; got {out.dtype} {list(out.shape)} on "
                          f"{out.device}")
    return out


def expand_codes_torch(codes: torch.Tensor, out: torch.Tensor | None = None,
                       scale: torch.Tensor | None = None) -> torch.Tensor:
    """codes [S, Hkv, hd] int8 -> bf16 [S, Hkv, hd] (`out` receives it); with `scale`
    [S, Hkv] the dequantized values (module docstring)."""
    out = _check(codes, out, scale)
    if scale is None:
        out.copy_(codes)
    else:
        out.copy_(codes.float() * scale.float()[..., None])
    return out


def expand_codes(codes: torch.Tensor, out: torch.Tensor | None = None,
                 scale: torch.Tensor | None = None) -> torch.Tensor:
    """The Triton twin of expand_codes_torch (same signature, bit-identical)."""
    from strata.kernels.attention._expand_kernel import _expand_codes_kernel
    from strata.kernels.attention.probe import probe_grid
    out = _check(codes, out, scale)
    S, Hkv, hd = codes.shape
    R = S * Hkv
    if R == 0:
        return out
    grid = probe_grid((-(-R // ROWS_PER_PROGRAM),))
    sc = codes if scale is None else scale      # never read without SCALE
    _expand_codes_kernel[grid](codes, out, sc, R, Hkv, codes.stride(0), codes.stride(1),
                               out.stride(0), out.stride(1), sc.stride(0) if scale is not None
                               else 0, sc.stride(1) if scale is not None else 0, HD=hd,
                               BR=ROWS_PER_PROGRAM, SCALE=scale is not None, INTERP=INTERPRET,
                               num_warps=4)
    return out
