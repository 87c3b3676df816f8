"""One key block of MLA's expanded attention in one Triton launch, q/k and values at their own
widths, the softmax state carried from block to block (strata.models.mla's "triton" backend).

Legend: H heads, n queries, m keys of the block, hd the q/k head width (DeepSeek-V3 192 =
nope 128 + rope 64), Hv the value width (128).

    mla_block_attention(q, k, v, masked, scale, *, o, lse, acc=None, tile=None)   Triton
    mla_block_attention_torch(...)                                 plain torch, the same signature

q [H, n, hd], k [H, m, hd], v [H, m, Hv] (last dims contiguous, any head and row strides),
bf16 (fp32 too under the interpreter; fp16 and fp32 in the twin). masked: query i sees keys
0..i + m - n (bottom-right: the block that ends at the queries' own keys; needs n <= m).
Writes o [H, n, Hv] (any float dtype, any strides with a unit last one) and lse fp32 [H, n]
(the natural log of the sum of exp(scale · q.k) over the keys the query saw: attend_block_ref's
meaning). acc: the state to resume from, fp32 [H, n, Hv] normalized (an earlier launch's o)
with `lse` holding its log-sum-exp: the call then folds this block into it, o = (acc e^lse +
o_b e^lse_b) / e^lse' — what strata.kernels.attention.merge does after a separate launch,
inside the one launch. acc may be o itself (each program reads its rows' state before it
writes them).

The kernel (strata.kernels.attention._mla_kernel) accumulates the scores from two dots, the
first power-of-two DA columns of q and k and the rest (192 = 128 + 64: no padded work), and
the value product Hv wide: against torch's flash forward on V zero-padded to 192, 5/6 of the
multiply-adds (81,920 against 98,304 a query-key pair at H = 128) and no padding columns to
keep. Off CUDA it runs in Triton's interpreter (the tests); on CUDA with other dtypes the twin.

Why its own kernel and not the chunk attention's (strata.kernels.attention._kernel) with a
value width: that kernel's segment descriptors share one width and one stride between k and v
(GQA's caches), its carried state is (acc, m, l) stored bit for bit between pieces where MLA's
scratch holds (o, lse), and its launches fold G heads into rows over up to two prefix segments
and the chunk; MLA's block is one head a program over one run of keys with a bottom-right mask.
Threading two widths, a second stride and another state format through it would change the
code every GQA layer compiles to (its tiles are measured) for none of its features.
"""
from __future__ import annotations

import torch

from strata._backend import INTERPRET
from strata.errors import StrataError
from strata.kernels.attention.tiles import AttnTile, resolve_mla_tile


FLOATS = (torch.bfloat16, torch.float16, torch.float32)   # the twin's; the kernel's: kernel_takes


def _check(q, k, v, masked, o, lse, acc) -> tuple[int, int, int, int, int]:
    """Shapes, dtypes and devices of one call -> (H, n, m, hd, Hv)."""
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3:
        raise StrataError(f"q, k, v must be [H, n, hd], [H, m, hd], [H, m, Hv]; got "
                          f"{list(q.shape)}, {list(k.shape)}, {list(v.shape)}")
    H, n, hd = q.shape
    m, Hv = k.shape[1], v.shape[2]
    if k.shape != (H, m, hd) or v.shape[:2] != (H, m) or n == 0 or m == 0 or \
            (masked and n > m):
        raise StrataError(f"need q [H, n, hd], k [H, m, hd], v [H, m, Hv] with n, m >= 1 (n <= m "
                          f"when masked); got {list(q.shape)}, {list(k.shape)}, {list(v.shape)}")
    if not q.dtype == k.dtype == v.dtype or q.dtype not in FLOATS:
        raise StrataError(f"q, k, v must be bf16, fp16 or fp32 alike; got {q.dtype}, {k.dtype}, "
                          f"{v.dtype}")
    if o.shape != (H, n, Hv) or o.dtype not in FLOATS or lse.shape != (H, n) or \
            lse.dtype != torch.float32:
        raise StrataError(f"o must be a float [{H}, {n}, {Hv}] and lse fp32 [{H}, {n}]; got "
                          f"{o.dtype} {list(o.shape)}, {lse.dtype} {list(lse.shape)}")
    if acc is not None and (acc.shape != (H, n, Hv) or acc.dtype != torch.float32):
        raise StrataError(f"acc must be fp32 [{H}, {n}, {Hv}]; got {acc.dtype} "
                          f"{list(acc.shape)}")
    devs = {t.device for t in (q, k, v, o, lse, acc) if t is not None}
    if len(devs) != 1:
        raise StrataError(f"q, k, v, o, lse (and acc) must share a device; got "
                          f"{sorted(map(str, devs))}")
    for name, t in (("q", q), ("k", k), ("v", v), ("o", o), ("lse", lse), ("acc", acc)):
        if t is not None and t.stride(-1) != 1:
            raise StrataError(f"{name} needs a unit stride in its last dim, got {t.stride()}")
    return H, n, m, hd, Hv


