"""A later chunk's attention over bf16 prefix segments by FlashAttention-2 (or cuDNN) blocks merged
by their log-sum-exp, for the head widths where they beat strata's Triton chunk attention.

Legend: T chunk tokens, H query heads, Hkv kv heads, hd head width, Q = min(T, FLASH_ROWS) the
query block, S the prefix segments (staged host tokens, resident tokens).

    prefix_flash_attention(q [T, H, hd], k, v [T, Hkv, hd], prefix [KVSegment...], *,
                           sm_scale=None, state=None, block=None, sinks=None) -> o [T, H, hd]
    for each query block [a, b):  acc, lse = 0
        for each segment s:  (o_s, lse_s) = flash(q[a:b], s.k, s.v, no mask);  merge
        (o_c, lse_c) = flash(q[a:b], k[:b], v[:b], bottom-right causal);        merge
        sinks [H]:  acc *= sigmoid(lse - sink[h])
        o[a:b] = acc
The meaning is chunk_attention's (and its twin chunk_attention_torch's, the reference): query i
of the chunk sees every prefix key and the chunk's keys 0..i. A sink (GPT-OSS's learned logit a
head) joins each row's softmax denominator with no value: the normalized sum over the keys,
times e^lse / (e^lse + e^sink), which is sigmoid(lse - sink) on the merged lse, so GPT-OSS's full
layers (no window) take the blocks too, their first chunk among them (no prefix).
FlashAttention-2 takes GQA as is (Hkv key heads), the prefix segments as strided views (no
gather), and the bottom-right mask of `k[:b]` is exactly "query a + i sees chunk keys 0..a + i".

Why: Qwen3.5's gated attention is hd 256, where chunk_attention's tile is 64 x 32 (tiles.py):
a 131,072-token prompt in chunks of 32,768 spent 0.19 / 0.31 / 0.43 s a full layer on chunks
1-3, ~9 of the read's 12.8 s (H100, 35b7826); through these blocks 0.10 / 0.15 / 0.21 s, the read
7.9 s (0bc0058; FlashAttention-2 at ~300 TFLOP/s where cuDNN's first chunk reaches ~570).

Memory: the merged state, fp32 [Q, H (hd + 1)] (acc kept normalized, and lse), is the layout's
`attn_flash` buffer (strata.planning; `state`; without one a fresh tensor); flash's own output
and lse for a block ([Q, H, hd] bf16 and [H, Q] fp32) are allocated by torch's op, transient
inside the budget's reserve as MLA's are (33.5 + 0.3 MB at Qwen3.5's H 16, hd 256, Q 4096,
beside the planned state's 67 MB).

`prefix_route(hd, kv)` is the one choice the plan (whether it carves attn_flash) and the KV
(whether it calls this) read; `pin_prefix_route("triton" | "flash" | "cudnn")` overrides it for
A/B. "cudnn" runs the same blocks through cuDNN's attention (the kernel of the first chunk); it
is the default where cuDNN's attention runs on Hopper (blocks_kernel), from hd 128: a
131,072-token Qwen3.5 read (hd 256) in chunks of 32,768 ran 28,086 tok/s through cuDNN's blocks
against 19,187 through FlashAttention-2's and 11,574 through chunk_attention, and qwen3-30b-a3b
(hd 128, bf16 KV, a 32,768-token window) 9,684 against chunk_attention's 8,166 (H100, b1ead7e
and 9774281).
Off CUDA the block kernel is flash's plain-torch twin (strata.kernels.attention.flash.
attend_block_ref), so the blocking and merging are tested on the CPU against
chunk_attention_torch.
"""
from __future__ import annotations

import contextlib
import functools
import math
from contextvars import ContextVar

import torch

from strata.errors import StrataError
from strata.kernels.attention.flash import attend_block_ref, cudnn_forward, flash_forward
from strata.kernels.attention.merge import lse_merge, lse_merge_torch
from strata.kernels.pins import pinned, plan_target

