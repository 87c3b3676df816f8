"""The short causal depthwise conv of a DeltaNet layer (q, k and v side by side), with the last
K-1 inputs carried from call to call: a Triton launcher (one pass over [T, C], the GPU's) and
its plain-torch twin of the same signature (K elementwise multiply-adds over the rows, the
CPU's: on the GPU its 2K + 3 fp32 passes over [T, C] cost Qwen3.5-35B-A3B ~8 ms a layer at T
32768, experiments/results/profile_resident-qwen3.5-…-NVIDIA_H100-184a66a).

Legend: T tokens of this call, C channels (2 Hk dk + Hv dv), K the kernel width.

    causal_conv1d(x [T, C], weight [C, K], bias [C] | None, state [K-1, C] | None, *, split=0)
    causal_conv1d_torch(the same)
        -> (y [T, C] in x's dtype, new state [K-1, C] in x's dtype)
           (split > 0: y as two contiguous tensors, [T, split] and [T, C - split])
    xp = cat(state or zeros, x)                    [K-1+T, C]
    y[t] = silu(bias + sum_j weight[:, j] * xp[t + j])    (fp32, j = 0 .. K-1 in order)
    new state = xp[-(K-1):]

transformers' causal_conv1d_fn (F.conv1d with padding K-1, then SiLU) is the same sum; its
conv state keeps K inputs, of which the conv reads the last K-1. The sums are the same K
correctly rounded fp32 operations for every element whatever T is (the kernel's may contract
a multiply-add into one FMA: within an fp32 ulp of the sum per tap); SiLU is not (torch's CPU
exp takes a vector path or a scalar tail by an element's place in the tensor), so it runs on
blocks of ROWS rows, each the same shape whatever call it falls in. A prompt cut at a multiple
of ROWS (the chunk rule's 64) thus gives the one-call result bit for bit; a cut elsewhere moves
SiLU by an ulp at most. The kernel's rows do not depend on the call's cut: any carry is exact.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton

from strata._backend import INTERPRET
from strata.errors import StrataError
from strata.kernels.deltanet._conv_kernel import _causal_conv1d_fwd_kernel
from strata.kernels.deltanet.outs import output_buffer

ROWS = 64               # the chunk of strata.kernels.deltanet.sizes.CHUNK
TILE = (64, 128)        # the kernel's [rows, channels] per program (x's K-row halo from L2)


def _check(x, weight, bias, state):
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or not x.is_floating_point():
        raise StrataError(f"causal_conv1d: x must be a float [T, C] tensor, got "
                          f"{list(getattr(x, 'shape', []))}")
    C = x.shape[1]
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.shape[0] != C:
        raise StrataError(f"causal_conv1d: weight must be [C={C}, K], got "
                          f"{list(getattr(weight, 'shape', []))}")
    K = weight.shape[1]
    if bias is not None and bias.shape != (C,):
        raise StrataError(f"causal_conv1d: bias must be [{C}], got {list(bias.shape)}")
    if state is not None and (state.shape != (K - 1, C) or state.dtype != x.dtype):
        raise StrataError(f"causal_conv1d: state must be {x.dtype} [{K - 1}, {C}], got "
                          f"{state.dtype} {list(state.shape)}")
    return K


def _activation(activation) -> bool:
    if activation not in ("silu", None):
        raise StrataError(f"causal_conv1d: activation must be 'silu' or None, got {activation!r}")
    return activation == "silu"


def _carry(x, state, K):
    """The last K-1 inputs of [state, x] in x's dtype (zeros before the prompt)."""
    T, C = x.shape
    if K == 1:
        return x[:0].clone()
    if T >= K - 1:   # a copy of K-1 rows: a view would keep the whole [T, C] input alive
        return x[T - (K - 1):].clone(memory_format=torch.contiguous_format)
    head = state[T:] if state is not None else x.new_zeros((K - 1 - T, C))
    return torch.cat([head, x]).contiguous()


