"""A chunk's layers and passes are enqueued without the host waiting on the device.

The region watched is one whole chunk of the streaming engine: from the provider's begin_chunk
through the chunk's layers (attention, routing, every pass's copies and expert GEMMs, the finite
guard's marks, the observers) to its end_chunk. Cases and why:
- CPU, stream mode, the Triton FFNs ("kernel" fused, whose logits also equal the all-resident
  forward's bit for bit; "decoded" decode-once, with the engine's
  PromptKV holding int8 KV partly in host memory, so its copies and chunk attention are watched
  too): strata.engine.syncs' SyncGuard records every host read strata code makes
  (.item/.tolist/bool/.cpu/nonzero/...):
  none may happen; a ring of 4 < E makes several passes per layer (the path that synced per pass)
  and 8 tokens in chunks of 4 make two chunks (the boundary that synced per chunk);
- CPU, stage mode: exactly one declared read per layer (which experts to copy), nothing else;
- GPU: the device's own check, torch.cuda.set_sync_debug_mode("error") around every chunk of a
  streamed prompt (stream mode; stage mode lifts it only inside its declared reads).
The guard itself must catch what it claims (a test feeds it each pattern).
"""
import contextlib

import pytest
import torch

from strata.engine.prefill import EngineConfig, PrefillEngine
from strata.engine.provider import StreamingProvider
from strata.engine.syncs import SyncGuard, host_read
from strata.packs.synth import ExpertFormats, synth_pack
from strata.shapes import get_preset

SHAPE = get_preset("tiny")     # L=2, D=64, E=8, K=2, F=32


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    return synth_pack(tmp_path_factory.mktemp("s") / "tiny.pack", SHAPE,
                      ExpertFormats.of("Q8_0", down="Q4_0"), progress=False)


@contextlib.contextmanager
def watched_chunks(monkeypatch, enter, leave):
    """Run `enter()` as each chunk begins and `leave()` after it ends (the provider's calls)."""
    begin, end = StreamingProvider.begin_chunk, StreamingProvider.end_chunk

    def begin_chunk(self, start, n):
        enter()
        begin(self, start, n)

    def end_chunk(self):
        try:
            end(self)
        finally:
            leave()
    monkeypatch.setattr(StreamingProvider, "begin_chunk", begin_chunk)
    monkeypatch.setattr(StreamingProvider, "end_chunk", end_chunk)
    yield


def guarded_run(pack, monkeypatch, *, device="cpu", ffn="kernel", ring=4, chunk=4, n=8,
                logits="last", **kw):
    from strata.packs import Pack
    blob = Pack.open(pack).max_blob
    eng = PrefillEngine(pack, EngineConfig(vram=1 << 30, cache=16 * blob, ring=ring, chunk=chunk,
                                           max_prompt=n, device=device, ffn=ffn, **kw))
    tok = torch.randint(0, SHAPE.vocab, (n,), generator=torch.Generator().manual_seed(2))
    guards: list[SyncGuard] = []

    def enter():
        guards.append(SyncGuard().__enter__())

    def leave():
        guards[-1].__exit__(None, None, None)
    with watched_chunks(monkeypatch, enter, leave):
        res = eng.run(tok, logits=logits)
    return res, guards


def test_decoded_ffn_and_int8_kv_chunks_never_read_the_device(pack, monkeypatch):
    kv = {"kv": "int8", "kv_resident": 4}
    res, guards = guarded_run(pack, monkeypatch, ffn="decoded", **kv)
    _check_clean(res, guards, kv)


def test_stream_mode_chunks_never_read_the_device(pack, monkeypatch):
    """The fused FFN: no host read inside a chunk, and bit for bit the all-resident forward: with
    bf16 activations and data-parallel tiles, a layer's passes leave their rows in one yk summed
    once over K (not masked and summed per pass), so y rounds from the same fp32 sums as the
    resident read's."""
    from strata.kernels import pin_tile
    from strata.engine.load import load_model, resident_provider
    from strata.models.moe import expert_ffn
    with pin_tile(schedule="dp"):
        res, guards = guarded_run(pack, monkeypatch, logits="all", dtype=torch.bfloat16)
        _check_clean(res, guards, {})
        model = load_model(pack, dtype=torch.bfloat16, ffn=expert_ffn("kernel"))
        tok = torch.randint(0, SHAPE.vocab, (8,), generator=torch.Generator().manual_seed(2))
        want = model.prefill(tok, resident_provider(pack), chunk=4)
    assert torch.equal(res.logits, want)


def _check_clean(res, guards, kv):
    assert {c.mode for c in res.stats.chunks} == {"stream"} and len(guards) == 2
    assert res.stats.bytes_streamed > 0 and (res.kv_streamed > 0) == bool(kv)
    for g in guards:
        assert not g.caught, g.report()
        assert not g.declared
    # the statistics still arrive, read once the prompt synchronized
    assert res.stats.routed > 0 and all(len(c.hit_fraction) == SHAPE.n_layer
                                        for c in res.stats.chunks)


def test_stage_mode_reads_once_per_layer_and_declares_it(pack, monkeypatch):
    monkeypatch.setenv("STRATA_STREAM_ALL_MIN", "1000")   # every chunk is "small": STAGE
    res, guards = guarded_run(pack, monkeypatch, ring=None, n=4)     # one chunk is enough
    assert res.ring == "STAGE" and len(guards) == 1
    for g in guards:
        assert not g.caught, g.report()
        assert g.declared == ["stage: the layer's routed experts"] * SHAPE.n_layer


