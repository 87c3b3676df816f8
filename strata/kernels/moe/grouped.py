"""The decoded expert FFN's GEMMs through torch._grouped_mm (cutlass on sm90+), and the choice
between them and strata's Triton BF16 GEMM.

Legend: T tokens, D hidden, F expert width, E experts, K top-k, TK = T·K assignments, G groups
(the decode buffer's slots, <= E), M rows sorted by group (n_valid of them live),
BB = the BF16 blob's size (strata.kernels.moe.decoded.bf16_layout).

    bucket[a]  = slot of a's expert in the decode buffer (G: id -1 or expert not decoded)
    order      = assignments sorted by bucket (live ones first)    offs[g] = end row of group g
    xs         = x[order // K]                                                         [M, D]
    g, u       = grouped_mm(xs, W_gate/up[g]^T, offs)     (one [2F, D] GEMM when gate and up
                                                            are adjacent in the blob)  [M, F]
    h          = bf16(silu(g) * u)                         (silu_mul)                  [M, F]
    yd         = grouped_mm(h, W_down[g]^T, offs)                                      [M, D]
    yk[order[i]] = yd[i] * w[order[i]]   for i < n_valid   (scatter_rows, fp32)        [TK, D]
    y          = sum over K of yk's rows                   (strata.kernels.moe.combine)    [T, D]
                 (no yk in the workspace: y = sum over K of yd[inv[a]] * w[a], combine_sorted,
                 the same sum without the fp32 rows' write and read)

Numerics: fp32 accumulation inside each GEMM as in the Triton kernel, h rounded to bf16 where the
Triton kernel rounds it (its down GEMM's input); torch._grouped_mm returns its input dtype, so g,
u and yd are also rounded to bf16 once each (the Triton kernel keeps them in fp32): one more bf16
step per value, inside DECODED_REL. The weighted sum over K is the Triton path's (same yk, same
combine), so a layer's passes sum in the same order.

No host sync with check=False: the grouping, offs and n_valid stay on the device; the kernels
around the GEMMs read n_valid there and leave rows past it alone (a streamed pass's other rows).

`decoded_gemm` says which backend runs; `pin_decoded_gemm` pins it for a block ("triton",
"grouped", "auto"); `last_decoded_gemm` reports the last call's choice and why.
"""
from __future__ import annotations

import warnings
from contextvars import ContextVar
from dataclasses import dataclass

import torch
import triton

from strata._backend import INTERPRET
from strata.errors import StrataError
from strata.experts import ExpertSet
from strata.kernels.moe import _grouped_kernel as _k
from strata.kernels.moe.combine import combine_tile
from strata.kernels.moe.ffn import COMBINES, _check_inputs, _combine, _work
from strata.kernels.pins import pinned_one_of
from strata.kernels.moe.grouping import group_blocked, group_ragged

DECODED_GEMMS = ("triton", "grouped", "auto")
# "auto" takes the grouped GEMM from this many rows an expert (T·K / E). Profiled on the H200
# (qwen3-30b-a3b Q8_0, E 128, K 8, uniform routing): at T = 8192 (512 rows an expert) cutlass's
# grouped GEMMs took 1.14 ms against strata's BF16 GEMM's 1.31 ms per FFN call, at T = 32768
# (2048 rows) 697 against ~237 TFLOP/s. The whole-FFN bench (groupedbench, 413a1c8, check=True:
# the grouped arm's check groups by group_blocked and scatters) ran it at 61.8 / 153.7 / 334.3
# TFLOP/s against the Triton GEMM's 58.3 / 175.6 / 303.9 at T = 2048 / 8192 / 32768, while the
# resident 8K read (check=False) ran faster with it (207 ms against 214): 256 stays until an
# unchecked A/B at 4K-8K settles it.
GROUPED_MIN_ROWS = 256

_GEMM: ContextVar[str | None] = ContextVar("strata_decoded_gemm", default=None)