def _split(split, C):
    if not isinstance(split, int) or isinstance(split, bool) or not 0 <= split < C:
        raise StrataError(f"causal_conv1d: split must be a column 0 <= split < C={C} (0: one "
                          f"output), got {split!r}")
    return split


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  state: torch.Tensor | None = None, *, activation: str | None = "silu",
                  split: int = 0, out=None):
    """The conv over this call's rows after the carried ones, one Triton launch (see the module
    docstring); x's rows need a unit last stride (copied otherwise). `split` > 0: y is two
    contiguous tensors, its columns before `split` and from it ([T, split], [T, C - split]:
    q and k, then v, so the delta rule reads v without copying it). `out`: where y goes (a
    contiguous [T, C], or with `split` a pair; either may be None: allocated), x's dtype."""
    K = _check(x, weight, bias, state)
    silu = _activation(activation)
    T, C = x.shape
    split = _split(split, C)
    x = x if x.stride(-1) == 1 else x.contiguous()
    s = (state if state is not None else x.new_zeros((K - 1, C))).contiguous()
    y, y2 = _outs(x, split, out, "causal_conv1d")
    if T:
        bt, bc = TILE
        b = bias if bias is not None else s            # never read without HAS_B
        grid = (triton.cdiv(T, bt), triton.cdiv(C, bc))
        _causal_conv1d_fwd_kernel[grid](x, weight.contiguous(), b, s, y, y2, T, x.stride(0),
                                        y.stride(0), C=C, K=K, HAS_B=bias is not None,
                                        SILU=silu, SPLIT=split, BT=bt, BC=bc,
                                        INTERP=INTERPRET, num_warps=4)
    return ((y, y2) if split else y), _carry(x, state, K)


def _outs(x: torch.Tensor, split: int, out, what: str):
    """(y, y2) for a conv of x [T, C]: `out`'s where given (checked: contiguous, x's dtype and
    device, [T, split or C] and [T, C - split]), else new; y2 is y without a split."""
    T, C = x.shape
    shapes = [(T, split), (T, C - split)] if split else [(T, C)]
    given = (list(out) if isinstance(out, (tuple, list)) else [out]) if out is not None \
        else [None] * len(shapes)
    if len(given) != len(shapes):
        raise StrataError(f"{what}: out must be {'a pair' if split else 'one tensor'} here")
    ys = [output_buffer(t, shp, x.dtype, x.device, what) for t, shp in zip(given, shapes)]
    return (ys[0], ys[1]) if split else (ys[0], ys[0])


def causal_conv1d_torch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                        state: torch.Tensor | None = None, *, activation: str | None = "silu",
                        split: int = 0, out=None):
    """The twin: the conv over this call's rows after the carried ones in plain torch (see
    the module docstring); `split` and `out` as causal_conv1d's."""
    K = _check(x, weight, bias, state)
    _activation(activation)
    T, C = x.shape
    split = _split(split, C)
    if state is None:
        state = torch.zeros((K - 1, C), dtype=x.dtype, device=x.device)
    xp = torch.cat([state, x], dim=0).float()                                  # [K-1+T, C]
    wf = weight.float()
    acc = torch.zeros((T, C), dtype=torch.float32, device=x.device)
    if bias is not None:
        acc = acc + bias.float()
    for j in range(K):
        acc = acc + xp[j:j + T] * wf[:, j]
    if activation == "silu":
        acc = torch.cat([F.silu(acc[s:s + ROWS]) for s in range(0, T, ROWS)]) if T else acc
    new_state = (xp[T:] if K > 1 else xp[:0]).to(x.dtype, copy=True)   # its own rows, as _carry
    y = acc.to(x.dtype)
    if split:
        y = (y[:, :split].contiguous(), y[:, split:].contiguous())
    if out is not None:
        y1, y2 = _outs(x, split, out, "causal_conv1d_torch")
        if split:
            y = (y1.copy_(y[0]), y2.copy_(y[1]))
        else:
            y = y1.copy_(y)
    return y, new_state.contiguous()