def test_the_guard_catches_each_pattern():
    """Each way a host can wait on a tensor, made from strata code (this guard only reports
    strata's own frames: torch internals and the Triton interpreter read tensors too)."""
    import strata.kernels.moe.grouping as r
    ids = torch.tensor([[0, 1], [2, 1]])
    with SyncGuard() as g:          # the checking grouping reads its counts once, by design
        r.group_blocked(ids, 3, 16)
    assert [c.call for c in g.caught] == ["Tensor.tolist"], g.report()
    assert g.caught[0].where.endswith(f"grouping.py:{_line_of(r.group_blocked, '.tolist()')}")
    with SyncGuard() as g:
        r.group_blocked_bounded(ids, 3, 16, max_blocks=3)
        with host_read("a declared read"):
            r.group_blocked(ids, 3, 16)
    assert not g.caught and g.declared == ["a declared read"]
    # patterns in a strata module's frame: run code compiled as if it lived in one
    src = ("def f(t, m):\n"
           "    out = [t.sum().item(), t.tolist(), bool(t.any()), int(t[0]), float(t[0]),\n"
           "           t.cpu(), torch.nonzero(t), torch.unique(t), t[m], torch.bincount(t),\n"
           "           torch.repeat_interleave(t, t)]\n"
           "    t[m] = 0\n"
           "    return out\n")
    scope = {"__name__": "strata.probe", "torch": torch}
    exec(compile(src, "strata/probe.py", "exec"), scope)
    t = torch.tensor([1, 2])
    with SyncGuard() as g:
        scope["f"](t, t > 1)
    calls = [c.call for c in g.caught]
    for want in ("Tensor.item", "Tensor.tolist", "Tensor.__bool__", "Tensor.__int__",
                 "Tensor.__float__", "Tensor.cpu", "torch.nonzero", "torch.unique",
                 "Tensor.__getitem__", "torch.bincount", "torch.repeat_interleave",
                 "Tensor.__setitem__"):
        assert want in calls, (want, calls)


def _line_of(fn, text: str) -> int:
    import inspect
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, l in enumerate(lines) if text in l)


@pytest.mark.gpu
@pytest.mark.parametrize("ffn,mode", [("kernel", "stream"), ("decoded", "stream"),
                                      ("auto", "stream"), ("kernel", "stage")])
def test_no_cuda_sync_inside_a_chunk(tmp_path, monkeypatch, ffn, mode):
    """The device's own count: any cudaStreamSynchronize / blocking copy inside a chunk raises
    (stage mode: outside its one declared read per layer, which lifts the check)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device (runs on the GPU machine)")
    if mode == "stage":
        monkeypatch.setenv("STRATA_STREAM_ALL_MIN", "1000")
    small = get_preset("small")          # L=4, D=256, E=16, K=4, F=128
    pk = synth_pack(tmp_path / "small.pack", small, ExpertFormats.of("Q8_0", down="Q4_0"),
                    progress=False)
    from strata.packs import Pack
    blob = Pack.open(pk).max_blob
    # 32 of the 64 blobs: room for the decoded FFN's buffer and stage mode's scratch (a cache
    # of 20 left the loan short of both: the plan refused before any chunk ran)
    eng = PrefillEngine(pk, EngineConfig(vram=1 << 30, cache=32 * blob,
                                         ring=6 if mode == "stream" else None, chunk=96,
                                         max_prompt=300, ffn=ffn))
    tok = torch.randint(0, small.vocab, (300,), generator=torch.Generator().manual_seed(1))
    eng.warmup(300)                       # compiles outside the watched region
    chunks = []

    def enter():
        torch.cuda.set_sync_debug_mode("error")
        chunks.append(1)

    def leave():
        torch.cuda.set_sync_debug_mode(0)
    try:
        with watched_chunks(monkeypatch, enter, leave):
            res = eng.run(tok, logits="last")
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert {c.mode for c in res.stats.chunks} == {mode} and len(chunks) == 4
    assert res.stats.bytes_streamed > 0


def test_copies_run_one_pass_ahead(pack):
    """At every pass, the copy lane already holds the next pass's copies: with G = R/2 experts a
    pass, at least min(copies left after the pass, R - G) beyond the pass's own (the other half
    of the ring; a pass of cached experts has the whole ring queued), and the trace shows each
    pass's count as its counter track."""
    from strata.engine.observe import EngineObserver
    from strata.engine.trace import LaneTrace
    from strata.memory.layout import pass_experts
    from strata.packs import Pack

    class Ahead(EngineObserver):
        def __init__(self):
            self.chunks = []

        def on_chunk(self, part, start, n, mark):
            self.chunks.append({"copies": 0, "passes": []})

        def on_copy(self, part, layer, expert, nbytes, start, done, count=1):
            self.chunks[-1]["copies"] += count     # blobs: a run of adjacent ones is one copy

        def on_pass(self, part, layer, index, begin, end, wait, ahead=0):
            c = self.chunks[-1]
            c["passes"].append((c["copies"], ahead))   # (copies issued so far, ahead)
    R = 4
    blob = Pack.open(pack).max_blob
    obs, trace = Ahead(), LaneTrace()
    eng = PrefillEngine(pack, EngineConfig(vram=1 << 30, cache=16 * blob, ring=R, chunk=4,
                                           max_prompt=8, device="cpu", ffn="ref"),
                        observers=[obs, trace])
    eng.run(torch.arange(8) % SHAPE.vocab, logits="none")
    G = pass_experts(R)
    assert G == R // 2
    for c in obs.chunks:
        total = c["copies"]
        assert total > G and len(c["passes"]) > 2
        for issued, ahead in c["passes"]:
            left = total - (issued - ahead)      # copies not yet read by an earlier pass
            assert ahead >= min(left - G, R - G) and ahead >= 0, (issued, ahead, total)
    counters = [e["args"]["copies"] for e in trace.chrome()["traceEvents"] if e["ph"] == "C"]
    assert counters == [a for c in obs.chunks for _, a in c["passes"]]
