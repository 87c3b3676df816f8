"""The MoE feed-forward of one layer, reading expert weights straight from their blobs.

Legend: T tokens, D hidden, F expert width, E experts, K top-k.

    y[t] = sum_k w[t,k] * down_e(silu(gate_e x[t]) * up_e x[t])     e = topk_ids[t,k]

A layout with biases and another activation (strata.blob: BiasSlot, ExpertAct; GPT-OSS) runs
    y[t] = sum_k w[t,k] * (down_e act(gate_e x[t] + bg_e, up_e x[t] + bu_e) + bd_e)
in the same GEMM's epilogue (`glu` and `expert_biases` below are its torch twin).

x [T, D] bf16, topk_ids [T, K] int, topk_weights [T, K] fp32, experts an ExpertSet (uint8 arena,
slot_offset[E], BlobLayout: gate [F, D], up [F, D], down [D, F], each in any strata format).
Accumulation is fp32; the intermediate h = silu(gate x) * up x is rounded to bf16 (the down GEMM's
tensor-core input); y comes back as bf16 [T, D] like x (the K partial rows are summed in fp32 first).

`moe_ffn` (Triton) and `moe_ffn_torch` (plain torch) share one signature.

Launch (`moe_ffn`): plan (strata.kernels.moe.tiles.plan_launch: tile, grid bound, workspace rows,
fixup scratch; the engine sizes its buffers from the same plan) -> route -> group by expert padded
to BLOCK_M (check=True: one device sync, which also checks that every routed expert is resident;
check=False, the engine's path: no sync, room for the plan's bound of blocks and the count read
by the kernel on the device) -> GATE_UP launch -> DOWN launch (each data-parallel or stream-k +
fixup) -> y = sum over K of the weighted rows, in a fixed order (`combine`: per call, or once per
layer over several calls' rows). How decoded weights meet the tensor cores is the tile's `dot` field
(pinnable: `pin_tile(dot="decode")`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from strata._backend import INTERPRET
from strata.blob import ALIGN
from strata.errors import StrataError
from strata.experts import ExpertSet
from strata.formats.tables import device_table
from strata.kernels.decode import format_traits
from strata.kernels.moe import _ffn_kernel as _k
from strata.kernels.moe.combine import combine_rows, combine_rows_torch
from strata.kernels.moe.grouping import check_topk_ids, group_blocked, group_blocked_bounded
from strata.kernels.moe.tiles import (GemmProblem, LaunchPlan, TileConfig, device_sms,  # noqa: F401
                                      plan_launch, resolve_tile, scratch_nbytes)


@dataclass(frozen=True)
class LaunchRecord:
    """What the last `moe_ffn` launched: its tile, grid and the fixup scratch it asked for."""
    tile: TileConfig
    n_blocks: int | None   # BLOCK_M row blocks over all experts with tokens (None: check=False,
    tiles_gate_up: int | None   # the count stayed on the device); n_blocks * cdiv(F, BN)
    tiles_down: int | None      # n_blocks * cdiv(D, BN)
    scratch_bytes: int     # fixup scratch (0 for data-parallel)


_last: list[LaunchRecord] = []  # one-entry history, read through last_launch()


def last_launch() -> LaunchRecord | None:
    """The record of the most recent `moe_ffn` call in this process (None before the first)."""
    return _last[0] if _last else None


def decoded_weights(layout) -> bool:
    """Whether a layout's GEMM decodes blocks in its inner loop (any of gate/up/down not BF16):
    the `decoded` of its launch plan."""
    return any(m.fmt.name != "BF16" for m in layout.matrices)


def _default_alloc(device):
    return lambda nbytes: torch.empty(nbytes, dtype=torch.uint8, device=device)


def _check_inputs(x, topk_ids, topk_weights, experts: ExpertSet):
    lay = experts.layout
    if x.dim() != 2 or x.shape[1] != lay.d_model:
        raise StrataError(f"x must be [T, D={lay.d_model}] for this layer, got {tuple(x.shape)}")
    if x.dtype != torch.bfloat16:
        raise StrataError(f"x must be bf16, got {x.dtype}; convert with x.to(torch.bfloat16)")
    check_topk_ids(topk_ids, experts.n_expert)
    if topk_ids.shape[0] != x.shape[0] or topk_weights.shape != topk_ids.shape:
        raise StrataError(f"topk_ids {tuple(topk_ids.shape)} and topk_weights "
                          f"{tuple(topk_weights.shape)} must both be [T={x.shape[0]}, K]")
    devs = {x.device, topk_ids.device, topk_weights.device, experts.arena.device,
            experts.slot_offset.device}
    if len(devs) != 1:
        raise StrataError(f"moe_ffn inputs must live on one device, got {sorted(map(str, devs))}")
    if experts.arena.dtype != torch.uint8 or experts.slot_offset.dtype != torch.int64:
        raise StrataError("ExpertSet must hold a uint8 arena and an int64 slot_offset")
    if experts.arena.is_cuda and experts.arena.data_ptr() % ALIGN:  # (the interpreter ignores it)
        raise StrataError(f"the ExpertSet arena must start {ALIGN}-byte aligned (got address "
                          f"{experts.arena.data_ptr():#x}); pass the whole buffer, not an odd view")


def _check_decoders(lay):
    need = [m.fmt.name for m in lay.matrices if m.fmt.name not in _k.TRITON_FORMATS]
    if need:
        raise StrataError(f"no in-kernel decoder for {sorted(set(need))}; moe_ffn reads "
                          f"{', '.join(_k.TRITON_FORMATS)}")


COMBINES = ("pass", "defer", "layer")


def moe_ffn(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
            experts: ExpertSet, *, schedule=None, scratch_alloc=None, out=None,
            workspace=None, check: bool = True, combine: str = "pass") -> torch.Tensor:
    """The layer's MoE feed-forward over T tokens -> y bf16 [T, D] (see module docstring).

    schedule: None (the heuristic in strata.kernels.moe.tiles, or the active `pin_tile`), "dp",
    "stream_k", or a whole TileConfig. scratch_alloc(nbytes) -> uint8 tensor supplies the stream-k
    fixup scratch (default: torch.empty on x's device); `last_launch()` reports its size.

    A topk id of -1 skips that assignment (a pass over some of the layer's experts; the
    streaming engine runs a layer in such passes). `out` (fp32 [T, D]): add this pass's y into
    it and return it, instead of returning a fresh bf16 y — passes then sum in fp32 and round
    once. `workspace`: preallocated buffers the launch uses instead of allocating — "h" (bf16,
    at least [plan_launch(...).h_rows, F], TKP rows) and "yk" (fp32, at least [T*K, D]), e.g.
    views the carve took out of the loan.

    check: True — one host sync per call validates the ids and the slot table (StrataError naming
    what is wrong) and sizes the grid exactly; False — no host sync at all: the caller vouches
    that ids lie in [-1, E) and every routed expert is resident and 256-byte aligned, the grid is
    the plan's bound (LaunchPlan.max_blocks) and the kernel reads the block count on the device
    (data-parallel programs past it exit at once: a pass over 1/p of a layer's experts launches
    about p times the programs it uses; stream-k's P programs split the real count).

    combine (how the per-assignment rows yk [T·K, D] become y = sum over K):
    - "pass": this call's rows alone (rows of id -1 count zero; with check=False, not knowing
      whether any id is -1, the sum skips them whatever: they are never read).
    - "defer": write this call's rows into workspace["yk"] and return `out` untouched: a later
      call of the same layer sums them.
    - "layer": sum every row of workspace["yk"] — this call's and the earlier "defer" calls' —
      into y / `out`: the caller vouches that together they wrote all T·K rows (each routed
      expert in exactly one call), so nothing is masked, and the layer's K rows of a token are
      summed once, as one call over all its experts sums them.
    """
    if combine not in COMBINES:
        raise StrataError(f"combine must be one of {COMBINES}, got {combine!r}")
    _check_inputs(x, topk_ids, topk_weights, experts)
    lay = experts.layout
    _check_decoders(lay)
    T, D = x.shape
    K = topk_ids.shape[1]
    F = lay.d_expert
    E = experts.n_expert
    dev = x.device
    if combine == "defer" and (not workspace or workspace.get("yk") is None):
        raise StrataError("combine='defer' keeps the rows between calls in workspace['yk']; "
                          "pass one (fp32, at least [T*K, D])")
    plan = plan_launch(T, K, E, D, F, decoded=decoded_weights(lay), device=dev,
                       schedule=schedule)
    tile = plan.tile
    BM, BN, BK = tile.BLOCK_M, tile.BLOCK_N, tile.BLOCK_K
    yk = _work(workspace, "yk", (T * K, D), torch.float32, dev)                # [T·K, D]
    if T * K == 0:
        _last[:] = [LaunchRecord(tile, 0, 0, 0, 0)]
        return _combine(yk, T, K, D, topk_ids, out, "layer" if combine == "layer" else None)
    if check:   # one sync: validates, and sizes the grid and h exactly
        grp = group_blocked(topk_ids, E, BM, slot_offset=experts.slot_offset, skip_negative=True)
        if grp.n_blocks == 0:   # nothing routed to this pass's experts
            _last[:] = [LaunchRecord(tile, 0, 0, 0, 0)]
            return _combine(yk, T, K, D, topk_ids, out, "layer" if combine == "layer" else None)
        room = grp.n_blocks
    else:       # no sync: room for the most blocks any routing makes; the kernel reads the count
        grp = group_blocked_bounded(topk_ids, E, BM, plan.max_blocks)
        room = plan.max_blocks
    n_gu = plan.tiles_gate_up(room)
    n_dn = plan.tiles_down(room)
    sk = plan.stream_k
    nbytes = plan.scratch_bytes
    if sk:
        scratch = (scratch_alloc or _default_alloc(dev))(nbytes)
        if scratch.dtype != torch.uint8 or scratch.numel() < nbytes or scratch.device != dev:
            raise StrataError(f"scratch_alloc must return a uint8 tensor of >= {nbytes} bytes on "
                              f"{dev}, got {scratch.dtype} x {scratch.numel()} on {scratch.device}")
        scratch = scratch[:nbytes].view(torch.float32)
    else:
        scratch = torch.empty(1, dtype=torch.float32, device=dev)  # never touched
    _last[:] = [LaunchRecord(tile, grp.n_blocks, n_gu if check else None,
                             n_dn if check else None, nbytes)]

    h = _work(workspace, "h", (room * BM, F), torch.bfloat16, dev)            # [Mpad, F]
    tw = topk_weights.reshape(-1).float().contiguous()                        # [T·K]
    x = x.contiguous()
    tab = device_table("iq", dev)  # the i-quant grids; read only by grid i-quant matrices
    meta = dict(TOPK=K, BM=BM, BN=BN, BK=BK, INTERP=INTERPRET)
    if not lay.plain:   # only then: the plain FFN's launches keep their constexpr set
        meta.update(BIAS=lay.bias is not None, ACT=lay.act.code)
    act = (float(lay.act.alpha), float(lay.act.limit))
    launch = dict(num_warps=tile.num_warps, num_stages=tile.num_stages)
    for mode, a, n_out, n_in, m1, m2, dst, n_tiles, b1, b2 in (
            (0, x, F, D, lay.gate, lay.up, h, n_gu, "gate", "up"),
            (1, h, D, F, lay.down, lay.down, yk, n_dn, "down", "down")):
        boff = ((lay.bias.part(b1)[0], lay.bias.part(b2)[0]) if lay.bias is not None
                else (0, 0))
        out_desc = (dst, dst.stride(0), tw, scratch)
        epi = (*boff, *act)
        _k._moe_gemm_kernel[plan.grid(n_tiles)](
            (a, a.stride(0), grp.sorted_ids, grp.block_expert, grp.n_assign),
            (experts.arena, experts.slot_offset, m1.offset, m1.row_bytes, m2.offset,
             m2.row_bytes), out_desc, tab, n_out, n_in, grp.n_blocks_dev, tile.programs, epi,
            SCHED=int(sk),
            S=_k.GemmSpec(MODE=mode, FMT1=format_traits(m1.fmt), FMT2=format_traits(m2.fmt),
                          **_k.dot_plan(m1.fmt.name, m2.fmt.name, BK, tile.dot), **meta),
            **launch)
        if sk:
            _k._moe_fixup_kernel[(tile.programs,)](
                (grp.sorted_ids, grp.block_expert, grp.n_assign), out_desc, n_out, n_in,
                grp.n_blocks_dev, tile.programs, (experts.arena, experts.slot_offset), epi,
                S=_k.FixupSpec(MODE=mode, **meta), **launch)
    if combine == "defer":
        return out if out is not None else torch.zeros(T, D, dtype=torch.bfloat16, device=dev)
    # "pass": rows of skipped assignments were never written (check=False cannot tell whether
    # there are any, so the sum skips them whatever); "layer": every row was written
    mask = combine == "pass" and (grp.n_skipped is None or grp.n_skipped > 0)
    return _combine(yk, T, K, D, topk_ids, out, "mask" if mask else "all")


def _combine(yk, T: int, K: int, D: int, topk_ids, out, rows) -> torch.Tensor:
    """y = sum over K of yk's rows: rows "all" (every row written), "mask" (rows of id -1 skip,
    never read), "layer" (all, or nothing when yk was never written: T·K = 0) or None (no rows:
    y = 0). Added into `out` (fp32) when given, else bf16 [T, D]. One read of yk, one write of y
    (strata.kernels.moe.combine); where Triton cannot run (CPU tensors without the interpreter) its
    torch reference, which gives the same bits."""
    fn = combine_rows if yk.is_cuda or INTERPRET else combine_rows_torch
    return fn(yk, T, K, D, topk_ids, out, rows)


def _work(workspace, name: str, shape: tuple[int, int], dtype, dev) -> torch.Tensor:
    """A [shape] view of workspace[name] (rows may be more than needed), or a fresh tensor."""
    if not workspace or workspace.get(name) is None:
        return torch.empty(shape, dtype=dtype, device=dev)
    buf = workspace[name]
    if (buf.dtype != dtype or buf.device != dev or buf.dim() != 2 or buf.shape[1] != shape[1]
            or buf.shape[0] < shape[0]):
        raise StrataError(f"workspace[{name!r}] is {str(buf.dtype)[6:]} {list(buf.shape)} on "
                          f"{buf.device}; this launch needs {str(dtype)[6:]} at least "
                          f"{list(shape)} on {dev}: size the layout's buffer for BLOCK_M padding")
    return buf[:shape[0]]


def dequantize_matrix(experts: ExpertSet, e: int, name: str) -> torch.Tensor:
    """Expert e's matrix `name` ("gate" | "up" | "down") as fp32 [rows, cols], decoded in torch."""
    mat = getattr(experts.layout, name)
    off = int(experts.slot_offset[e])
    if off < 0:
        raise StrataError(f"expert {e} is not resident (slot_offset = -1); load it first")
    raw = experts.arena[off + mat.offset: off + mat.offset + mat.nbytes]
    plain = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
    if mat.fmt.name in plain:
        w = raw.view(plain[mat.fmt.name])
    else:
        try:
            from strata.formats import dequantize
        except ImportError:
            raise StrataError(f"format {mat.fmt.name} needs strata.formats.dequantize, which "
                              f"this build lacks") from None
        w = dequantize(raw, mat.fmt)
    return w.float().reshape(mat.rows, mat.cols)


