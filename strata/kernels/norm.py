"""The per-token norms as fused kernels: RMSNorm over rows, and attention's per-head q/k norm with
NEOX RoPE in the same pass.

Legend: N row width, T tokens, h heads, hd head dim.

    rms_norm(x [..., N], w [N] | None, eps)  y = w * rnd_x(x * rsqrt(mean(x^2) + eps))
    qk_norm_rope(x [T, h, hd], w [hd] | None, cos, sin [T, R], eps) -> [h, T, hd]
        = apply_rope(rms_norm(x, w, eps).transpose(0, 1), cos, sin)
          (w None: rope only; R < hd: partial rotary, the first R dims rotated, GLM-4.5,
          MiniMax-M2 and Qwen3.5 / Qwen3-Next's full layers)

rnd_x rounds to x's dtype (what `x.float() ... .to(x.dtype)` does in strata.models.layers);
w * that is computed in fp32 and rounded once to the promoted dtype of (w, x), as torch's
elementwise multiply does. The Triton launchers and the plain-torch twins `rms_norm_torch` /
`qk_norm_rope_torch` share their signatures; the twins are the models' own CPU code. Where the
fp32 sum of squares is taken in another order the two agree to one bf16 step of the normed
value (tests/kernels/test_norm.py); where the sum is exact, bit for bit.

qk_norm_rope writes a [T, h, hd] buffer and returns its [h, T, hd] transposed view: the layout
torch's apply_rope already returns for the models' x.transpose(0, 1) input (elementwise ops keep
their input's strides), so every consumer (strata.models.attention.attend: PromptKV.attend's
[T, h, hd] re-transpose, chunk_attention, SDPA / the flash op, KVCache.extend's copy or cat)
sees the same strides as before, and the engine's chunk_attention reads rows with unit strides.

Which implementation a caller gets (`norm_impl`): the kernels for CUDA tensors in bf16/fp16,
the twins elsewhere (the CPU's fp32 reference path untouched); `pin_norm` forces one inside a
block (a ContextVar, restored on exit): "torch" for an A/B against the torch layers on the GPU,
"triton" to run the kernels on the CPU through the interpreter.
"""
from __future__ import annotations

import contextlib
from contextvars import ContextVar
from dataclasses import dataclass

import torch
import triton

from strata._backend import INTERPRET
from strata.errors import StrataError
from strata.kernels._norm_kernel import _qk_norm_rope_fwd_kernel, _rms_norm_fwd_kernel
from strata.kernels.pins import pinned_one_of

NORM_IMPLS = ("triton", "torch")
# one program holds whole rows in registers: widths past this go to the torch twin
MAX_N = 16384
MAX_HEAD_DIM = 512
FLOATS = (torch.float32, torch.bfloat16, torch.float16)

_IMPL: ContextVar[str | None] = ContextVar("strata_norm_impl", default=None)


def pin_norm(impl: str):
    """Force `norm_impl`'s answer inside the block: "triton" (the kernels, on the CPU through the
    interpreter) or "torch" (the twins, also on CUDA)."""
    return pinned_one_of(_IMPL, impl, NORM_IMPLS, "pin_norm")


def norm_impl(x: torch.Tensor) -> str:
    """"triton" for a CUDA tensor in bf16/fp16, "torch" otherwise, unless pinned."""
    pinned = _IMPL.get()
    if pinned is not None:
        return pinned
    return "triton" if x.is_cuda and x.dtype in (torch.bfloat16, torch.float16) else "torch"


@dataclass(frozen=True)
class NormTile:
    """One program's rows (block_m, a power of two) and warps. Not a sweep: norm_tile gives a
    program ROW_ELEMS elements (one row when wider) and a warp per 1024 of them (4 to 16), 32
    fp32 values a thread, 16-byte loads, no spills at any width up to MAX_N
    (tests/kernels/compile_norm.py); benchmarks/profile_read.py shows what the norms cost."""
    block_m: int
    num_warps: int

    def __post_init__(self):
        for name, v in (("block_m", self.block_m), ("num_warps", self.num_warps)):
            if not isinstance(v, int) or v < 1 or v & (v - 1):
                raise StrataError(f"NormTile.{name} must be a power of two >= 1, got {v!r}")


ROW_ELEMS = 4096


