"""The softmax -> top-k router as one kernel: the router GEMM, the softmax and the top-k in a pass.

Legend: T tokens, D hidden, E experts, K top-k, P bf16 parts of the router weight.

    logits = x @ w^T                      # [T, E], every product x_td * w_ed exact, summed in fp32
    p = softmax(logits)                   # fp32
    ids, wt = top-K of p                  # [T, K] int64, fp32; renormalized to sum 1 if asked

Why a kernel: x is bf16 and a bf16 (or fp16) router weight times a bf16 activation is exact in
fp32, so the fp32 GEMM the models ran (`x.float() @ w.float().t()`, FFMA: 20 ms of a 32K read of
qwen3-30b-a3b on the H200, plus the fp32 copy of x, the softmax and torch.topk's 11 ms) computes
nothing a tensor-core dot with an fp32 accumulator does not: the products are the same numbers
and only the order of the fp32 sum differs. An fp32 weight is split into P = 3 bf16 parts whose
sum is the weight (8 + 8 + 8 mantissa bits), fp16 into 2, so the products stay exact there too.
Ties between equal logits pick the lower expert (torch.topk leaves tie order unspecified).

`softmax_topk_route` (Triton) and its twin `softmax_topk_route_torch` (the models' CPU path, the
code they ran before) share one signature; `router_logits` / `router_logits_torch` are the same
GEMM alone, for routers that score the logits another way (sigmoid, top-k then softmax). Which one a model gets: `router_impl` (the kernel for
CUDA activations in bf16 with up to MAX_EXPERTS experts), `pin_router` forces one for a
block. The launch is a `RouterTile` (router_tile: rows a program and the D step, sized so the
[BM, BE] fp32 logits and a step's weights fit one program), pinnable through `tile=`.
"""
from __future__ import annotations

import contextlib
from contextvars import ContextVar
from dataclasses import dataclass

import torch
import triton

from strata._backend import INTERPRET
from strata.errors import StrataError
from strata.kernels.moe._router_kernel import _softmax_topk_fwd_kernel
from strata.kernels.pins import pinned_one_of
from strata.kernels.moe.grouping import topk_route

ROUTER_IMPLS = ("triton", "torch")
# A program holds a [BM, next_pow2(E)] fp32 block of logits in registers: wider goes to the twin.
MAX_EXPERTS = 512
ACTS = (torch.bfloat16,)   # fp16 x would need its own parts: the twin takes it
WEIGHTS = (torch.bfloat16, torch.float16, torch.float32)

_IMPL: ContextVar[str | None] = ContextVar("strata_router_impl", default=None)


def pin_router(impl: str):
    """Force `router_impl`'s answer inside the block: "triton" (the kernel, on the CPU through the
    interpreter) or "torch" (the twin, also on CUDA)."""
    return pinned_one_of(_IMPL, impl, ROUTER_IMPLS, "pin_router")


def router_impl(x: torch.Tensor, w: torch.Tensor) -> str:
    """"triton" for CUDA activations in bf16 whose weight the kernel takes, "torch"
    otherwise (the fp32 reference path untouched), unless pinned."""
    pin = _IMPL.get()
    if pin is not None:
        return pin
    ok = (x.is_cuda and x.dtype in ACTS and w.dtype in WEIGHTS and w.device == x.device
          and w.dim() == 2 and w.shape[0] <= MAX_EXPERTS)
    return "triton" if ok else "torch"