FLASH_ROWS = 4096        # query rows a block: the state is [Q, H (hd + 1)] fp32
FLASH_MIN_HD = 129       # hd from which auto routes a bf16 prefix to FlashAttention-2's blocks
#                          (chunk_attention's tile is 64 x 32 there; at 128 it keeps 0.75+)
CUDNN_MIN_HD = 128       # ... and to cuDNN's where blocks_kernel is cudnn: at hd 128 they ran
#                          1.19x chunk_attention (qwen3-30b-a3b, 131K, bf16 window; H100); at
#                          hd 64 (gpt-oss-120b, sinks) within 4% of it either way, P 0..96K
#                          (benchmarks/prefix_route_bench.py, H100, 427bdf0): not worth a state
ROUTES = ("triton", "flash", "cudnn")
_ROUTE: ContextVar[str | None] = ContextVar("strata_prefix_route", default=None)


@contextlib.contextmanager
def pin_prefix_route(route: str):
    """Inside the block a later chunk's bf16 prefix goes by `route` (plan and KV alike)."""
    if route not in ROUTES:
        raise StrataError(f"pin_prefix_route: route must be one of {ROUTES}, got {route!r}")
    with pinned(_ROUTE, route):
        yield


def pinned_prefix_route() -> str | None:
    """The route pin_prefix_route (--prefix-attention) holds in force, None when none is."""
    return _ROUTE.get()


def blocks_kernel(capability: tuple[int, int] | None = None,
                  cudnn_version: int | None = None) -> str:
    """"cudnn" or "flash": whose kernel runs the blocks by default. cuDNN's attention where it
    runs on Hopper or later (compute capability 9.0+, cuDNN 9+: torch's SDPA picks it there,
    and it measured 1.46x FlashAttention-2's blocks at 131K on the H100); FlashAttention-2
    elsewhere (older GPUs, no cuDNN; and the CPU, where both are the torch twin). Without
    arguments: this machine's first CUDA device and cuDNN, or, for a GPU plan made on a host
    without one (strata.kernels.pins.planning_for), a Hopper GPU with cuDNN 9."""
    machine = _machine()
    if plan_target() == "cuda" and machine[0] == (0, 0):
        # a GPU plan made on a host without one: strata's target, Hopper with cuDNN 9 (its
        # blocks carve the state an older GPU's would not: the plan counts more, never less)
        machine = ((9, 0), 90000)
    capability = machine[0] if capability is None else capability
    cudnn_version = machine[1] if cudnn_version is None else cudnn_version
    return "cudnn" if capability >= (9, 0) and cudnn_version >= 90000 else "flash"


@functools.cache
def _machine() -> tuple[tuple[int, int], int]:
    """This machine's first CUDA device's compute capability ((0, 0) without one) and cuDNN's
    version (0 without it), asked once: every later chunk's layer asks prefix_route."""
    capability = torch.cuda.get_device_capability(0) if torch.cuda.is_available() else (0, 0)
    cudnn = (torch.backends.cudnn.version() or 0) if torch.backends.cudnn.is_available() else 0
    return capability, cudnn


def prefix_route(head_dim: int, kv: str) -> str:
    """"cudnn", "flash" or "triton": how a later chunk attends a prefix of KV dtype `kv` (bf16
    only goes to blocks; int8 has its own expansion path) at head width `head_dim` (blocks only
    where FlashAttention-2 takes it: a multiple of 8 up to 256, pinned or not); by default
    blocks_kernel()'s from hd CUDNN_MIN_HD (cudnn) or FLASH_MIN_HD (flash)."""
    pin = _ROUTE.get()
    if kv != "bf16" or head_dim % 8 or head_dim > 256:   # what FlashAttention-2 takes
        return "triton"
    if pin is not None:
        return pin
    blocks = blocks_kernel()
    return blocks if head_dim >= (CUDNN_MIN_HD if blocks == "cudnn" else FLASH_MIN_HD) \
        else "triton"


def flash_rows(T: int) -> int:
    """Q: the query block (and the state's rows) for a chunk of T tokens."""
    return min(T, FLASH_ROWS)


def flash_state_floats(n_head: int, head_dim: int) -> int:
    """fp32 values of merged state a query row: acc (H hd) and lse (H)."""
    return n_head * (head_dim + 1)


