"""The prompt layout and the carve: one description, executed and read (SPEC "Carve")."""
import pytest
import torch
from hypothesis import example, given, strategies as st

from strata.errors import StrataError
from strata.memory import Buf, Carve
from strata.planning import ACTIVATIONS, prompt_layout
from strata.memory.carve import ALIGN, may_alias
from strata.shapes import ModelShape, get_preset

shapes = st.builds(
    lambda D, E, K, F, H, Hkv, hd: ModelShape(d_model=D, n_expert=E, top_k=min(K, E),
                                             d_expert=F, n_head=H, n_kv_head=Hkv, head_dim=hd),
    D=st.integers(1, 96), E=st.integers(1, 40), K=st.integers(1, 10), F=st.integers(1, 64),
    H=st.integers(1, 8), Hkv=st.integers(1, 4), hd=st.integers(1, 32))
SMALL = ModelShape(d_model=24, n_expert=6, top_k=2, d_expert=8, n_head=2, n_kv_head=1, head_dim=4)
# D < H*hd and D > H*hd flip which phase is the longer one: the union must follow either.
WIDE_Q = ModelShape(d_model=8, n_expert=4, top_k=1, d_expert=4, n_head=8, n_kv_head=8, head_dim=16)


@given(shape=shapes, max_blob=st.integers(1, 5000), ring=st.integers(0, 40),
       t1=st.integers(1, 3000), t2=st.integers(1, 3000))
@example(shape=SMALL, max_blob=1, ring=0, t1=1, t2=2)             # smallest step of T
@example(shape=WIDE_Q, max_blob=256, ring=3, t1=255, t2=256)      # attention phase dominates
def test_bytes_needed_monotone_in_T(shape, max_blob, ring, t1, t2):
    lay = prompt_layout(shape, max_blob)
    lo, hi = sorted((t1, t2))
    assert lay.bytes_needed(lo, ring) <= lay.bytes_needed(hi, ring)


@given(shape=shapes, max_blob=st.integers(1, 3000), ring=st.integers(0, 6), T=st.integers(1, 300))
@example(shape=SMALL, max_blob=1_000, ring=0, T=577)   # odd T, no ring
@example(shape=WIDE_Q, max_blob=257, ring=2, T=1)      # max_blob one past a boundary: stride 512
def test_carve_uses_exactly_bytes_needed(shape, max_blob, ring, T):
    """The real carve's stop IS bytes_needed (the seed's bug was a count off the carve)."""
    lay = prompt_layout(shape, max_blob)
    need = lay.bytes_needed(T, ring)
    buf = torch.zeros(need, dtype=torch.uint8)
    out = lay.carve(Carve(buf), T, ring)
    assert out.stop == need
    # Views are real views into the buffer, with the dtype and shape the spec names.
    base = buf.data_ptr()
    for b in ACTIVATIONS.persistent + tuple(x for p in ACTIVATIONS.phases for x in p.bufs):
        v = out[b.name]
        assert v.dtype == b.dtype and v.untyped_storage().data_ptr() == base
    assert out.ring.shape == (ring, lay.slot_stride)
    # One byte less does not fit: the carve refuses, clearly.
    if need > 0:
        with pytest.raises(StrataError, match="carve: buffer .* needs"):
            lay.carve(Carve(torch.zeros(need - 1, dtype=torch.uint8)), T, ring)


@given(shape=shapes, max_blob=st.integers(1, 3000), ring=st.integers(0, 6), T=st.integers(1, 300),
       spare=st.integers(0, 4096))
@example(shape=SMALL, max_blob=1, ring=1, T=1, spare=0)
def test_carve_views_disjoint_aligned_inside(shape, max_blob, ring, T, spare):
    lay = prompt_layout(shape, max_blob)
    cap = lay.bytes_needed(T, ring) + spare
    buf = torch.zeros(cap, dtype=torch.uint8)
    c = Carve(buf)
    out = lay.carve(c, T, ring)
    ps = out.placements
    for p in ps:
        assert p.offset % ALIGN == 0 and 0 <= p.offset and p.end <= cap
    for i, a in enumerate(ps):
        for b in ps[i + 1:]:
            if a.nbytes and b.nbytes and not may_alias(a, b):
                assert a.end <= b.offset or b.end <= a.offset, (a, b)
    # Writing every view through torch touches only its own bytes (views are honest).
    for name, v in out.bufs.items():
        p = next(q for q in ps if q.name == name)
        assert v.data_ptr() - buf.data_ptr() == p.offset
        assert v.numel() * v.element_size() == p.nbytes
    tail = c.tail()
    assert tail.nbytes == cap - min((c.stop + ALIGN - 1) // ALIGN * ALIGN, cap)
    assert tail.address == buf.data_ptr() + cap - tail.nbytes


def test_phases_share_bytes_and_the_union_takes_the_longest():
    lay = prompt_layout(get_preset("qwen3-30b-a3b"), 5_013_504)
    ps = {p.name: p for p in lay.placements(4096, 0)}
    assert ps["q"].offset == ps["router_logits"].offset       # attention and moe alias
    longest = max(max(p.end for p in ps.values() if p.group and p.group[0][1] == ph)
                  for ph in (0, 1))
    assert lay.bytes_needed(4096, 0) == longest


def test_ring_adds_exactly_one_stride_per_slot():
    lay = prompt_layout(SMALL, 1000)
    assert lay.slot_stride == 1024
    assert lay.bytes_needed(300, 5) - lay.bytes_needed(300, 0) == 5 * 1024
    assert lay.ring_bytes(5) == 5 * 1024


def test_layout_is_extensible_and_the_count_follows():
    lay = prompt_layout(SMALL, 512)
    spec = ACTIVATIONS.with_buffer(Buf("gate_up", torch.bfloat16, ("TK", "F")), phase="moe")
    lay2 = prompt_layout(SMALL, 512, spec=spec)
    assert lay2.bytes_needed(1000, 0) > lay.bytes_needed(1000, 0)
    buf = torch.zeros(lay2.bytes_needed(1000, 0), dtype=torch.uint8)
    assert lay2.carve(Carve(buf), 1000, 0)["gate_up"].shape == (2000, 8)
    with pytest.raises(StrataError, match="already has"):
        ACTIVATIONS.with_buffer(Buf("x", torch.bfloat16, ("T", "D")))


def test_dry_carve_has_no_tail():
    with pytest.raises(StrataError, match="dry"):
        Carve.dry().tail()
