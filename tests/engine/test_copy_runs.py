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