def pin_decoded_gemm(choice: str):
    """Force `decoded_gemm`'s answer inside the block: "triton" (strata's BF16 expert GEMM),
    "grouped" (torch._grouped_mm, also on the CPU) or "auto" (the default rule)."""
    return pinned_one_of(_GEMM, choice, DECODED_GEMMS, "pin_decoded_gemm")


def grouped_available(x: torch.Tensor) -> bool:
    """Whether cutlass's grouped GEMM serves x's device: CUDA, sm90 or newer, a torch that has
    _grouped_mm (elsewhere torch loops over groups: slower than the Triton GEMM)."""
    return (x.is_cuda and hasattr(torch, "_grouped_mm")
            and torch.cuda.get_device_capability(x.device) >= (9, 0))


def decoded_gemm(x: torch.Tensor, topk_ids: torch.Tensor, n_expert: int, *,
                 carved: bool = False) -> str:
    """"triton" or "grouped": the pin, else "auto"'s rule — grouped where it is available, an
    expert averages at least GROUPED_MIN_ROWS rows (T·K / E: what the host knows without a sync;
    a streamed pass's experts average the same as the layer's) and the call's buffers are not
    `carved` (the streaming engine's workspace: its plan counts h, yk and wdec, not the grouped
    path's xs [TK, D], g/u [TK, 2F] and yd [TK, D], so there "auto" keeps the Triton GEMM and the
    engine inside its byte budget; a pin still runs grouped there, for the A/B)."""
    choice = _GEMM.get() or "auto"
    if choice != "auto":
        return choice
    rows = topk_ids.numel() / max(1, n_expert)
    fits = grouped_available(x) and rows >= GROUPED_MIN_ROWS and not carved
    return "grouped" if fits else "triton"


def grouped_unfit(dec: ExpertSet) -> str | None:
    """Why torch._grouped_mm cannot read these BF16 experts in place (None: it can). Its path
    runs the plain silu FFN only (silu_mul, no bias); cutlass wants every matrix's base 16-byte
    aligned and its row stride a multiple of 16 bytes."""
    lay = dec.layout
    if not lay.plain:
        what = (["biases"] if lay.bias is not None else []) + \
            ([f"the {lay.act.name} activation"] if lay.act.name != "silu" else [])
        return (f"the experts carry {' and '.join(what)}, which only the Triton GEMM's "
                f"epilogue applies")
    if not hasattr(torch, "_grouped_mm"):
        return f"torch {torch.__version__} has no _grouped_mm"
    for m in lay.matrices:
        if m.fmt.name != "BF16" or m.row_bytes != 2 * m.cols:
            return f"the {m.name} matrix is {m.fmt.name}, not dense BF16 rows"
        if m.row_bytes % 16 or m.offset % 16:
            return (f"the {m.name} matrix's rows ({m.row_bytes} B) or offset ({m.offset} B) are "
                    f"not 16-byte multiples: cutlass needs D and F multiples of 8")
    if lay.size % 16 or dec.arena.data_ptr() % 16:
        return (f"the decode buffer (address {dec.arena.data_ptr():#x}, blob {lay.size} B) is "
                f"not 16-byte aligned")
    return None


@dataclass(frozen=True)
class GemmChoice:
    """What the last moe_ffn_decoded call ran its GEMMs on, and why not grouped when it asked."""
    backend: str               # "triton" | "grouped"
    reason: str | None = None  # set when "grouped" was asked for but could not run, and always
    #                            for experts with biases or another activation (Triton's alone)


_last: list[GemmChoice] = []


def last_decoded_gemm() -> GemmChoice | None:
    """The choice of the most recent moe_ffn_decoded call in this process (None before one)."""
    return _last[0] if _last else None


def record(backend: str, reason: str | None = None) -> str:
    _last[:] = [GemmChoice(backend, reason)]
    return backend