def norm_tile(width: int) -> NormTile:
    """The tile of rows `width` wide (BN = next_pow2(width) columns held at once)."""
    bn = triton.next_power_of_2(width)
    bm = max(1, ROW_ELEMS // bn)
    return NormTile(bm, min(16, max(4, bm * bn // 1024)))


def _on_device(x: torch.Tensor):
    """x's CUDA device made current for the launch: Triton launches on the current device's
    stream, and the models' output norm runs outside the layers' device context (a layer split's
    last GPU need not be the current one)."""
    return torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()


def _out_dtype(x: torch.Tensor, w: torch.Tensor | None) -> torch.dtype:
    return x.dtype if w is None else torch.promote_types(w.dtype, x.dtype)


def _check_rows(x, w, width: int, what: str) -> None:
    if not isinstance(x, torch.Tensor) or x.dtype not in FLOATS or x.dim() == 0:
        raise StrataError(f"{what} takes a float tensor (fp32, bf16, fp16) with a last dim, got "
                          f"{getattr(x, 'dtype', type(x).__name__)}")
    if x.shape[-1] == 0 or x.stride(-1) != 1:
        raise StrataError(f"{what} needs a last dim of at least one element with a unit stride, "
                          f"got shape {list(x.shape)} strides {x.stride()}")
    if w is not None and (w.shape != (width,) or w.device != x.device
                          or w.dtype not in FLOATS):
        raise StrataError(f"{what}: the weight must be a float [{width}] tensor on {x.device}, "
                          f"got {w.dtype} {list(w.shape)} on {w.device}")


def rms_norm_supported(x: torch.Tensor, w: torch.Tensor | None) -> bool:
    """Whether `rms_norm` (the kernel) takes these inputs (else: the torch twin)."""
    return (x.dim() > 0 and x.dtype in FLOATS and 0 < x.shape[-1] <= MAX_N and x.stride(-1) == 1
            and (w is None or (w.shape == (x.shape[-1],) and w.device == x.device
                               and w.dtype in FLOATS)))


def rms_norm(x: torch.Tensor, w: torch.Tensor | None, eps: float, *,
             tile: NormTile | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm of x [..., N] over its last dim (unit stride; the leading dims any that reshape
    to rows without a copy, else copied) -> [..., N], contiguous, in promote(w, x)'s dtype
    (written into `out` when given: contiguous, x's shape, that dtype, on x's device: a
    carve's buffer, strata.models.layers.norm_out). `tile` pins the launch (default:
    norm_tile)."""
    _check_rows(x, w, x.shape[-1] if x.dim() else 0, "rms_norm")
    N = x.shape[-1]
    if N > MAX_N:
        raise StrataError(f"rms_norm's kernel holds rows of at most {MAX_N}, got {N}; use "
                          f"rms_norm_torch")
    rows = x.reshape(-1, N)                                                    # [R, N]
    _check_out(out, x, w)
    out = torch.empty(rows.shape, dtype=_out_dtype(x, w), device=x.device) if out is None \
        else out.view(rows.shape)
    R = rows.shape[0]
    if R:
        cfg = tile or norm_tile(N)
        with _on_device(x):
            _rms_norm_fwd_kernel[(triton.cdiv(R, cfg.block_m),)](
                rows, rows if w is None else w, out, R, rows.stride(0), out.stride(0),
                float(eps), N=N, BM=cfg.block_m, BN=triton.next_power_of_2(N),
                HAS_W=w is not None, INTERP=INTERPRET, num_warps=cfg.num_warps)
    return out.view(x.shape)


def rms_norm_torch(x: torch.Tensor, w: torch.Tensor | None, eps: float, *,
                   tile: NormTile | None = None, out: torch.Tensor | None = None
                   ) -> torch.Tensor:
    """The twin (and the models' CPU path): RMSNorm computed in fp32 (as HF does), rounded to
    x's dtype, then times w (into `out` when given, as rms_norm's). `tile` is accepted (and
    ignored) to keep the signature."""
    _check_out(out, x, w)
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    y = xf.to(x.dtype)
    if out is None:
        return y if w is None else w * y
    return out.copy_(y) if w is None else torch.mul(w, y, out=out)


def _check_out(out: torch.Tensor | None, x: torch.Tensor, w: torch.Tensor | None) -> None:
    if out is not None and (out.shape != x.shape or out.dtype != _out_dtype(x, w)
                            or not out.is_contiguous() or out.device != x.device):
        raise StrataError(f"the norm's out must be a contiguous {_out_dtype(x, w)} tensor of "
                          f"x's shape {tuple(x.shape)} on {x.device}, got {out.dtype} "
                          f"{tuple(out.shape)} on {out.device}")


def neox_rope_torch(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [h, T, hd]: x*cos + rotate_half(x)*sin, rotate_half(a, b) = (-b, a), in fp32, rounded to
    x's dtype (strata.models.layers.apply_rope). Partial rotary (cos/sin [T, R], R < hd): the
    first R dims so, the rest as they are."""
    R = cos.shape[-1]
    if R < x.shape[-1]:   # into x's own layout, as the kernel's [T, h, hd] buffer transposed
        out = torch.empty_like(x)
        out[..., :R] = neox_rope_torch(x[..., :R], cos, sin)
        out[..., R:] = x[..., R:]
        return out
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x.float() * cos + rot.float() * sin).to(x.dtype)


def qk_norm_rope_supported(x: torch.Tensor, w: torch.Tensor | None, cos: torch.Tensor,
                           sin: torch.Tensor) -> bool:
    """Whether `qk_norm_rope` (the kernel) takes these inputs: x [T, h, hd] with a unit last
    stride, hd even, NEOX cos/sin [T, R] fp32 on x's device over R even rotary dims, 2 <= R <=
    hd (partial rotary: the first R) (else: the twin)."""
    if x.dim() != 3 or x.dtype not in FLOATS or x.stride(-1) != 1 or cos.dim() != 2:
        return False
    T, _, hd = x.shape
    R = cos.shape[-1]
    return (0 < hd <= MAX_HEAD_DIM and hd % 2 == 0 and 2 <= R <= hd and R % 2 == 0
            and all(t.shape == (T, R) and t.dtype == torch.float32 and t.stride(-1) == 1
                    and t.device == x.device for t in (cos, sin))
            and (w is None or (w.shape == (hd,) and w.device == x.device
                               and w.dtype in FLOATS)))


def qk_norm_rope(x: torch.Tensor, w: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                 eps: float, *, tile: NormTile | None = None,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, h, hd] (the projection's view) -> the per-head RMSNorm (w [hd]; None: no norm) then
    NEOX RoPE by cos/sin [T, R] fp32 (R < hd: the first R dims rotated, the rest normed only):
    [h, T, hd], the transposed view of a [T, h, hd] buffer (see the module docstring; `out`
    when given: contiguous, x's shape, on x's device), in promote(w, x)'s dtype. `tile` pins
    the launch (default: norm_tile(hd))."""
    if not qk_norm_rope_supported(x, w, cos, sin):
        raise StrataError(
            f"qk_norm_rope takes x [T, h, hd] float with a unit last stride and hd even <= "
            f"{MAX_HEAD_DIM}, w [hd] or None, cos/sin [T, R] fp32 on x's device, R even <= hd; "
            f"got x "
            f"{getattr(x, 'dtype', None)} {list(getattr(x, 'shape', []))}, w "
            f"{None if w is None else (w.dtype, list(w.shape))}, cos {cos.dtype} "
            f"{list(cos.shape)}, sin {sin.dtype} {list(sin.shape)}")
    T, h, hd = x.shape
    _check_out(out, x, w)
    if out is None:
        out = torch.empty((T, h, hd), dtype=_out_dtype(x, w), device=x.device)
    R = T * h
    if R:
        cfg = tile or norm_tile(hd)
        with _on_device(x):
            _qk_norm_rope_fwd_kernel[(triton.cdiv(R, cfg.block_m),)](
                x, x if w is None else w, cos, sin, out, R, x.stride(0), x.stride(1),
                cos.stride(0), sin.stride(0), float(eps), NH=h, HD=hd,
                HB=triton.next_power_of_2(hd // 2), BM=cfg.block_m, NORM=w is not None,
                INTERP=INTERPRET, ROT=0 if cos.shape[-1] == hd else cos.shape[-1],
                HF=triton.next_power_of_2(hd), num_warps=cfg.num_warps)
    return out.transpose(0, 1)


def qk_norm_rope_torch(x: torch.Tensor, w: torch.Tensor | None, cos: torch.Tensor,
                       sin: torch.Tensor, eps: float, *,
                       tile: NormTile | None = None,
                       out: torch.Tensor | None = None) -> torch.Tensor:
    """The twin (and the models' CPU path): rms_norm_torch (when w is given), then NEOX RoPE of
    the [h, T, hd] transpose (into `out`'s transpose when given, as qk_norm_rope's). `tile` is
    accepted (and ignored) to keep the signature."""
    _check_out(out, x, w)
    if w is not None:
        x = rms_norm_torch(x, w, eps)
    y = neox_rope_torch(x.transpose(0, 1), cos, sin)
    return y if out is None else out.transpose(0, 1).copy_(y)
