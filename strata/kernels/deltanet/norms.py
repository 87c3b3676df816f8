"""The DeltaNet layer's per-row norms: the q/k L2 norm and the gated RMSNorm of the output, as
Triton launchers with plain-torch twins of the same signature (transformers 5.24's l2norm and
Qwen3NextRMSNormGated).

Legend: N row width (dk for the L2 norm, dv for the output gate), leading dims any.

    l2norm(x [..., N], eps=1e-6, out=None) -> fp32 [..., N]   x * rsqrt(sum(x^2) + eps)
                                  (into out, fp32 or rounded once to out's bf16 / fp16)
    gated_rms_norm(x [..., N], z [..., N], w [N], eps) -> [..., N] in x's dtype
        = rnd_x(w * rnd_x(x * rsqrt(mean(x^2) + eps)) * silu(z))

The L2 norm is taken in fp32 whatever x's dtype (transformers normalises the fp32 copy), so
its output is fp32 (or that fp32 rounded to nearest even into a narrower `out`, as
fla-core's bf16 operands want it). The kernels take rows with a unit last stride (copied otherwise).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from strata._backend import INTERPRET
from strata.errors import StrataError
from strata.kernels.deltanet.outs import output_buffer
from strata.kernels.deltanet._norm_kernel import _gated_rms_norm_fwd_kernel, _l2norm_fwd_kernel

FLOATS = (torch.float32, torch.bfloat16, torch.float16)
MAX_N = 4096            # one program holds whole rows; DeltaNet heads are 128 wide
ROW_ELEMS = 4096        # elements a program holds (as strata.kernels.norm), 4 warps
_TL = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def _rows(x, N, what):
    if not isinstance(x, torch.Tensor) or x.dtype not in FLOATS or x.dim() == 0:
        raise StrataError(f"{what} takes a float tensor (fp32, bf16, fp16) with a last dim, got "
                          f"{getattr(x, 'dtype', type(x).__name__)}")
    if not 0 < N <= MAX_N:
        raise StrataError(f"{what}: rows of 1 to {MAX_N} elements, got {N}")
    return x.reshape(-1, N) if x.stride(-1) == 1 else x.contiguous().reshape(-1, N)


def _grid(R, N):
    bn = triton.next_power_of_2(N)
    bm = max(1, ROW_ELEMS // bn)
    return (triton.cdiv(R, bm),), bm, bn


def _l2_out(x, out, what):
    if out is None:
        return torch.empty(x.shape, dtype=torch.float32, device=x.device)
    if (not isinstance(out, torch.Tensor) or out.shape != x.shape or out.dtype not in FLOATS
            or not out.is_contiguous() or out.device != x.device):
        raise StrataError(f"{what}: out must be a contiguous float {list(x.shape)} tensor on "
                          f"{x.device}, got {getattr(out, 'dtype', type(out).__name__)} "
                          f"{list(getattr(out, 'shape', []))}")
    return out


def l2norm(x: torch.Tensor, eps: float = 1e-6, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., N] -> x / sqrt(sum(x^2) + eps) over the last dim, fp32 [..., N] (into `out`, a
    contiguous float tensor of x's shape, when given: the fp32 result rounded to its dtype)."""
    N = x.shape[-1] if isinstance(x, torch.Tensor) and x.dim() else 0
    src, R, s_row, s_head, H = _head_rows(x, N, "l2norm")
    out = _l2_out(x, out, "l2norm")
    if R:
        grid, bm, bn = _grid(R, N)
        _l2norm_fwd_kernel[grid](src, out, R, s_row, s_head, H, float(eps), N=N, BM=bm, BN=bn,
                                 INTERP=INTERPRET, num_warps=4)
    return out.view(x.shape)


def _head_rows(x, N, what):
    """x's rows as the l2norm kernel reads them: (tensor, R rows, row stride, head stride, H).
    A [T, H, N] view whose rows do not merge into one stride (q and k split out of the conv's
    [T, C] output) is read in place, row r at (r // H, r % H); anything else as _rows' [R, N]
    (a copy only where the last dim is strided)."""
    if isinstance(x, torch.Tensor) and x.dtype in FLOATS and x.dim() == 3 \
            and x.stride(-1) == 1 and 0 < N <= MAX_N:
        try:
            rows = x.view(-1, N)
        except RuntimeError:        # not one row stride: strided rows, read where they are
            return x, x.shape[0] * x.shape[1], x.stride(0), x.stride(1), x.shape[1]
        return rows, rows.shape[0], rows.stride(0), 0, 1
    rows = _rows(x, N, what)
    return rows, rows.shape[0], rows.stride(0), 0, 1


def l2norm_torch(x: torch.Tensor, eps: float = 1e-6, *,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """The twin: transformers' l2norm on x.float()."""
    xf = x.float()
    y = xf * torch.rsqrt((xf * xf).sum(dim=-1, keepdim=True) + eps)
    return y if out is None else _l2_out(x, out, "l2norm_torch").copy_(y)


def _check_gate(x, z, w, what):
    N = x.shape[-1] if isinstance(x, torch.Tensor) and x.dim() else 0
    if (not isinstance(z, torch.Tensor) or z.shape != x.shape or z.dtype not in FLOATS
            or not isinstance(w, torch.Tensor) or w.shape != (N,) or w.dtype not in FLOATS
            or z.device != x.device or w.device != x.device):
        raise StrataError(f"{what}: z must match x {list(getattr(x, 'shape', []))} and w be "
                          f"[{N}], float, on x's device; got z "
                          f"{list(getattr(z, 'shape', []))} w {list(getattr(w, 'shape', []))}")
    return N


def gated_rms_norm(x: torch.Tensor, z: torch.Tensor, w: torch.Tensor,
                   eps: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """The output gate: RMSNorm of x [..., N] weighted by w [N], times silu(z) -> x's dtype
    (into `out`, a contiguous tensor of x's shape and dtype, when given)."""
    N = _check_gate(x, z, w, "gated_rms_norm")
    rows, zr = _rows(x, N, "gated_rms_norm"), _rows(z, N, "gated_rms_norm")
    out = _gate_out(x, out, "gated_rms_norm").view(rows.shape)
    if rows.shape[0]:
        grid, bm, bn = _grid(rows.shape[0], N)
        pt = torch.promote_types(w.dtype, x.dtype)
        _gated_rms_norm_fwd_kernel[grid](
            rows, zr, w, out, rows.shape[0], rows.stride(0), zr.stride(0), float(eps), N=N,
            BM=bm, BN=bn, PT=_TL[pt], INTERP=INTERPRET, num_warps=4)
    return out.view(x.shape)


def gated_rms_norm_torch(x: torch.Tensor, z: torch.Tensor, w: torch.Tensor,
                         eps: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """The twin: transformers' Qwen3NextRMSNormGated.forward with weight w (`out` as
    gated_rms_norm's)."""
    _check_gate(x, z, w, "gated_rms_norm_torch")
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    y = w * y.to(x.dtype)
    y = (y * F.silu(z.float())).to(x.dtype)
    return y if out is None else _gate_out(x, out, "gated_rms_norm_torch").copy_(y)


def _gate_out(x: torch.Tensor, out: torch.Tensor | None, what: str) -> torch.Tensor:
    """The gated norm's output: `out` (x's shape, dtype and device), or a new tensor."""
    return output_buffer(out, x.shape, x.dtype, x.device, what)