def prefix_flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix=(), *,
                           sm_scale: float | None = None, state: torch.Tensor | None = None,
                           block: int | None = None, route: str = "flash",
                           sinks: torch.Tensor | None = None,
                           out: torch.Tensor | None = None) -> torch.Tensor:
    """The chunk's attention over `prefix` (bf16 KVSegments) and its own keys (see the module
    docstring) -> o [T, H, hd]. route "cudnn": cuDNN's blocks (cudnn_forward), the chunk's
    keys before the query block unmasked and its own square block causal (cuDNN's alignment of
    a non-square mask is not relied on). `sinks` [H] float: each head's sink logit joins its
    rows' denominators (chunk_attention's `sinks`). `out` [T, H, hd]: where o goes (the
    engine's carve; allocated where None)."""
    T, H, hd = q.shape
    Hkv = k.shape[1]
    if any(s.int8 for s in prefix):
        raise StrataError("prefix_flash_attention reads bf16 segments; int8 ones go through "
                          "chunk_attention's expansion")
    if H % Hkv or k.shape != v.shape or k.shape[0] != T or k.shape[2] != hd:
        raise StrataError(f"prefix_flash_attention: q [T, H, hd], k and v [T, Hkv, hd] with H a "
                          f"multiple of Hkv, got {list(q.shape)}, {list(k.shape)}, "
                          f"{list(v.shape)}")
    if sinks is not None and (sinks.shape != (H,) or sinks.device != q.device
                              or not sinks.dtype.is_floating_point):
        raise StrataError(f"prefix_flash_attention: sinks must be a float [H={H}] tensor on "
                          f"{q.device}; got {sinks.dtype} {list(sinks.shape)} on {sinks.device}")
    scale = 1.0 / math.sqrt(hd) if sm_scale is None else sm_scale
    if route not in ("flash", "cudnn"):
        raise StrataError(f"prefix_flash_attention: route must be flash or cudnn, got {route!r}")
    kernel = (cudnn_forward if route == "cudnn" else flash_forward) if q.is_cuda else \
        attend_block_ref
    merge = lse_merge if q.is_cuda else lse_merge_torch
    Q = min(T, block or FLASH_ROWS)
    need = Q * flash_state_floats(H, hd)
    if state is None:
        state = torch.empty(need, dtype=torch.float32, device=q.device)
    flat = state.reshape(-1).view(torch.float32) if state.dtype != torch.float32 else \
        state.reshape(-1)
    if flat.numel() < need:
        raise StrataError(f"prefix_flash_attention: the state holds {flat.numel()} fp32 values, "
                          f"a query block of {Q} rows needs {need}")
    o = torch.empty_like(q) if out is None else out
    segs = [(s.k.transpose(0, 1), s.v.transpose(0, 1)) for s in prefix]      # [Hkv, S, hd]
    kc, vc = k.transpose(0, 1), v.transpose(0, 1)                              # [Hkv, T, hd]
    sink = None if sinks is None else sinks.float()[:, None]                   # [H, 1]
    for a in range(0, T, Q):
        b = min(T, a + Q)
        n = b - a
        acc = flat[:H * n * hd].view(H, n, hd)
        lse = flat[H * n * hd:H * n * (hd + 1)].view(H, n)
        qb = q[a:b].transpose(0, 1)                                            # [H, n, hd]
        first = True
        for ks, vs in segs:
            merge(acc, lse, *kernel(qb, ks, vs, False, scale), first)
            first = False
        if route == "cudnn":        # the chunk's keys before the block, then its square
            if a:
                merge(acc, lse, *kernel(qb, kc[:, :a], vc[:, :a], False, scale), first)
                first = False
            merge(acc, lse, *kernel(qb, kc[:, a:b], vc[:, a:b], True, scale), first)
        else:
            merge(acc, lse, *kernel(qb, kc[:, :b], vc[:, :b], True, scale), first)
        if sink is not None:    # e^lse / (e^lse + e^sink): the sink's share leaves the rows
            acc.mul_(torch.sigmoid(lse - sink).unsqueeze(-1))
        o[a:b].copy_(acc.transpose(0, 1))
    return o