def resolve(x, topk_ids, dec: ExpertSet, workspace=None) -> str:
    """The backend this call runs (records it): "grouped" falls back to "triton" when the
    experts do not fit it (a warning when the grouped GEMM was pinned); experts with biases or
    another activation than silu always run "triton", and the record says why."""
    carved = bool(workspace) and workspace.get("yk") is not None
    want = decoded_gemm(x, topk_ids, dec.n_expert, carved=carved)
    why = grouped_unfit(dec) if want == "grouped" or not dec.layout.plain else None
    if why and _GEMM.get() == "grouped":
        warnings.warn(f"pin_decoded_gemm('grouped'): {why}; running the Triton GEMM", stacklevel=3)
    return record("triton" if why else want, why)


def _rows_tile(rows: int, cols: int) -> tuple[int, int]:
    """(BR, BC) of silu_mul / scatter_rows: 8 rows x 256 columns a program on the GPU (2 K
    elements, 16-byte accesses; memory-bound, not swept); the interpreter takes big programs,
    since there each costs host time whatever its size."""
    bc = min(256, triton.next_power_of_2(max(cols, 1)))
    return (min(64, triton.next_power_of_2(max(rows, 1))) if INTERPRET else 8), bc


def _check_rows(name, t, dtype, cols, dev):
    if t.dtype != dtype or t.dim() != 2 or t.shape[1] != cols or t.device != dev \
            or t.stride(1) != 1:
        raise StrataError(f"{name} must be {str(dtype)[6:]} [rows, {cols}] with unit column "
                          f"stride on {dev}, got {t.dtype} {list(t.shape)} strides "
                          f"{list(t.stride())} on {t.device}")


def _check_silu(g, u, h, n_valid):
    F = g.shape[1]
    for name, t in (("g", g), ("u", u), ("h", h)):
        _check_rows(name, t, torch.bfloat16, F, g.device)
    if u.shape != g.shape or u.stride() != g.stride() or h.shape[0] < g.shape[0]:
        raise StrataError(f"silu_mul: g {list(g.shape)} and u {list(u.shape)} must match in shape "
                          f"and strides and h {list(h.shape)} hold their rows")
    if n_valid.dtype != torch.int32 or n_valid.numel() != 1 or n_valid.device != g.device:
        raise StrataError(f"n_valid must be an int32 [1] on {g.device}, got {n_valid.dtype} "
                          f"{list(n_valid.shape)} on {n_valid.device}")


def silu_mul(g: torch.Tensor, u: torch.Tensor, h: torch.Tensor,
             n_valid: torch.Tensor) -> torch.Tensor:
    """h[i] = bf16(silu(g[i]) * u[i]) (fp32 inside) for rows i < n_valid[0]; h's other rows are
    not touched. g, u bf16 [M, F] (same strides: the two halves of one [M, 2F] GEMM output, or
    two outputs), h bf16 [>= M, F]. Returns h."""
    _check_silu(g, u, h, n_valid)
    M, F = g.shape
    if M == 0:
        return h
    br, bc = _rows_tile(M, F)
    _k._silu_mul_kernel[(triton.cdiv(M, br), triton.cdiv(F, bc))](
        g, u, g.stride(0), h, h.stride(0), n_valid, F, BR=br, BC=bc, INTERP=INTERPRET,
        num_warps=4)
    return h


def silu_mul_torch(g: torch.Tensor, u: torch.Tensor, h: torch.Tensor,
                   n_valid: torch.Tensor) -> torch.Tensor:
    """Plain-torch reference of `silu_mul` (same signature): silu as the Triton epilogue writes
    it, g / (1 + exp(-g)) * u in fp32, rounded to bf16."""
    _check_silu(g, u, h, n_valid)
    M = g.shape[0]
    gf, uf = g.float(), u.float()
    live = (torch.arange(M, device=g.device) < n_valid)[:, None]                 # [M, 1]
    h[:M] = torch.where(live, (gf / (1 + torch.exp(-gf)) * uf).to(torch.bfloat16), h[:M])
    return h


