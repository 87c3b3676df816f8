"""The expert FFN's combine: the K weighted rows of each token summed into y, in one pass.

Legend: T tokens, D hidden, K top-k; an assignment a = t*K + k owns row a of yk.

    y[t] = sum over k = 0..K-1 (in that order, fp32, from 0) of yk[t*K + k]     [T, D]
           rows "mask": a k with topk_ids[t, k] < 0 adds nothing (its row is never read)
    out given (fp32 [T, D]):  out += y  and return out;  else return bf16(y) (round to nearest even)

yk fp32 [T*K, D] is what every expert FFN launcher's DOWN GEMM writes (strata.kernels.moe.ffn,
.plane, .decoded); `rows` is moe._combine's: "all" / "layer" (every row written: read them all),
"mask" (rows of id -1 were never written: skip them), None (no rows: y = 0). T*K = 0 also gives
y = 0 (out comes back untouched). The kernel reads each live row once and writes y once: the
sum over K stays in registers, and a skipped row is masked at its load, since zeroing it in yk
first would read and write all of yk once more (yk is 2.1 GB a layer at T = 32768, qwen3's K 8
and D 2048). yk itself is never written.

`combine_rows` (Triton) and `combine_rows_torch` (plain torch) share one signature and give the
same bits: both add the K rows one after another in k order starting from +0.0 (a skipped row
adds +0.0), then add that sum into `out` or round it to bf16 once. `tile`: the launch's
CombineTile (None: `combine_tile`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from strata._backend import INTERPRET
from strata.errors import StrataError
from strata.kernels.moe._combine_kernel import _combine_fwd_kernel

ROWS = ("all", "mask", "layer", None)


@dataclass(frozen=True)
class CombineTile:
    """One program: BLOCK_T tokens x BLOCK_D features (each a power of two), all K rows."""
    BLOCK_T: int
    BLOCK_D: int
    num_warps: int = 4


def combine_tile(T: int, D: int) -> CombineTile:
    """The default tile. GPU: 4 tokens x up to 512 features a program (8 KB of fp32 per k in
    flight, K loads unrolled; not swept — `benchmarks/profile_read.py --what ffn` shows its device
    time beside the GEMMs'). Interpreter: up to 64 x 256, since there a program costs host time
    whatever its size."""
    bd = triton.next_power_of_2(max(D, 1))
    if INTERPRET:
        return CombineTile(min(64, triton.next_power_of_2(max(T, 1))), min(256, bd))
    return CombineTile(4, min(512, bd))


def _check(yk, T: int, K: int, D: int, topk_ids, out, rows) -> None:
    if rows not in ROWS:
        raise StrataError(f"rows must be one of {ROWS}, got {rows!r}")
    if yk.dtype != torch.float32 or yk.dim() != 2 or tuple(yk.shape) != (T * K, D) \
            or (D > 1 and yk.stride(1) != 1):
        raise StrataError(f"yk must be fp32 [T*K={T * K}, D={D}] with unit feature stride, got "
                          f"{str(yk.dtype)[6:]} {list(yk.shape)} strides {list(yk.stride())}")
    if topk_ids.dim() != 2 or tuple(topk_ids.shape) != (T, K) or topk_ids.dtype.is_floating_point:
        raise StrataError(f"topk_ids must be an integer [T={T}, K={K}], got {topk_ids.dtype} "
                          f"{list(topk_ids.shape)}")
    if out is not None and (out.dtype != torch.float32 or tuple(out.shape) != (T, D)
                            or (D > 1 and out.stride(1) != 1)):
        raise StrataError(f"out must be fp32 [T={T}, D={D}] with unit feature stride, got "
                          f"{str(out.dtype)[6:]} {list(out.shape)} strides {list(out.stride())}")
    devs = {yk.device, topk_ids.device} | ({out.device} if out is not None else set())
    if len(devs) != 1:
        raise StrataError(f"combine inputs must live on one device, got {sorted(map(str, devs))}")


def _nothing(yk, T: int, D: int, out) -> torch.Tensor:
    return out if out is not None else torch.zeros(T, D, dtype=torch.bfloat16, device=yk.device)


def combine_rows(yk: torch.Tensor, T: int, K: int, D: int, topk_ids: torch.Tensor,
                 out: torch.Tensor | None, rows: str | None, *,
                 tile: CombineTile | None = None) -> torch.Tensor:
    """y = the sum over K of yk's rows (module docstring): bf16 [T, D], or `out` with y added."""
    _check(yk, T, K, D, topk_ids, out, rows)
    if rows is None or T * K == 0:
        return _nothing(yk, T, D, out)
    tile = tile or combine_tile(T, D)
    dst = out if out is not None else torch.empty(T, D, dtype=torch.bfloat16, device=yk.device)
    grid = (triton.cdiv(T, tile.BLOCK_T), triton.cdiv(D, tile.BLOCK_D))
    _combine_fwd_kernel[grid](
        yk, yk.stride(0), topk_ids, topk_ids.stride(0), topk_ids.stride(1), dst, dst.stride(0),
        T, D, TOPK=K, MASK=rows == "mask", ADD=out is not None,
        BT=tile.BLOCK_T, BD=tile.BLOCK_D, INTERP=INTERPRET, num_warps=tile.num_warps)
    return dst


def combine_rows_torch(yk: torch.Tensor, T: int, K: int, D: int, topk_ids: torch.Tensor,
                       out: torch.Tensor | None, rows: str | None, *,
                       tile: CombineTile | None = None) -> torch.Tensor:
    """Plain-torch reference of `combine_rows` (same signature; tile ignored), bit for bit."""
    _check(yk, T, K, D, topk_ids, out, rows)
    if rows is None or T * K == 0:
        return _nothing(yk, T, D, out)
    rows_k = yk.view(T, K, D)
    y = torch.zeros(T, D, dtype=torch.float32, device=yk.device)
    for k in range(K):
        r = rows_k[:, k]                                                        # [T, D]
        y = y + (torch.where((topk_ids[:, k] >= 0)[:, None], r, 0.0) if rows == "mask" else r)
    if out is not None:
        return out.add_(y)
    return y.to(torch.bfloat16)
