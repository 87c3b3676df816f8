"""int8 KV: symmetric per-token-per-head scales (what the KV cache stores and the attention reads).

Legend: S tokens (any count), Hkv key/value heads, hd head width.

    scale[s, h] = max_d |x[s, h, d]| / 127          (0 where the row is all zeros)
    q[s, h, d]  = clamp(round(x[s, h, d] / scale[s, h]), -127, 127)      int8
    x'[s, h, d] = q[s, h, d] * scale[s, h]                                fp32

Why per token and head rather than per block of tokens: a token's scale depends only on its own
hd values, so the scales of a chunk's keys and values are written once, when the chunk joins the
cache, and never touched again. Appending never re-quantizes older tokens and a streamed-back copy
of older KV is byte-identical to the resident one. A per-block scale (say 64 tokens) would have
to be rewritten whenever a chunk ends inside a block, re-rounding the tokens already stored there.
The cost is one fp32 scale per hd int8 values (4 / hd: 3.1% at hd=128), and the attention kernel
folds it out of the dot products: q . (k_i8 * s) = s * (q . k_i8), so no tile is dequantized.

Bound (the round trip, per element): |x - x'| <= scale / 2 up to fp32 rounding of x / scale and
of q * scale, each at most 2^-24 relative on a value <= 127 * scale, so
|x - x'| <= scale * (1/2 + 2^-16) (`ROUNDTRIP_SLACK`). The symmetric range [-127, 127] (not -128)
keeps q -> -q exact.

A nonzero row's scale is at least fp32's smallest normal (2^-126): rows of |x| < 127·2^-126
would otherwise get a subnormal scale, whose lost precision lets x / scale pass 127.5 and the
clamp break the bound. Such rows keep the bound (relative to the stored scale) and lose nothing
a bf16 key could hold.

Magnitudes above 2^120 are refused (q · scale could round past fp32's largest finite value near
2^128; a normed key is O(10)).

Scales are fp32: an fp16 scale would go subnormal for rows of |x| < 127 * 6.1e-5 and lose the
bound there; the kernel reads fp16 scales too, for a cache that chooses to store them.
"""
from __future__ import annotations

import math

import torch

from strata.errors import StrataError

QMAX = 127
ROUNDTRIP_SLACK = 2.0 ** -16   # relative to scale, on top of scale / 2 (see the module docstring)
KV_DTYPES = ("bf16", "fp32", "int8")
KV_FLOATS = {"bf16": torch.bfloat16, "fp32": torch.float32}   # the float KV dtypes, stored as is


def resolve_kv(kv: str, dense: torch.dtype) -> str:
    """The KV dtype `--kv` names for a run whose dense math is `dense`: "auto" keeps the KV in
    the dense dtype's precision (fp32 beside fp32 math, the CPU's default; bf16 otherwise), so
    every path of one run (the model's cache, the engine's PromptKV, MLA's latent cache) stores
    the same dtype and the plan counts its bytes; an explicit dtype is kept everywhere."""
    if kv == "auto":
        return "fp32" if dense == torch.float32 else "bf16"
    if kv not in KV_DTYPES:
        raise StrataError(f"--kv must be auto or one of {', '.join(KV_DTYPES)}, got {kv!r}")
    return kv
MAX_ABS = 2.0 ** 120      # the largest |x| accepted: q · scale stays finite in fp32 with room
TINY = torch.finfo(torch.float32).tiny   # the smallest scale of a nonzero row (see above)


def cache_dtype(kv: str | None, model_dtype: torch.dtype) -> torch.dtype:
    """The torch dtype a model's own cache keeps for the KV dtype `kv` (None: the model's own
    dtype, the reference forward's default); int8 is the engine's (PromptKV, MLACache)."""
    if kv is None:
        return model_dtype
    if kv not in KV_FLOATS:
        raise StrataError(f"the model's KV cache keeps {' or '.join(KV_FLOATS)}, not {kv!r} "
                          f"(int8 KV is the streaming engine's)")
    return KV_FLOATS[kv]