def mla_block_attention_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, masked: bool,
                              scale: float, *, o: torch.Tensor, lse: torch.Tensor,
                              acc: torch.Tensor | None = None,
                              tile: AttnTile | None = None) -> None:
    """The reference: fp32 scores, the bottom-right mask, logsumexp, and the fold into `acc`
    (when given) in fp32; `tile` accepted and unused."""
    H, n, m, hd, Hv = _check(q, k, v, masked, o, lse, acc)
    s = (q.float() @ k.float().transpose(1, 2)) * scale                      # [H, n, m]
    if masked:
        hide = torch.arange(m, device=q.device)[None, :] > \
            torch.arange(n, device=q.device)[:, None] + (m - n)
        s = s.masked_fill(hide, float("-inf"))
    lb = torch.logsumexp(s, dim=-1)                                          # [H, n]
    ob = torch.exp(s - lb[..., None]) @ v.float()                            # [H, n, Hv]
    if acc is not None:
        new = torch.logaddexp(lse, lb)
        ob = acc * (lse - new).exp()[..., None] + ob * (lb - new).exp()[..., None]
        lb = new
    o.copy_(ob)
    lse.copy_(lb)


def kernel_takes(q: torch.Tensor, o: torch.Tensor) -> bool:
    """Whether the Triton kernel runs this call: bf16 in, bf16 or fp32 out, on CUDA; fp32 in
    too in the interpreter (the CPU tests)."""
    ins = (torch.bfloat16,) if q.is_cuda else (torch.bfloat16, torch.float32)
    return (q.is_cuda or INTERPRET) and q.dtype in ins and o.dtype in (torch.bfloat16,
                                                                       torch.float32)


def split_width(hd: int) -> tuple[int, int]:
    """(DA, DB): the q/k width as a power of two and the rest (192 -> 128, 64; 128 -> 128, 0)."""
    da = 1 << (hd.bit_length() - 1)
    return da, hd - da


def tile_width(d: int) -> int:
    """A width's tile: the next power of two, at least 16 (tl.dot's smallest)."""
    return max(16, 1 << (d - 1).bit_length())


def mla_block_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, masked: bool,
                        scale: float, *, o: torch.Tensor, lse: torch.Tensor,
                        acc: torch.Tensor | None = None,
                        tile: AttnTile | None = None) -> None:
    """The Triton kernel (see the module docstring); `tile` overrides the heuristic's
    (pin_mla_tile does so for a block of code). Calls the kernel does not take go to the twin."""
    H, n, m, hd, Hv = _check(q, k, v, masked, o, lse, acc)
    if not kernel_takes(q, o):
        return mla_block_attention_torch(q, k, v, masked, scale, o=o, lse=lse, acc=acc)
    from strata.kernels.attention import _mla_kernel as _k
    da, db = split_width(hd)
    cfg = resolve_mla_tile(n, hd, Hv, tile)
    spec = _k.MLASpec(DA=da, DB=db, DV=Hv, BDA=tile_width(da), BDB=tile_width(db),
                      BDV=tile_width(Hv), BM=cfg.BLOCK_M, BN=cfg.BLOCK_N, MASKED=bool(masked),
                      RESUME=acc is not None, INTERP=INTERPRET)
    state = o if acc is None else acc      # never read without RESUME
    _k._mla_attention_kernel[_k.grid(n, H, cfg.BLOCK_M)](
        (q, q.stride(0), q.stride(1)), (k, k.stride(0), k.stride(1)),
        (v, v.stride(0), v.stride(1)), (o, o.stride(0), o.stride(1)),
        (state, state.stride(0), state.stride(1)), (lse, lse.stride(0)), n, m,
        scale * 1.4426950408889634, S=spec, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages)


def attend_block_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, masked: bool,
                        scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """strata.models.mla_attend.attend_block's signature through the kernel: (o [H, n, Hv] in
    q's dtype, lse fp32 [H, n]) of one block, no state."""
    H, n = q.shape[:2]
    o = torch.empty(H, n, v.shape[-1], dtype=q.dtype, device=q.device)
    lse = torch.empty(H, n, dtype=torch.float32, device=q.device)
    mla_block_attention(q, k, v, masked, scale, o=o, lse=lse)
    return o, lse


def block_pairs(n: int, m: int, masked: bool) -> int:
    """(query, key) pairs one launch attends a head: the FLOPs are 2·(hd + Hv) a pair."""
    return n * (m - n) + n * (n + 1) // 2 if masked else n * m


__all__ = ["attend_block_triton", "block_pairs", "kernel_takes", "mla_block_attention",
           "mla_block_attention_torch", "split_width"]
