"""Routing: pick each token's top-k experts, then group the T·K assignments by expert.

Legend: T tokens, E experts, K top-k, BM the GEMM's row block (BLOCK_M).

An *assignment* is one (token t, slot k) pair, flat index a = t·K + k. Grouping sorts the T·K
assignments by expert (stable, so ties keep token order) and lays them out either

- ragged: `order` [T·K] (assignments sorted by expert), `offsets` [E+1] (expert e owns
  order[offsets[e]:offsets[e+1]]), or
- block-padded for the kernel: each expert's run padded up to a multiple of BM with the sentinel
  T·K, so every BM-row block belongs to exactly one expert (`block_expert`). Experts with no
  assignments own no blocks, so the kernel launches nothing for them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from strata._backend import INTERPRET
from strata.errors import StrataError
from strata.kernels.moe import _group_kernel as _g


def topk_route(logits: torch.Tensor, k: int, *, renormalize: bool = True):
    """Softmax over experts, then top-k (Qwen3-MoE / Mixtral order).

    logits [T, E] -> (topk_ids int64 [T, K], topk_weights fp32 [T, K]). With `renormalize` the K
    weights of each token sum to 1 (Qwen3-MoE's norm_topk_prob, Mixtral); without, they are the
    raw softmax probabilities.
    """
    if logits.dim() != 2:
        raise StrataError(f"router logits must be [T, E], got shape {tuple(logits.shape)}")
    n_expert = logits.shape[1]
    if not 1 <= k <= n_expert:
        raise StrataError(f"top-k must be between 1 and E={n_expert}, got {k}")
    probs = torch.softmax(logits.float(), dim=-1)                  # [T, E]
    weights, ids = torch.topk(probs, k, dim=-1)                    # [T, K]
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return ids, weights.float()


def routed_mask(topk_ids: torch.Tensor, n_expert: int) -> torch.Tensor:
    """bool [E]: the experts some assignment routes to (ids of -1, another pass's, ignored).
    No device sync: a scatter of a scalar (not bincount or boolean indexing; nor `hit[idx] =
    True`, whose Python value goes up as a pageable one-element copy the host waits for)."""
    flat = topk_ids.reshape(-1).long()
    hit = torch.zeros(n_expert + 1, dtype=torch.bool, device=flat.device)
    hit.scatter_(0, torch.where(flat < 0, n_expert, flat), True)
    return hit[:n_expert]


def check_topk_ids(topk_ids: torch.Tensor, n_expert: int) -> None:
    if topk_ids.dim() != 2:
        raise StrataError(f"topk_ids must be [T, K], got shape {tuple(topk_ids.shape)}")
    if topk_ids.dtype.is_floating_point or topk_ids.dtype == torch.bool:
        raise StrataError(f"topk_ids must be an integer tensor, got {topk_ids.dtype}")


@dataclass(frozen=True)
class Ragged:
    """Assignments sorted by expert. order[i] = flat assignment index; inverse[a] = its position."""
    order: torch.Tensor    # int64 [T·K]
    inverse: torch.Tensor  # int64 [T·K]
    counts: torch.Tensor   # int64 [E]
    offsets: torch.Tensor  # int64 [E+1], offsets[0] = 0, offsets[E] = T·K


def group_ragged(topk_ids: torch.Tensor, n_expert: int) -> Ragged:
    """Sort the T·K assignments by expert (stable). No device sync."""
    check_topk_ids(topk_ids, n_expert)
    flat = topk_ids.reshape(-1).long()                               # [T·K]
    order = torch.sort(flat, stable=True).indices                    # [T·K]
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    # scatter_add, not bincount: CUDA's bincount syncs to size its output from the max id
    counts = torch.zeros(n_expert, dtype=torch.int64, device=flat.device).scatter_add_(
        0, flat, torch.ones_like(flat))                              # [E]
    offsets = torch.zeros(n_expert + 1, dtype=torch.int64, device=flat.device)
    offsets[1:] = torch.cumsum(counts, 0)
    return Ragged(order, inverse, counts, offsets)


@dataclass(frozen=True)
class Blocked:
    """The kernel's view: BM-row blocks, one expert each. Padding rows hold the sentinel T·K.

    From `group_blocked` every field is exact (the host read the counts). From
    `group_blocked_bounded` the layout is sized for `max_blocks` blocks and the counts stay on the
    device: n_blocks and n_skipped are None, block_expert reads E past the last real block, and
    `n_blocks_dev` (int32 [1]) is what the kernel reads."""
    sorted_ids: torch.Tensor     # int32 [n_blocks·BM]: flat assignment index, or T·K = padding
    block_expert: torch.Tensor   # int32 [n_blocks]
    counts: torch.Tensor         # int64 [E]
    padded_offsets: torch.Tensor  # int64 [E+1]: first row of expert e's blocks
    n_blocks: int | None
    block_m: int
    n_assign: int                # T·K (the sentinel)
    n_skipped: int | None = 0    # assignments with id -1 (another pass's), in no block
    n_blocks_dev: torch.Tensor | None = None   # int32 [1]: n_blocks, on the device


def _counts(topk_ids: torch.Tensor, n_expert: int, block_m: int, skip_negative: bool):
    """(ids with -1 moved to bucket E and others clamped, Ragged over E + 1 buckets, blocks per
    expert [E], padded offsets [E+1], ids out of range (device scalar)). No device sync."""
    if block_m < 1:
        raise StrataError(f"block_m must be positive, got {block_m}")
    check_topk_ids(topk_ids, n_expert)
    low = -1 if skip_negative else 0
    out_of_range = ((topk_ids < low) | (topk_ids >= n_expert)).sum()
    # skipped assignments go to an extra bucket E that owns no blocks; clamping keeps the
    # grouping valid until a check reports ids out of range
    ids = torch.where(topk_ids < 0, n_expert, topk_ids.clamp(0, n_expert - 1))
    rag = group_ragged(ids, n_expert + 1)
    blocks_per = (rag.counts[:n_expert] + block_m - 1) // block_m              # [E]
    padded_offsets = torch.zeros(n_expert + 1, dtype=torch.int64, device=rag.order.device)
    padded_offsets[1:] = torch.cumsum(blocks_per, 0) * block_m
    return ids, rag, blocks_per, padded_offsets, out_of_range


def _lay_out(ids, rag: Ragged, blocks_per, padded_offsets, n_expert: int, block_m: int,
             n_blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted_ids int32 [n_blocks·BM], block_expert int32 [n_blocks]) for room of n_blocks
    blocks (at least the real count): rows past the real blocks hold the sentinel T·K and their
    blocks read expert E. Skipped assignments (bucket E) land in a spare row past the end. No sync.
    """
    dev = rag.order.device
    n_assign = rag.order.numel()
    rows = n_blocks * block_m
    # position of the i-th sorted assignment: its expert's padded start + rank inside the expert
    sorted_expert = ids.reshape(-1).long()[rag.order]                          # [T·K]
    rank = torch.arange(n_assign, device=dev) - rag.offsets[sorted_expert]
    pos = padded_offsets[sorted_expert.clamp(max=n_expert - 1)] + rank
    pos = torch.where(sorted_expert == n_expert, rows, pos)                   # skipped: spare row
    sorted_ids = torch.full((rows + 1,), n_assign, dtype=torch.int32, device=dev)
    sorted_ids[pos] = rag.order.to(torch.int32)
    # block b belongs to the first expert whose cumulative block count passes b (as
    # repeat_interleave(arange(E), blocks_per) lays them out, without its output-size sync)
    cum = torch.cumsum(blocks_per, 0)                                          # [E]
    block_expert = torch.searchsorted(cum, torch.arange(n_blocks, device=dev, dtype=cum.dtype),
                                      right=True).to(torch.int32)             # [n_blocks]
    return sorted_ids[:rows], block_expert


def group_blocked(topk_ids: torch.Tensor, n_expert: int, block_m: int, *,
                  slot_offset: torch.Tensor | None = None, align: int = 256,
                  skip_negative: bool = False) -> Blocked:
    """Group by expert, each expert's rows padded to a multiple of `block_m`.

    Syncs with the device once (the block count sizes the layout). When `slot_offset` [E] is
    given, the same sync also checks that every routed expert is resident (slot_offset >= 0) and
    raises StrataError naming the missing experts otherwise, and that their blobs start `align`-byte
    aligned: the checks ride on the one round trip. (`group_blocked_bounded` is the sync-free
    twin for callers that vouch for these.)

    `skip_negative`: an id of -1 marks an assignment outside this pass (the streaming engine runs a
    layer in batches of experts); it joins no block, and `n_skipped` counts it.
    """
    ids, rag, blocks_per, padded_offsets, out_of_range = _counts(topk_ids, n_expert, block_m,
                                                                 skip_negative)
    dev = rag.order.device
    counts = rag.counts[:n_expert]                                    # [E]
    # the one sync: total blocks, ids out of range, routed-but-absent and misaligned experts
    zero = torch.zeros((), dtype=torch.int64, device=dev)
    if slot_offset is not None:
        so = slot_offset.to(dev)
        missing = ((counts > 0) & (so < 0)).sum()
        misaligned = ((counts > 0) & (so >= 0) & (so % align != 0)).sum()
    else:
        missing = misaligned = zero
    n_blocks, n_bad, n_missing, n_misaligned, n_skipped = torch.stack(
        [blocks_per.sum(), out_of_range.to(dev), missing, misaligned, rag.counts[n_expert]]).tolist()
    if n_misaligned:
        raise StrataError(f"{n_misaligned} routed experts have a slot_offset that is not a "
                          f"multiple of {align} bytes; blobs must start {align}-byte aligned "
                          f"in the arena (the kernel's vector loads rely on it)")
    if n_bad:
        raise StrataError(f"{n_bad} entries of topk_ids lie outside [0, {n_expert}); "
                          f"expert ids must index the layer's E={n_expert} experts")
    if n_missing:
        absent = torch.nonzero((counts > 0) & (slot_offset.to(dev) < 0)).flatten().tolist()
        raise StrataError(f"experts {absent} are routed to but not resident (slot_offset = -1); "
                          f"load them into the arena before running the layer")
    sorted_ids, block_expert = _lay_out(ids, rag, blocks_per, padded_offsets, n_expert, block_m,
                                        n_blocks)
    n_dev = torch.full((1,), n_blocks, dtype=torch.int32, device=dev)
    return Blocked(sorted_ids, block_expert, counts, padded_offsets, n_blocks, block_m,
                   rag.order.numel(), n_skipped, n_dev)


def group_blocked_bounded(topk_ids: torch.Tensor, n_expert: int, block_m: int,
                          max_blocks: int, *, skip_negative: bool = True) -> Blocked:
    """`group_blocked` without the host: the layout has room for `max_blocks` blocks (an upper
    bound for any routing: strata.kernels.moe.tiles.LaunchPlan.max_blocks), the block count stays on
    the device (`n_blocks_dev`), and nothing is checked — the caller vouches that the ids lie in
    [-1, E) and that every routed expert is resident and aligned (the streaming engine builds its
    slot tables on the host, where it checks them). No device sync.

    Where Triton runs (CUDA, the interpreter) three launches do it
    (strata.kernels.moe._group_kernel):
    the ~30 torch ops of `group_blocked_bounded_torch` took 0.6 ms of the host's time a call, more
    than the device's whole FFN at T = 512 (benchmarks/host_profile.py, 1e97cc7). Same fields,
    same values (sorted_ids holds exactly max_blocks·BM rows)."""
    if not (topk_ids.is_cuda or INTERPRET) or topk_ids.numel() == 0:
        return group_blocked_bounded_torch(topk_ids, n_expert, block_m, max_blocks,
                                           skip_negative=skip_negative)
    if block_m < 1:
        raise StrataError(f"block_m must be positive, got {block_m}")
    check_topk_ids(topk_ids, n_expert)
    dev = topk_ids.device
    ids = topk_ids.reshape(-1)
    if not ids.is_contiguous():
        ids = ids.contiguous()
    n, E = ids.numel(), n_expert
    rows = max_blocks * block_m
    C = min(1024, triton.next_power_of_2(max(n, 16)))
    P = max(1, triton.cdiv(n, C))
    NB = triton.next_power_of_2(E + 2)
    i32 = torch.empty(P * NB + max_blocks + 1, dtype=torch.int32, device=dev)
    hist, block_expert, n_dev = i32[:P * NB], i32[P * NB:-1], i32[-1:]
    i64 = torch.empty(2 * E + 1, dtype=torch.int64, device=dev)
    counts, padded = i64[:E], i64[E:]
    sorted_ids = torch.empty(rows, dtype=torch.int32, device=dev)
    _g._group_count_kernel[(P,)](ids, n, E, hist, sorted_ids, rows, triton.cdiv(rows, P),
                                 C=C, NB=NB, num_warps=4)
    _g._group_scan_kernel[(1,)](hist, P, E, block_m, max_blocks, counts, padded, block_expert,
                                n_dev, NB=NB, BB=max(16, 8192 // NB), num_warps=8,
                                PC=min(max(1, 8192 // NB), triton.next_power_of_2(P)))
    _g._group_place_kernel[(P,)](ids, n, E, hist, padded, sorted_ids, C=C, NB=NB, num_warps=4)
    return Blocked(sorted_ids, block_expert, counts, padded, None, block_m, n, None, n_dev)


def group_blocked_bounded_torch(topk_ids: torch.Tensor, n_expert: int, block_m: int,
                                max_blocks: int, *, skip_negative: bool = True) -> Blocked:
    """Plain-torch twin of `group_blocked_bounded` (same signature and fields)."""
    ids, rag, blocks_per, padded_offsets, _ = _counts(topk_ids, n_expert, block_m, skip_negative)
    sorted_ids, block_expert = _lay_out(ids, rag, blocks_per, padded_offsets, n_expert, block_m,
                                        max_blocks)
    n_dev = blocks_per.sum().to(torch.int32).reshape(1)
    return Blocked(sorted_ids, block_expert, rag.counts[:n_expert], padded_offsets, None,
                   block_m, rag.order.numel(), None, n_dev)