@dataclass(frozen=True)
class RouterTile:
    """A program's rows (block_m, >= 16 for tl.dot), its step along D (block_d), warps and
    pipeline stages (router_tile picks one per expert count)."""
    block_m: int
    block_d: int
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self):
        for name in ("block_m", "block_d"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 16 or v & (v - 1):
                raise StrataError(f"RouterTile.{name} must be a power of two >= 16, got {v!r}")
        for name in ("num_warps", "num_stages"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise StrataError(f"RouterTile.{name} must be a positive int, got {v!r}")


def router_tile(n_expert: int, parts: int = 1) -> RouterTile:
    """The default tile for E experts and a weight of `parts` bf16 parts: every choice compiles
    for sm_90 without spills (tests/kernels/compile_router.py). Up to 128 experts 64 x 64, 4 warps,
    4 stages (benchmarks/router_bench.py on the H200, 6e7b876, qwen3's 128 experts, T 8K / 32K:
    0.108 / 0.156 ms against 0.250 / 0.803 for the fp32 GEMM + softmax + topk); 512 experts take
    8 warps (64 x 64 at 8 warps: 0.160 / 0.497 ms against 0.50 / 1.45 at 16 x 16 and 4 warps, the
    fp32 ops 0.75 / 2.83) and 32 rows, which keep the promoted sum's second [BM, BE] block out of
    local memory; more parts, fewer stages and a shorter D step (shared memory)."""
    be = max(16, triton.next_power_of_2(n_expert))
    one = parts == 1
    if be <= 128:
        return RouterTile(64, 64, 4, 4 if one else 2)
    if be <= 256:
        return RouterTile(64, 64 if one else 32, 8, 3 if one else 2)
    return RouterTile(32, 64 if one else 16, 8, 3 if one else 2)


def bf16_parts(w: torch.Tensor) -> torch.Tensor:
    """w [E, D] -> [P, E, D] bf16 whose fp32 sum over P is w exactly: P = 1 for bf16 (a view),
    2 for fp16, 3 for fp32 (each part the bf16 rounding of what the earlier ones left)."""
    if w.dtype == torch.bfloat16:
        return w.unsqueeze(0)
    n = {torch.float16: 2, torch.float32: 3}[w.dtype]
    rest = w.float()
    parts = []
    for _ in range(n):
        p = rest.to(torch.bfloat16)
        parts.append(p)
        rest = rest - p.float()
    return torch.stack(parts)


def _check(x, w, k):
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise StrataError(f"the router takes x [T, D] and w [E, D]; got x {list(x.shape)}, "
                          f"w {list(w.shape)}")
    E = w.shape[0]
    if not 1 <= k <= E:
        raise StrataError(f"top-k must be between 1 and E={E}, got {k}")


def _launch(x, w, k, renormalize, tile, logits: bool):
    """The kernel over x [T, D], w [E, D]: (ids, weights) [T, K], or logits [T, E] fp32."""
    if x.dtype not in ACTS or w.dtype not in WEIGHTS or w.device != x.device:
        raise StrataError(f"the router kernel takes bf16 x and a bf16/fp16/fp32 w on x's "
                          f"device; got x {x.dtype} on {x.device}, w {w.dtype} on {w.device}")
    T, D = x.shape
    E = w.shape[0]
    if E > MAX_EXPERTS:
        raise StrataError(f"the router kernel holds at most {MAX_EXPERTS} experts a row, got {E}; "
                          f"use its torch twin")
    if x.stride(1) != 1:
        x = x.contiguous()
    parts = bf16_parts(w.contiguous())                                        # [P, E, D]
    if logits:
        ids, wt = None, torch.empty((T, E), dtype=torch.float32, device=x.device)
    else:
        ids = torch.empty((T, k), dtype=torch.int64, device=x.device)    # every row written
        wt = torch.empty((T, k), dtype=torch.float32, device=x.device)
    if T:
        cfg = tile or router_tile(E, parts.shape[0])
        be = max(16, triton.next_power_of_2(E))
        ctx = torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()
        with ctx:
            _softmax_topk_fwd_kernel[(triton.cdiv(T, cfg.block_m),)](
                x, parts, wt if logits else ids, wt, T, D, E, x.stride(0), parts.stride(0),
                parts.stride(1), K=k, KP=triton.next_power_of_2(k), P=parts.shape[0],
                BM=cfg.block_m, BE=be, BD=cfg.block_d, RENORM=bool(renormalize),
                INTERP=INTERPRET, LOGITS=logits, num_warps=cfg.num_warps,
                num_stages=cfg.num_stages)
    return wt if logits else (ids, wt)


def softmax_topk_route(x: torch.Tensor, w: torch.Tensor, k: int, renormalize: bool = True, *,
                       tile: RouterTile | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, D] bf16, w [E, D] (E <= MAX_EXPERTS) -> (ids int64 [T, K], weights fp32
    [T, K]) in one launch (the module doc). `tile` pins the launch (default router_tile)."""
    _check(x, w, k)
    return _launch(x, w, k, renormalize, tile, logits=False)


def router_logits(x: torch.Tensor, w: torch.Tensor, *, tile: RouterTile | None = None
                  ) -> torch.Tensor:
    """x [T, D] bf16, w [E, D] -> logits x w^T [T, E] fp32: the same GEMM (exact products, the
    promoted fp32 sum) for the routers that score otherwise (DeepSeek's sigmoid, GPT-OSS's
    top-k then softmax)."""
    _check(x, w, 1)
    return _launch(x, w, 1, False, tile, logits=True)


def router_logits_torch(x: torch.Tensor, w: torch.Tensor, *,
                        tile: RouterTile | None = None) -> torch.Tensor:
    """The twin (the models' CPU and reference path): the fp32 GEMM. `tile` is ignored."""
    _check(x, w, 1)
    return x.float() @ w.float().t()


def softmax_topk_route_torch(x: torch.Tensor, w: torch.Tensor, k: int, renormalize: bool = True,
                             *, tile: RouterTile | None = None
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    """The twin (and the models' CPU and reference path): the fp32 GEMM, softmax, torch.topk.
    `tile` is accepted (and ignored) to keep the signature."""
    _check(x, w, k)
    return topk_route(router_logits_torch(x, w), k, renormalize=renormalize)


def route_softmax_topk(x: torch.Tensor, w: torch.Tensor, k: int, renormalize: bool = True
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """The implementation `router_impl` picks, called."""
    fn = softmax_topk_route if router_impl(x, w) == "triton" else softmax_topk_route_torch
    return fn(x, w, k, renormalize)


def route_logits(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The logits x w^T [T, E] fp32 by the implementation `router_impl` picks."""
    return (router_logits if router_impl(x, w) == "triton" else router_logits_torch)(x, w)