def _check_scatter(yd, order, tw, yk, n_valid):
    D = yk.shape[1] if yk.dim() == 2 else -1
    _check_rows("yk", yk, torch.float32, D, yd.device)
    _check_rows("yd", yd, torch.bfloat16, D, yd.device)
    if order.dim() != 1 or order.shape[0] != yd.shape[0] or order.dtype != torch.int64 \
            or tw.dtype != torch.float32 or tw.dim() != 1 or tw.shape[0] != yk.shape[0] \
            or order.device != yd.device or tw.device != yd.device:
        raise StrataError(f"scatter_rows: order must be int64 [M={yd.shape[0]}] and tw fp32 "
                          f"[TK={yk.shape[0]}] on {yd.device}; got {order.dtype} "
                          f"{list(order.shape)}, {tw.dtype} {list(tw.shape)}")
    if n_valid.dtype != torch.int32 or n_valid.numel() != 1 or n_valid.device != yd.device:
        raise StrataError(f"n_valid must be an int32 [1] on {yd.device}, got {n_valid.dtype} "
                          f"{list(n_valid.shape)} on {n_valid.device}")


def scatter_rows(yd: torch.Tensor, order: torch.Tensor, tw: torch.Tensor, yk: torch.Tensor,
                 n_valid: torch.Tensor) -> torch.Tensor:
    """yk[order[i]] = fp32(yd[i]) * tw[order[i]] for rows i < n_valid[0] (the Triton down GEMM's
    epilogue, after the grouped GEMM); yk's other rows are not touched. yd bf16 [M, D], order
    int64 [M] (distinct assignment rows), tw fp32 [TK], yk fp32 [TK, D]. Returns yk."""
    _check_scatter(yd, order, tw, yk, n_valid)
    M, D = yd.shape
    if M == 0:
        return yk
    br, bc = _rows_tile(M, D)
    _k._scatter_kernel[(triton.cdiv(M, br), triton.cdiv(D, bc))](
        yd, yd.stride(0), order, tw, yk, yk.stride(0), n_valid, D, BR=br, BC=bc, num_warps=4)
    return yk


def scatter_rows_torch(yd: torch.Tensor, order: torch.Tensor, tw: torch.Tensor,
                       yk: torch.Tensor, n_valid: torch.Tensor) -> torch.Tensor:
    """Plain-torch reference of `scatter_rows` (same signature), bit for bit."""
    _check_scatter(yd, order, tw, yk, n_valid)
    M = yd.shape[0]
    live = (torch.arange(M, device=yd.device) < n_valid)[:, None]               # [M, 1]
    rows = torch.where(live, yd.float() * tw[order][:, None], yk[order])
    return yk.index_copy_(0, order, rows)


def _check_sorted(yd, inv, tw, T, K, D, topk_ids, out, rows):
    if rows not in ("all", "mask"):
        raise StrataError(f"combine_sorted: rows must be 'all' or 'mask', got {rows!r}")
    _check_rows("yd", yd, torch.bfloat16, D, yd.device)
    for name, t, dt in (("inv", inv, torch.int64), ("tw", tw, torch.float32)):
        if t.dtype != dt or tuple(t.shape) != (T * K,) or t.device != yd.device:
            raise StrataError(f"combine_sorted: {name} must be {str(dt)[6:]} [T*K={T * K}] on "
                              f"{yd.device}, got {t.dtype} {list(t.shape)} on {t.device}")
    if tuple(topk_ids.shape) != (T, K) or topk_ids.dtype.is_floating_point:
        raise StrataError(f"topk_ids must be an integer [T={T}, K={K}], got {topk_ids.dtype} "
                          f"{list(topk_ids.shape)}")
    if out is not None:
        _check_rows("out", out, torch.float32, D, yd.device)
        if out.shape[0] != T:
            raise StrataError(f"out must be fp32 [T={T}, D={D}], got {list(out.shape)}")


