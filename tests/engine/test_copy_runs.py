"""Runs of adjacent blobs go to the ring as one copy (StreamingProvider._run_end).

A run carries the same layer's next experts from one block of host memory into ring slots that
fill whole: fewer host calls a read, the same bytes in the same slots. The invariants:
- the read is the same bit for bit with runs and without (STRATA_COPY_RUNS=0);
- every blob is still copied once (ChunkStats.copies), in fewer copies (copy_ops);
- a run never wraps the ring nor crosses into another pass's copies (a pass waits for its
  last copy only), nor mixes layers;
- a layer whose blobs are smaller than a ring slot (a mixed pack's) packs them back to back from
  a group's first slot (StreamingProvider._ring_offsets), so they run too; every blob's bytes lie
  in the slots of its own pass's entries at or before its own (whose previous readers the copy's
  slot event orders), inside the ring.
Rings of 3 (one expert a pass), 5, 6 and 8 (a whole layer a pass) slots, stream and stage mode.
"""
import pytest
from hypothesis import given, settings, strategies as st
import torch

from strata.engine.observe import EngineObserver
from strata.engine.prefill import EngineConfig, PrefillEngine
from strata.engine.provider import StreamingProvider
from strata.packs import Pack
from strata.packs.synth import ExpertFormats, synth_pack
from strata.shapes import get_preset

SHAPE = get_preset("tiny")     # L=2, D=64, E=8, K=2, F=32


@pytest.fixture(scope="module")
def uniform(tmp_path_factory):
    return synth_pack(tmp_path_factory.mktemp("u") / "u.pack", SHAPE,
                      [ExpertFormats.of("Q8_0")] * SHAPE.n_layer, progress=False)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    # layer 0's blob is smaller than max_blob (the ring slot): no runs there
    fmts = [ExpertFormats.of("Q4_0"), ExpertFormats.of("Q8_0")]
    return synth_pack(tmp_path_factory.mktemp("m") / "m.pack", SHAPE, fmts, progress=False)


class Copies(EngineObserver):
    def __init__(self):
        self.runs = []        # (layer, first expert, blobs, bytes)

    def on_copy(self, part, layer, expert, nbytes, start, done, count=1):
        self.runs.append((layer, expert, count, nbytes))