def expert_biases(experts: ExpertSet, e: int) -> tuple[torch.Tensor, ...] | None:
    """Expert e's fp32 (gate [F], up [F], down [D]) biases, None when the layout has none."""
    b = experts.layout.bias
    if b is None:
        return None
    off = int(experts.slot_offset[e])
    if off < 0:
        raise StrataError(f"expert {e} is not resident (slot_offset = -1); load it first")
    out = []
    for name in ("gate", "up", "down"):
        at, n = b.part(name)
        out.append(experts.arena[off + at: off + at + 4 * n].view(torch.float32).float())
    return tuple(out)


def glu(g: torch.Tensor, u: torch.Tensor, act) -> torch.Tensor:
    """h = act(g, u) (strata.blob.ExpertAct) in g's dtype: the torch twin of the GEMM's epilogue."""
    if act.name == "silu":
        return torch.nn.functional.silu(g) * u
    g = g.clamp(max=act.limit)
    u = u.clamp(min=-act.limit, max=act.limit)
    return g * torch.sigmoid(act.alpha * g) * (u + 1)


def expert_forward(xe: torch.Tensor, experts: ExpertSet, e: int, *,
                   matrix=None) -> torch.Tensor:
    """fp32 [n, D] of expert e over rows xe [n, D] (fp32): down(act(gate xe + bg, up xe + bu))
    + bd, weights decoded in torch. The one torch expert every reference runs; `matrix`
    (experts, e, name) -> fp32 [out, in] decodes a matrix (default dequantize_matrix: ggml
    blobs; strata.kernels.moe.plane passes its plane decoder)."""
    matrix = matrix or dequantize_matrix
    b = expert_biases(experts, e)
    g = xe @ matrix(experts, e, "gate").T                                 # [n, F]
    u = xe @ matrix(experts, e, "up").T
    if b is not None:
        g, u = g + b[0], u + b[1]
    y = glu(g, u, experts.layout.act) @ matrix(experts, e, "down").T      # [n, D]
    return y + b[2] if b is not None else y