def quantize_kv(x: torch.Tensor, *, out: torch.Tensor | None = None,
                scale_out: torch.Tensor | None = None,
                validate: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """x [S, Hkv, hd] (any float dtype, e.g. a chunk's normed, rotated keys) -> (q [S, Hkv, hd]
    int8, scale [S, Hkv] fp32). `out` / `scale_out` (views into a cache, say) receive them.
    `validate` checks for NaN, Inf and |x| > 2^120 on the host (one device sync); the engine's
    hot path passes False, and such a value then reaches the attention's output as NaN/Inf."""
    if x.ndim != 3 or not x.is_floating_point():
        raise StrataError(f"quantize_kv takes a float tensor [S, Hkv, hd], got "
                          f"{x.dtype} {list(x.shape)}")
    xf = x.float()
    amax = xf.abs().amax(dim=-1)                                         # [S, Hkv]
    if validate and not bool((amax <= MAX_ABS).all()):   # also False for NaN
        raise StrataError(f"quantize_kv: the keys/values hold NaN, Inf or magnitudes above "
                          f"2^120 (max |x| = {amax.max().item():.3g}); nothing to scale")
    # amax == 0, not amax > 0: a NaN row keeps a NaN scale (visible downstream), never 0
    scale = torch.where(amax == 0, 0.0, (amax / QMAX).clamp_min(TINY))  # [S, Hkv] fp32
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(xf / safe[..., None]).clamp_(-QMAX, QMAX).to(torch.int8)
    if out is not None:
        out.copy_(q)
        q = out
    if scale_out is not None:
        scale_out.copy_(scale)
        scale = scale_out
    return q, scale


def dequantize_kv(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """q [S, Hkv, hd] int8, scale [S, Hkv] (fp32 or fp16) -> fp32 [S, Hkv, hd]."""
    if q.dtype != torch.int8 or scale.shape != q.shape[:-1]:
        raise StrataError(f"dequantize_kv takes int8 [S, Hkv, hd] and scales [S, Hkv]; got "
                          f"{q.dtype} {list(q.shape)} and {list(scale.shape)}")
    return q.float() * scale.float()[..., None]


def kv_token_parts(kv_dtype: str, n_kv_head: int, head_dim: int, value_dim: int | None = None
                   ) -> tuple[tuple[tuple[int, ...], torch.dtype], ...]:
    """The tensors one token's keys and values are stored as in one layer's cache, each as
    (shape of one token's slice, dtype): the key [Hkv, hd] and the value [Hkv, Hv] (Hv =
    value_dim, default hd) in bf16 or fp32, or int8 codes and one fp32 scale per head for each
    ([Hkv], [Hkv]). A cache allocates these per token and the plan counts their bytes
    (kv_token_bytes): one description. MLA's latent KV is this format with one "head" whose key
    is the latent and whose value is the rope key (strata.shapes.ModelShape.kv_heads)."""
    vd = head_dim if value_dim is None else value_dim
    if kv_dtype in KV_FLOATS:
        dt = KV_FLOATS[kv_dtype]
        return ((n_kv_head, head_dim), dt), ((n_kv_head, vd), dt)
    if kv_dtype == "int8":
        return (((n_kv_head, head_dim), torch.int8), ((n_kv_head, vd), torch.int8),
                ((n_kv_head,), torch.float32), ((n_kv_head,), torch.float32))
    raise StrataError(f"kv dtype must be one of {KV_DTYPES}, got {kv_dtype!r}")


def kv_token_bytes(kv_dtype: str, n_kv_head: int, head_dim: int,
                   value_dim: int | None = None) -> int:
    """Bytes one token's keys and values take in one layer's cache (kv_token_parts): bf16
    2·Hkv·hd·2, fp32 2·Hkv·hd·4; int8 2·Hkv·(hd + 4) (the int8 values and one fp32 scale per head, for k and for
    v); with value_dim Hv the value's Hv in place of the second hd."""
    return sum(math.prod(shp) * dt.itemsize
               for shp, dt in kv_token_parts(kv_dtype, n_kv_head, head_dim, value_dim))