def read(pack, ring, *, runs: bool, monkeypatch, chunk=16, stage=False, slots=16):
    """One streamed read; returns (result, the observer's copies, the runs _run_end cut, the
    max_blob). Every run is checked against the provider's passes as it is cut."""
    monkeypatch.setenv("STRATA_COPY_RUNS", "1" if runs else "0")
    if stage:
        monkeypatch.setenv("STRATA_STREAM_ALL_MIN", "1000")
    else:
        monkeypatch.delenv("STRATA_STREAM_ALL_MIN", raising=False)
    blob = Pack.open(pack).max_blob
    cut = []
    real_run_end = StreamingProvider._run_end

    def checked(self, i, limit, nbytes):
        j = real_run_end(self, i, limit, nbytes)
        layer, e = self.queue[i]
        # the passes' own spans: a pass waits for the copy of its last queue entry
        ends = {span[1] for _, spans in self.pass_tables.values() for span in spans if span}
        assert i < j <= limit and not any(k in ends for k in range(i + 1, j)), (i, j, ends)
        assert i % self.R + (j - i) <= self.R, "a run wraps the ring"
        assert self.queue[i:j] == [(layer, e + k) for k in range(j - i)], "not one layer's run"
        spans = [sp for sp in self.pass_tables[layer][1] if sp]
        for k in range(i, j):
            off = self.offsets[k] - self.ring_base
            assert off % 256 == 0 and 0 <= off and off + nbytes <= self.R * self.stride
            first = next(a for a, b in spans if a <= k < b)        # k's pass's first entry
            for x in range(off // self.stride, (off + nbytes - 1) // self.stride + 1):
                m = k - (k % self.R - x)                           # the entry of slot x
                assert first <= m <= k, f"entry {k}'s bytes reach slot {x} outside its pass"
        assert all(self.offsets[k + 1] == self.offsets[k] + nbytes for k in range(i, j - 1))
        cut.append(j - i)
        return j

    monkeypatch.setattr(StreamingProvider, "_run_end", checked)
    obs = Copies()
    eng = PrefillEngine(pack, EngineConfig(vram=1 << 30, cache=slots * blob, ring=ring,
                                           chunk=chunk, max_prompt=64, device="cpu",
                                           ffn="ref"), observers=[obs])
    tokens = torch.randint(0, SHAPE.vocab, (37,), generator=torch.Generator().manual_seed(3))
    res = eng.run(tokens)
    monkeypatch.undo()
    return res, obs.runs, cut, blob


@pytest.mark.parametrize("ring", [3, 5, 6, 8])
@pytest.mark.parametrize("stage", [False, True], ids=["stream", "stage"])
def test_runs_read_the_same_with_fewer_copies(uniform, ring, stage, monkeypatch):
    on, runs, cut, blob = read(uniform, ring, runs=True, monkeypatch=monkeypatch, stage=stage)
    off, singles, _, _ = read(uniform, ring, runs=False, monkeypatch=monkeypatch, stage=stage)
    assert torch.equal(on.logits, off.logits)
    assert on.stats.bytes_streamed == off.stats.bytes_streamed > 0
    blobs = sum(c.copies for c in on.stats.chunks)
    assert blobs == sum(c.copies for c in off.stats.chunks) == sum(r[2] for r in runs)
    assert sum(c.copy_ops for c in on.stats.chunks) == len(runs) == len(cut)
    assert all(r[2] == 1 for r in singles) and len(singles) == blobs
    assert all(r[3] == r[2] * blob for r in runs), "a run is whole slots"
    if ring >= 4 and not stage:   # passes of two or more streamed experts: runs form
        assert len(runs) < blobs


@pytest.mark.parametrize("ring,slots", [(3, 16), (5, 16), (8, 16), (5, 12)])
@pytest.mark.parametrize("stage", [False, True], ids=["stream", "stage"])
def test_a_layer_smaller_than_the_slot_runs_packed(mixed, ring, slots, stage, monkeypatch):
    """Layer 0's Q4_0 blobs (smaller than the Q8_0 slot) pack back to back and run as layer 1's
    whole slots do: the same logits bit for bit as blob by blob, every blob copied once, each
    run `count` small blobs long. With a 12-slot cache and a 5-slot ring a pass's entries cross
    the ring's end, where a group must stop (packed past it, a blob would land beyond the ring)."""
    on, runs, _, blob = read(mixed, ring, runs=True, monkeypatch=monkeypatch, stage=stage,
                             slots=slots)
    off, _, _, _ = read(mixed, ring, runs=False, monkeypatch=monkeypatch, stage=stage,
                        slots=slots)
    assert torch.equal(on.logits, off.logits)
    small_blob = Pack.open(mixed).layers[0].blob_size
    assert small_blob < blob
    small = [r for r in runs if r[0] == 0]
    assert small and all(r[3] == r[2] * small_blob for r in small)
    assert sum(c.copies for c in on.stats.chunks) == sum(r[2] for r in runs)
    if ring >= 5 and not stage:
        assert any(r[2] > 1 for r in small) and any(r[2] > 1 for r in runs if r[0] == 1)


def _offsets(R, stride, nbytes, G, cached, experts, runs=True):
    """StreamingProvider._ring_offsets on a bare state: one layer's streamed `experts` queued
    after `cached` cached ones, passes of G members."""
    from types import SimpleNamespace
    me = SimpleNamespace(runs=runs, stride=stride, R=R, ring_base=0,
                         queue=[(0, e) for e in experts])
    offs = StreamingProvider._ring_offsets(me, 0, len(experts), nbytes,
                                           lambda i: (cached + i) // G)
    return offs, (lambda i: (cached + i) // G)


@settings(max_examples=300, deadline=None)
@given(R=st.integers(1, 12), slot_blocks=st.integers(1, 8), blob_blocks=st.integers(1, 8),
       cached=st.integers(0, 5), data=st.data())
def test_packed_offsets_stay_in_their_pass_and_the_ring(R, slot_blocks, blob_blocks, cached,
                                                        data):
    """For any ring, slot and blob size, pass size and routed experts: every blob's bytes start
    256-aligned, lie inside the ring, only in slots of its own pass's entries at or before its
    own, and overlap no other blob of the same ring cycle; blobs of whole slots sit in their
    own slot."""
    stride, nbytes = 256 * slot_blocks, 256 * min(blob_blocks, slot_blocks)
    G = data.draw(st.integers(1, max(1, R)))
    experts = sorted(data.draw(st.sets(st.integers(0, 40), min_size=1, max_size=3 * R)))
    offs, pass_of = _offsets(R, stride, nbytes, G, cached, experts)
    for i, off in enumerate(offs):
        assert off % 256 == 0 and 0 <= off and off + nbytes <= R * stride
        if nbytes == stride:
            assert off == (i % R) * stride
        for x in range(off // stride, (off + nbytes - 1) // stride + 1):
            m = i - (i % R - x)                       # the entry whose slot x is, this cycle
            assert m <= i and pass_of(m) == pass_of(i), (i, x)
    for c in range(0, len(offs), R):                  # one ring cycle: no two blobs overlap
        spans = sorted((o, o + nbytes) for o in offs[c:c + R])
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    no_runs, _ = _offsets(R, stride, nbytes, G, cached, experts, runs=False)
    assert no_runs == [(i % R) * stride for i in range(len(experts))]
