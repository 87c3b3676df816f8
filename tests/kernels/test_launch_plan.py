"""The expert GEMM's launch plan (strata.kernels.moe.tiles.plan_launch) is what the launcher does
and what the engine reserves: one count.

- moe_ffn launches exactly the plan's tile and asks for exactly its scratch bytes;
- the engine's slab reserve (strata.engine.scratch) equals the size classes of what the launches
  ask for, for quantized weights too (the reserve once built its tile without `decoded` and
  planned BLOCK_N 128 where the kernel took 64: twice the scratch);
- the workspace rows (TKP) bound every routing's padded rows, the blocks bound the grid.
"""
import pytest
import torch
from hypothesis import example, given, settings, strategies as st

from strata.planning import scratch_bytes_for, slab_reserve
from strata.kernels import moe_ffn, topk_route
from strata.kernels.moe.ffn import decoded_weights, last_launch
from strata.kernels.moe.grouping import group_blocked
from strata.kernels.moe.random_experts import random_expert_set
from strata.kernels.moe.tiles import block_m_for, padded_rows, pin_tile, plan_launch
from strata.memory.pool import size_class
from strata.shapes import ModelShape


class _Recorder:
    """A scratch_alloc that records what each launch asks for."""

    def __init__(self, device="cpu"):
        self.asked = []
        self.device = device

    def __call__(self, nbytes):
        self.asked.append(int(nbytes))
        return torch.empty(int(nbytes), dtype=torch.uint8, device=self.device)


def test_slab_reserve_equals_what_the_quantized_launch_asks_for():
    """Q8_0 experts, T = 72 tokens over E = 4 (36 rows an expert: BLOCK_M 64, where BF16 weights
    take BLOCK_N 128 and decoded ones 64), only the schedule pinned: the reserve is the class of
    the bytes moe_ffn requested, not twice that."""
    E, K, D, F, T = 4, 2, 64, 64, 72
    shape = ModelShape(d_model=D, n_expert=E, top_k=K, d_expert=F)
    experts = random_expert_set(E, D, F, "Q8_0", seed=3)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, D, generator=g).to(torch.bfloat16)
    ids, w = topk_route(torch.randn(T, E, generator=g), K)
    rec = _Recorder()
    with pin_tile(schedule="stream_k", programs=3):
        moe_ffn(x, ids, w, experts, scratch_alloc=rec)
        dec = decoded_weights(experts.layout)
        assert dec
        plan = plan_launch(T, K, E, D, F, decoded=dec, device="cpu")
        reserve = slab_reserve(shape, T, T, "cpu", decoded=dec)
        one = scratch_bytes_for(shape, T, "cpu", decoded=dec)
    assert last_launch().tile == plan.tile and plan.tile.BLOCK_N == 64
    assert rec.asked == [plan.scratch_bytes] == [last_launch().scratch_bytes] == [one]
    assert reserve == size_class(rec.asked[0])


def test_slab_reserve_counts_each_kind_of_layer():
    """Layers of BF16 and of quantized weights take different tiles: one class for each."""
    shape = ModelShape(d_model=64, n_expert=4, top_k=2, d_expert=64)
    with pin_tile(schedule="stream_k", programs=3):
        q = slab_reserve(shape, 72, 72, "cpu", decoded=True)
        b = slab_reserve(shape, 72, 72, "cpu", decoded=False)
        both = slab_reserve(shape, 72, 72, "cpu", decoded={True, False})
    assert b == 2 * q                        # BLOCK_N 128 vs 64
    assert both > b


@settings(max_examples=60, deadline=None)
@given(T=st.integers(0, 300), K=st.integers(1, 8), E=st.integers(1, 64),
       D=st.sampled_from([64, 128, 2048]), F=st.sampled_from([32, 64, 768]),
       decoded=st.booleans(), seed=st.integers(0, 2**16))
@example(T=1, K=1, E=1, D=64, F=32, decoded=False, seed=0)      # one row, one expert
@example(T=300, K=8, E=2, D=64, F=32, decoded=True, seed=0)     # every expert far over BLOCK_M
@example(T=0, K=2, E=4, D=64, F=32, decoded=True, seed=0)       # an empty chunk
def test_plan_bounds_every_routing(T, K, E, D, F, decoded, seed):
    """For any routing of T tokens: the padded rows group_blocked lays out fit the plan's h_rows
    (TKP), its blocks fit max_blocks, and with no pin BLOCK_M is block_m_for's (the layout's)."""
    K = min(K, E)
    plan = plan_launch(T, K, E, D, F, decoded=decoded, n_sms=132)
    bm = plan.tile.BLOCK_M
    assert bm == block_m_for(T, K, E)
    assert plan.h_rows == padded_rows(T, K, E, bm) and plan.yk_rows == T * K
    if T == 0:
        return
    g = torch.Generator().manual_seed(seed)
    # skewed routing: a few experts take most tokens (the worst case for padding is spread)
    logits = torch.randn(T, E, generator=g) * torch.rand(E, generator=g) * 4
    ids, _ = topk_route(logits, K)
    grp = group_blocked(ids, E, bm)
    assert grp.n_blocks * bm <= plan.h_rows
    assert grp.n_blocks <= plan.max_blocks
    assert plan.grid(plan.tiles_gate_up(grp.n_blocks)) == (
        (plan.tile.programs,) if plan.stream_k else (grp.n_blocks * -(-F // plan.tile.BLOCK_N),))


def test_plan_follows_the_pin():
    with pin_tile(schedule="stream_k", programs=5, BLOCK_M=32, dot="decode"):
        p = plan_launch(8, 2, 4, 64, 32, decoded=True, device="cpu")
    assert (p.tile.schedule, p.tile.programs, p.tile.BLOCK_M, p.tile.dot) == (
        "stream_k", 5, 32, "decode")
    assert p.scratch_bytes == 2 * 5 * 2 * 32 * p.tile.BLOCK_N * 4
    assert p.h_rows == padded_rows(8, 2, 4, 32)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["BF16", "Q8_0", "Q4_K"])
def test_launch_asks_for_the_planned_scratch_gpu(fmt):
    """On the device (its SM count, its heuristic tile; stream-k forced): what moe_ffn asks
    for is scratch_bytes_for's count, for plain and quantized weights alike."""
    dev = torch.device("cuda")
    E, K, D, F, T = 8, 2, 256, 256, 300
    shape = ModelShape(d_model=D, n_expert=E, top_k=K, d_expert=F)
    experts = random_expert_set(E, D, F, fmt, device=dev, seed=1)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(T, D, generator=g).to(torch.bfloat16).to(dev)
    ids, w = topk_route(torch.randn(T, E, generator=g).to(dev), K)
    rec = _Recorder(dev)
    with pin_tile(schedule="stream_k"):
        moe_ffn(x, ids, w, experts, scratch_alloc=rec)
        want = scratch_bytes_for(shape, T, dev, decoded=decoded_weights(experts.layout))
    assert rec.asked == [want] == [last_launch().scratch_bytes]