def routed_sum(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, experts,
               out: torch.Tensor | None, *, matrix=None) -> torch.Tensor:
    """y [T, D] = sum over each token's routed experts (ids of -1 skipped) of the weight times
    expert_forward, in fp32; rounded to bf16 once, or added into `out` in fp32."""
    T, D = x.shape
    y = torch.zeros(T, D, dtype=torch.float32, device=x.device)
    xf = x.float()
    for e in torch.unique(topk_ids).tolist():
        if e < 0:
            continue
        tok, slot = torch.nonzero(topk_ids == e, as_tuple=True)            # [n_e]
        down = expert_forward(xf[tok], experts, e, matrix=matrix)           # [n_e, D]
        y.index_add_(0, tok, down * topk_weights[tok, slot, None].float())
    if out is not None:
        return out.add_(y)
    return y.to(torch.bfloat16)


def moe_ffn_torch(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                  experts: ExpertSet, *, schedule=None, scratch_alloc=None, out=None,
                  workspace=None, check: bool = True, combine: str = "pass") -> torch.Tensor:
    """Plain-torch reference of `moe_ffn` (same signature; schedule/scratch_alloc/workspace/
    check ignored): every product in fp32, h kept in fp32, y rounded to bf16 once at the end (or
    added into `out` in fp32). Ids of -1 are skipped. Every call adds its own rows into `out`,
    so a layer's calls sum to the same y whatever `combine` says."""
    _check_inputs(x, topk_ids, topk_weights, experts)
    return routed_sum(x, topk_ids, topk_weights, experts, out)
