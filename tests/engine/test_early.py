"""The read-ahead of a pack's experts before torch's import (strata.engine.early).

Its spans are the opened pack's own (Pack.expert_span); HostExperts adopts what it read (the
same bytes, page-locked; nothing read twice), and what it did not hand over is freed; a
header it cannot read, too little host memory, or a command line that will not pin starts
nothing; and importing it (and strata.cli) imports no torch."""
import subprocess
import sys

import pytest
import torch

from strata.engine.early import EarlyRead, PinMethod as Method, early_read_for, expert_spans
from strata.engine.host import HostExperts
from strata.engine.pinning import PinMethod
from strata.packs import Pack
from strata.packs.synth import ExpertFormats, synth_pack
from strata.shapes import get_preset
from tests.engine.test_host import _FakeCudart


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    shape = get_preset("tiny")
    # a dense first layer would have no experts span: the tiny preset has none, so mixed formats
    # give the layers different spans
    return Pack.open(synth_pack(tmp_path_factory.mktemp("e") / "t.pack", shape,
                                [ExpertFormats.of("Q8_0"), ExpertFormats.of("Q4_0")],
                                progress=False))


def test_spans_are_the_packs(pack):
    want = [pack.expert_span(i)[1:] for i in range(pack.shape.n_layer)
            if pack.expert_span(i) is not None]
    assert expert_spans(str(pack.path)) == want


def test_host_experts_adopt_the_read_ahead_and_free_the_rest(pack, monkeypatch):
    fake = _FakeCudart()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    sizes = [pl.blob_size for pl in pack.layers]
    reads = []
    import strata.engine.host as host_mod
    real = host_mod.pread_copy
    monkeypatch.setattr(host_mod, "pread_copy", lambda *a, **k: reads.append(a) or real(*a, **k))
    for bg in (False, True):
        early = EarlyRead.start(pack.path, threads=2)
        assert early is not None and len(early.spans) == pack.shape.n_layer
        host = HostExperts(pack.experts, sizes, pin=True, background=bg, spans=pack.expert_span,
                           method=PinMethod("pread", threads=2), early=early)
        assert host.pinned and host.early_layers == pack.shape.n_layer
        assert not reads                       # nothing read a second time
        assert len(fake.locked) == pack.shape.n_layer
        for i in range(pack.shape.n_layer):
            assert torch.equal(host.layers[i], pack.experts(i)), (bg, i)
            assert host.layers[i].data_ptr() in fake.locked
        assert early.spans == []               # handed over, and closed with the load
        host.close()
        assert not fake.locked
    # a read-ahead of only some spans: those are adopted, the others read as before
    early = EarlyRead(str(pack.path), expert_spans(str(pack.path))[:1], threads=1)
    host = HostExperts(pack.experts, sizes, pin=True, spans=pack.expert_span,
                       method=PinMethod("pread", threads=2), early=early)
    assert host.early_layers == 1 and len(reads) == pack.shape.n_layer - 1
    for i in range(pack.shape.n_layer):
        assert torch.equal(host.layers[i], pack.experts(i))
    host.close()


def test_unpinned_or_failed_reads_leave_nothing_behind(pack, monkeypatch, tmp_path):
    # no CUDA: nothing is pinned, so nothing is adopted, and the read-ahead is freed
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    sizes = [pl.blob_size for pl in pack.layers]
    early = EarlyRead.start(pack.path, threads=2)
    host = HostExperts(pack.experts, sizes, pin=True, spans=pack.expert_span, early=early)
    assert host.early_layers == 0 and early.spans == []
    for i in range(pack.shape.n_layer):
        assert torch.equal(host.layers[i], pack.experts(i))
    # a span past the file's end: its read fails, take says None, the caller reads it itself
    off, n = expert_spans(str(pack.path))[0]
    bad = EarlyRead(str(pack.path), [(off + 10**9, n)], threads=1)
    assert bad.take(str(pack.path), off + 10**9, n) is None
    assert bad.take(str(pack.path), off, n) is None          # never asked for
    bad.close()
    bad.close()                                               # idempotent


def test_what_starts_nothing(pack, tmp_path):
    p = str(pack.path)
    assert EarlyRead.start(p, available=10) is None            # more experts than host memory
    junk = tmp_path / "junk.pack"
    junk.write_bytes(b"\xff" * 64)
    assert EarlyRead.start(junk) is None                       # not a header
    import struct
    listed = tmp_path / "list.pack"
    listed.write_bytes(struct.pack("<Q", 3) + b"[1]")
    assert EarlyRead.start(listed) is None                     # a header that is not an object
    assert EarlyRead.start(tmp_path / "missing.pack") is None
    for argv in (["prefill", p],                                # the resident reader: no pinning
                 ["prefill", p, "--vram", "1GiB", "--unpinned"],
                 ["plan", p, "--vram", "1GiB"],
                 ["prefill", "--vram", "1GiB", p],              # not where the pack goes
                 ["bench", p, "--help"],
                 ["prefill", str(tmp_path / "missing.pack"), "--vram", "1GiB"]):
        assert early_read_for(argv, Method(early=True)) is None, argv
    assert early_read_for(["bench", p]) is None                # the default reads nothing ahead
    for argv in (["prefill", p, "--vram", "1GiB"], ["prefill", p, "--kv=int8"], ["bench", p]):
        got = early_read_for(argv, Method(early=True, threads=2))
        assert got is not None and len(got.spans) == pack.shape.n_layer, argv
        got.close()


def test_the_cli_and_the_read_ahead_import_no_torch():
    code = ("import sys\nimport strata.cli, strata.engine.early\n"
            "print('TORCH', 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "TORCH False" in out.stdout
