"""The @triton.jit kernels behind strata.kernels.moe.grouping.group_blocked_bounded: the expert
grouping in three launches instead of some thirty torch ops (the launcher and its torch twin live
there).

Legend: n = T·K assignments (flat index a = t·K + k), E experts, BM the GEMM's row block, C
assignments a chunk (one program), NB buckets (a power of two >= E + 2: experts 0..E-1, E for
skipped assignments (id < 0), NB - 1 for a chunk's padding lanes), P chunks.

    count:  hist[p, b]  = #assignments of chunk p in bucket b; sorted_ids[...] = n (the sentinel)
    scan:   before[p, b] = sum over p' < p of hist[p', b] (in place of hist); counts, padded
            offsets, block_expert and the block count, all from the column sums
    place:  sorted_ids[padded[b] + before[p, b] + rank of a among chunk p's bucket-b lanes] = a

Ranks inside a chunk come from sorting the keys b·C + lane (unique, so the sort is stable in the
lane), so every expert's rows keep assignment order: torch.sort(stable=True)'s layout.
"""
import triton
import triton.language as tl


@triton.jit
def _bucket(ids_ptr, a, n, E, NB: tl.constexpr):
    """int32 bucket of assignments a: its expert (ids >= E clamp to E - 1), E for an id < 0,
    NB - 1 past the n assignments."""
    v = tl.load(ids_ptr + a, mask=a < n, other=0).to(tl.int32)
    b = tl.where(v < 0, E, tl.minimum(v, E - 1))
    return tl.where(a < n, b, NB - 1)


@triton.jit
def _group_count_kernel(ids_ptr, n, E, hist_ptr, sorted_ptr, rows, fill_per,
                        C: tl.constexpr, NB: tl.constexpr):
    """Program p: chunk p's bucket histogram into hist[p, :], and rows [p·fill_per,
    (p+1)·fill_per) of sorted_ids set to the sentinel n."""
    p = tl.program_id(0)
    lane = tl.arange(0, C)
    b = _bucket(ids_ptr, p * C + lane, n, E, NB)
    tl.store(hist_ptr + p * NB + tl.arange(0, NB), tl.histogram(b, NB))
    start = p * fill_per
    for r0 in range(0, fill_per, C):
        r = start + r0 + lane
        tl.store(sorted_ptr + r, tl.full((C,), 0, tl.int32) + n,
                 mask=(r < rows) & (r0 + lane < fill_per))


@triton.jit
def _group_scan_kernel(hist_ptr, n_chunks, E, BM, max_blocks, counts_ptr, padded_ptr,
                       block_expert_ptr, n_dev_ptr, NB: tl.constexpr, PC: tl.constexpr,
                       BB: tl.constexpr):
    """One program: hist [P, NB] -> the exclusive prefix over chunks (in place), counts [E]
    (int64), padded offsets [E + 1] (int64, each expert's run rounded up to BM rows),
    block_expert [max_blocks] (int32: the expert owning block b; E past the last block) and
    n_dev [1] (int32: the block count)."""
    e = tl.arange(0, NB)
    running = tl.zeros((NB,), tl.int32)
    for p0 in range(0, n_chunks, PC):
        p = p0 + tl.arange(0, PC)
        ptrs = hist_ptr + p[:, None] * NB + e[None, :]
        m = (p < n_chunks)[:, None]
        h = tl.load(ptrs, mask=m, other=0)                                  # [PC, NB]
        tl.store(ptrs, tl.cumsum(h, 0) - h + running[None, :], mask=m)
        running += tl.sum(h, 0)
    expert = e < E
    tl.store(counts_ptr + e, running.to(tl.int64), mask=expert)
    blocks = tl.where(expert, (running + BM - 1) // BM, 0)                  # [NB]
    cum = tl.cumsum(blocks, 0)
    tl.store(padded_ptr + e, ((cum - blocks) * BM).to(tl.int64), mask=e <= E)
    tl.store(n_dev_ptr, tl.sum(blocks, 0))
    for b0 in range(0, max_blocks, BB):
        blk = b0 + tl.arange(0, BB)
        owner = tl.sum(((cum[None, :] <= blk[:, None]) & expert[None, :]).to(tl.int32), 1)
        tl.store(block_expert_ptr + blk, owner, mask=blk < max_blocks)


@triton.jit
def _group_place_kernel(ids_ptr, n, E, hist_ptr, padded_ptr, sorted_ptr, C: tl.constexpr,
                        NB: tl.constexpr):
    """Program p: each of chunk p's assignments to an expert written into its row of
    sorted_ids (padded offset + the earlier chunks' count + its rank in the chunk)."""
    p = tl.program_id(0)
    lane = tl.arange(0, C)
    b = _bucket(ids_ptr, p * C + lane, n, E, NB)
    h = tl.histogram(b, NB)
    first = tl.cumsum(h, 0) - h                                             # [NB]
    key = tl.sort(b * C + lane)                                             # [C] by bucket
    bs = key // C
    rank = lane - tl.gather(first, bs, 0)
    live = bs < E
    base = (tl.load(padded_ptr + bs, mask=live, other=0).to(tl.int32)
            + tl.load(hist_ptr + p * NB + bs, mask=live, other=0))
    tl.store(sorted_ptr + base + rank, p * C + key % C, mask=live)