def combine_sorted(yd: torch.Tensor, inv: torch.Tensor, tw: torch.Tensor, T: int, K: int,
                   D: int, topk_ids: torch.Tensor, out: torch.Tensor | None,
                   rows: str) -> torch.Tensor:
    """y = strata.kernels.moe.combine's sum over K, of the rows yd[inv[a]] * tw[a] (a = t*K + k)
    instead of yk[a]: the scatter into yk and its read skipped where no later call needs yk.
    rows "mask": a k with topk_ids[t, k] < 0 adds +0.0 (its row never read); "all": every
    row. Added into `out` (fp32 [T, D]) and returned, else bf16 [T, D]. yd bf16 [M, D], inv
    int64 [T*K] (a's row of yd), tw fp32 [T*K]."""
    _check_sorted(yd, inv, tw, T, K, D, topk_ids, out, rows)
    dst = out if out is not None else torch.empty(T, D, dtype=torch.bfloat16, device=yd.device)
    if T * K == 0:
        return dst if out is not None else dst.zero_()
    tile = combine_tile(T, D)
    _k._combine_sorted_kernel[(triton.cdiv(T, tile.BLOCK_T), triton.cdiv(D, tile.BLOCK_D))](
        yd, yd.stride(0), inv, tw, topk_ids, topk_ids.stride(0), topk_ids.stride(1), dst,
        dst.stride(0), T, D, TOPK=K, MASK=rows == "mask", ADD=out is not None,
        BT=tile.BLOCK_T, BD=tile.BLOCK_D, INTERP=INTERPRET, num_warps=tile.num_warps)
    return dst


def combine_sorted_torch(yd: torch.Tensor, inv: torch.Tensor, tw: torch.Tensor, T: int, K: int,
                         D: int, topk_ids: torch.Tensor, out: torch.Tensor | None,
                         rows: str) -> torch.Tensor:
    """Plain-torch reference of `combine_sorted` (same signature): the K products added one
    after another in k order from +0.0, as combine_rows_torch adds yk's rows."""
    _check_sorted(yd, inv, tw, T, K, D, topk_ids, out, rows)
    y = torch.zeros(T, D, dtype=torch.float32, device=yd.device)
    for k in range(K):
        a = torch.arange(T, device=yd.device) * K + k                              # [T]
        r = yd[inv[a]].float() * tw[a][:, None]                                    # [T, D]
        y = y + (torch.where((topk_ids[:, k] >= 0)[:, None], r, 0.0) if rows == "mask" else r)
    if out is not None:
        return out.add_(y)
    return y.to(torch.bfloat16)


def _kernels(dev):
    """The Triton launchers where Triton runs (CUDA, or the interpreter), else their twins."""
    if dev.type == "cuda" or INTERPRET:
        return silu_mul, scatter_rows, combine_sorted
    return silu_mul_torch, scatter_rows_torch, combine_sorted_torch


