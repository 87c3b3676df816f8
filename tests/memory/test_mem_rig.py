"""A rig turned into participants: layer split, dense weights, the derived cache size."""
import pytest
from hypothesis import example, given, strategies as st

from strata.errors import StrataError
from strata.memory.rig import RESERVE, budgets, participants, split_layers
from strata.planning import layer_dense_bytes, model_sizes
from strata.shapes import get_preset

Q30 = get_preset("qwen3-30b-a3b")


@given(n_layer=st.integers(1, 100), vram=st.lists(st.integers(1, 100), min_size=1, max_size=8))
@example(n_layer=30, vram=[8, 8, 6, 6])   # the seeds' 5060/5060/3060/3060 style split
@example(n_layer=3, vram=[1, 100, 1])     # a tiny card still gets a layer
def test_split_layers_covers_every_layer_once(n_layer, vram):
    if len(vram) > n_layer:
        with pytest.raises(StrataError, match="layers to split"):
            split_layers(n_layer, vram)
        return
    ranges = split_layers(n_layer, vram)
    assert [l for r in ranges for l in r] == list(range(n_layer))
    assert all(len(r) >= 1 for r in ranges)


def test_cache_is_vram_minus_dense_minus_reserve():
    (b,) = budgets(model_sizes(Q30), [12 << 30])
    emb = Q30.vocab * Q30.d_model * 2
    assert b.dense == 48 * layer_dense_bytes(Q30) + 2 * emb + Q30.d_model * 2
    assert b.cache == (12 << 30) - b.dense - RESERVE
    (c,) = budgets(model_sizes(Q30), [12 << 30], cache=1 << 30)
    assert c.cache == 1 << 30


def test_participants_hold_only_their_own_layers():
    parts, bud = participants(model_sizes(Q30), [5_013_504] * 48, [12 << 30, 12 << 30])
    for p, b in zip(parts, bud):
        assert {layer for layer, _ in p.cache.slot_owner} <= set(b.layers)
        assert p.cache.nbytes <= b.cache


def test_dense_overflow_is_clear():
    with pytest.raises(StrataError, match="no room for an expert cache"):
        budgets(model_sizes(get_preset("qwen3-235b-a22b")), [8 << 30])


@given(dense=st.lists(st.integers(0, 1 << 30), min_size=2, max_size=12),
       scratch=st.lists(st.integers(0, 1 << 30), min_size=12, max_size=12),
       first=st.integers(0, 1 << 30), last=st.integers(0, 1 << 30),
       vram=st.lists(st.integers(1, 4), min_size=1, max_size=3))
def test_a_gpu_counts_its_layers_blocks_and_one_layers_decode(dense, scratch, first, last,
                                                              vram):
    """Each GPU's dense bytes: its layers' weights, the largest decode scratch among its own
    layers (a layer's blocks decoded for its turn, one layer at a time), the embeddings on the
    first GPU and the head on the last; nothing counted twice or dropped."""
    from strata.memory.sizes import Sizes
    n = len(dense)
    if len(vram) > n:
        return
    z = Sizes(n_layer=n, n_expert=8, top_k=2, dims=lambda *a: {}, kv_bytes=lambda t, l: 0,
              dense_layers=tuple(dense), dense_scratch=tuple(scratch[:n]), dense_first=first,
              dense_last=last)
    bud = budgets(z, [v << 40 for v in vram])
    for i, b in enumerate(bud):
        own = list(b.layers)
        assert b.dense == (sum(dense[l] for l in own) + max(scratch[l] for l in own)
                           + (first if i == 0 else 0) + (last if i == len(bud) - 1 else 0))
    assert sum(b.dense for b in bud) <= sum(dense) + len(bud) * max(scratch[:n]) + first + last