def grouped_ffn(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                dec: ExpertSet, *, out=None, workspace=None, check: bool = True,
                combine: str = "pass") -> torch.Tensor:
    """`moe_ffn`'s meaning and contract (ids of -1 skipped, `out` fp32 to add into, workspace
    "h" / "yk", check, combine) over BF16 experts decoded into one buffer, through
    torch._grouped_mm (module docstring). `dec`: strata.kernels.moe.decoded.decode_experts' output —
    dec.arena the decode buffer, expert e's blob at slot_offset[e] = c(e)·BB with c increasing
    in e (the compact order), -1 where not decoded; `grouped_unfit(dec)` must be None."""
    if combine not in COMBINES:
        raise StrataError(f"combine must be one of {COMBINES}, got {combine!r}")
    _check_inputs(x, topk_ids, topk_weights, dec)
    lay = dec.layout
    why = grouped_unfit(dec)
    if why:
        raise StrataError(f"grouped_ffn: {why}")
    T, D = x.shape
    K = topk_ids.shape[1]
    F, E, bb = lay.d_expert, dec.n_expert, lay.size
    dev = x.device
    if combine == "defer" and (not workspace or workspace.get("yk") is None):
        raise StrataError("combine='defer' keeps the rows between calls in workspace['yk']; "
                          "pass one (fp32, at least [T*K, D])")
    # yk only where a later call reads these rows (the workspace's, defer / layer); otherwise
    # the rows are summed straight from the GEMM's output (combine_sorted)
    keep = bool(workspace) and workspace.get("yk") is not None
    yk = _work(workspace, "yk", (T * K, D), torch.float32, dev) if keep else None  # [T·K, D]

    def nothing():   # no rows from this call: y = 0 / out as is, or the earlier calls' rows
        if yk is not None:
            return _combine(yk, T, K, D, topk_ids, out, "layer" if combine == "layer" else None)
        return out if out is not None else torch.zeros(T, D, dtype=torch.bfloat16, device=dev)
    if T * K == 0:
        return nothing()
    G = min(E, dec.arena.numel() // bb)
    so = dec.slot_offset
    group = torch.where(so >= 0, so // bb, G)                 # [E]: its slot; G = not decoded
    if check:   # one sync: validates ids and residency as moe_ffn does, and sizes M exactly
        grp = group_blocked(topk_ids, E, 1, slot_offset=so, skip_negative=True)
        if grp.n_blocks == 0:
            return nothing()
        order = grp.sorted_ids.long()                         # [M] by expert = by slot (c rises)
        inv = torch.zeros(T * K, dtype=torch.int64, device=dev).scatter_(
            0, order, torch.arange(order.numel(), device=dev))                  # [T·K]
        counts = torch.zeros(G + 1, dtype=torch.int64, device=dev).scatter_add_(
            0, group, grp.counts)[:G]                                           # [G]
        n_valid, n_skipped, live_ids = grp.n_blocks_dev, grp.n_skipped, topk_ids
    else:       # no sync: all T·K rows, the live ones first; n_valid stays on the device
        flat = topk_ids.reshape(-1).long()
        bucket = torch.where(flat >= 0, group[flat.clamp(min=0)], G).view(T, K)  # [T, K]
        rag = group_ragged(bucket, G + 1)
        order, inv, counts = rag.order, rag.inverse, rag.counts[:G]
        n_valid = rag.offsets[G:G + 1].to(torch.int32)
        n_skipped = None
        live_ids = torch.where(bucket < G, 0, -1)            # combine's mask: the rows written
    offs = torch.cumsum(counts, 0).to(torch.int32)                              # [G]
    xs = x.contiguous().index_select(0, order // K)                             # [M, D]
    M = xs.shape[0]
    w = dec.arena[:G * bb].view(torch.bfloat16).view(G, bb // 2)                # [G, BB/2]

    def mat(m, rows):   # [G, rows, cols] view of `rows` rows from matrix m's start, no copy
        at = m.offset // 2
        return w[:, at:at + rows * m.cols].view(G, rows, m.cols)

    def mm(a, wt):
        return torch._grouped_mm(a, wt.transpose(-2, -1), offs=offs)
    if lay.up.offset == lay.gate.offset + lay.gate.nbytes:   # gate and up adjacent: one GEMM
        gu = mm(xs, mat(lay.gate, 2 * F))                                       # [M, 2F]
        g, u = gu[:, :F], gu[:, F:]
    else:
        g, u = mm(xs, mat(lay.gate, F)), mm(xs, mat(lay.up, F))                 # [M, F] each
    silu, scatter, combine_yd = _kernels(dev)
    h = silu(g, u, _work(workspace, "h", (M, F), torch.bfloat16, dev), n_valid)[:M]
    yd = mm(h, mat(lay.down, D))                                                # [M, D]
    tw = topk_weights.reshape(-1).float().contiguous()                          # [T·K]
    mask = combine == "pass" and (n_skipped is None or n_skipped > 0)
    if not keep:   # same bits as yk's sum, without writing and reading T·K·D fp32
        return combine_yd(yd, inv, tw, T, K, D, live_ids, out, "mask" if mask else "all")
    scatter(yd, order, tw, yk, n_valid)
    if combine == "defer":
        return out if out is not None else torch.zeros(T, D, dtype=torch.bfloat16, device=dev)
    return _combine(yk, T, K, D, live_ids, out, "mask" if mask else "all")
