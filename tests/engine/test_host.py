"""Host blobs: pinned when CUDA is there; when pinning fails, pageable with one log line."""
import logging

import pytest
import torch

from strata.engine.host import HostExperts


def test_pinning_failure_falls_back_to_pageable_and_says_so(monkeypatch, caplog):
    blobs = [torch.arange(12, dtype=torch.uint8).reshape(3, 4), torch.ones(3, 4, dtype=torch.uint8)]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    real_empty = torch.empty

    def no_pinned(*a, pin_memory=False, **kw):
        if pin_memory:
            raise RuntimeError("CUDA error: out of memory (cudaHostAlloc)")
        return real_empty(*a, **kw)
    monkeypatch.setattr(torch, "empty", no_pinned)
    with caplog.at_level(logging.WARNING, logger="strata"):
        host = HostExperts(lambda i: blobs[i], [4, 4], pin=True)
    assert not host.pinned
    assert any("pinning the expert blobs failed" in r.getMessage() and "unpinned ring budget"
               in r.getMessage() for r in caplog.records)
    assert torch.equal(host.blob(0, 2), blobs[0][2]) and torch.equal(host.blob(1, 0), blobs[1][0])


class _FakeCudart:
    """cudaHostRegister/Unregister that only record what was locked (no CUDA here)."""
    def __init__(self):
        self.locked: dict[int, int] = {}

    def cudaHostRegister(self, ptr, nbytes, flags):
        self.locked[ptr] = nbytes
        return 0

    def cudaHostUnregister(self, ptr):
        self.locked.pop(ptr)
        return 0


class _FailsAt(_FakeCudart):
    """Refuses the registration made while `n` ranges are locked, with cudaError `code`."""
    def __init__(self, n: int, code: int):
        super().__init__()
        self.n, self.code = n, code

    def cudaHostRegister(self, ptr, nbytes, flags):
        if len(self.locked) == self.n:
            return self.code
        return super().cudaHostRegister(ptr, nbytes, flags)


def test_layers_go_to_registered_huge_page_memory_and_close_unlocks(monkeypatch):
    blobs = [torch.randint(0, 256, (5, 1000), dtype=torch.uint8) for _ in range(3)]
    fake = _FakeCudart()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    host = HostExperts(lambda i: blobs[i], [1000] * 3, pin=True)
    assert host.pinned and len(fake.locked) == 3
    for i, b in enumerate(blobs):
        assert host.layers[i].data_ptr() in fake.locked          # the copy is what got locked
        assert host.layers[i].data_ptr() != b.data_ptr()
        assert torch.equal(host.layers[i], b)
    host.close()
    assert fake.locked == {}


def test_background_loading_gives_the_same_layers_and_waits_for_them(monkeypatch):
    import pytest
    import threading
    blobs = [torch.randint(0, 256, (5, 1000), dtype=torch.uint8) for _ in range(3)]
    fake = _FakeCudart()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    gate = threading.Event()

    def slow(i):   # layer 2 waits for the test: the constructor must have returned by then
        if i == 2:
            assert gate.wait(10)
        return blobs[i]
    import sys
    from strata.engine.pinning import PinMethod
    PIN_SWITCH_INTERVAL = PinMethod().switch
    before = sys.getswitchinterval()
    host = HostExperts(slow, [1000] * 3, pin=True, background=True)
    assert not host._done.is_set(), "returned before the last layer was loaded"
    # the copy threads get the GIL back quickly while the caller runs Python beside them
    assert sys.getswitchinterval() == pytest.approx(min(PIN_SWITCH_INTERVAL, before)) \
        and PIN_SWITCH_INTERVAL < before
    gate.set()
    assert host.pinned and len(fake.locked) == 3 and host.load_s > 0   # .pinned waits
    assert sys.getswitchinterval() == before   # given back once the loading ended
    for i, b in enumerate(blobs):
        assert torch.equal(host.blob(i, 4), b[4])
    host.close()
    assert not fake.locked


def test_a_background_error_is_raised_by_the_accessors():
    def bad(i):
        return torch.zeros(3, dtype=torch.float32)
    host = HostExperts(bad, [4], pin=False, background=True)
    import pytest
    from strata.errors import StrataError
    with pytest.raises(StrataError, match="must be uint8"):
        host.join()
    with pytest.raises(StrataError, match="must be uint8"):
        host.blob(0, 0)


def test_every_pin_method_gives_the_pack_files_bytes(monkeypatch, tmp_path):
    """pread from the file or copy from the map, page-locking overlapped or not, in the
    background or not: every layer holds exactly the pack's blobs, all registered."""
    import itertools

    import pytest

    from strata.engine.pinning import PinMethod
    from strata.packs import Pack
    from strata.packs.synth import ExpertFormats, synth_pack
    from strata.shapes import get_preset
    pack = Pack.open(synth_pack(tmp_path / "t.pack", get_preset("tiny"),
                                ExpertFormats.of("Q8_0", down="Q4_0"), progress=False))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    sizes = [pl.blob_size for pl in pack.layers]
    for source, overlap, bg in itertools.product(("pread", "map"), (True, False), (True, False)):
        fake = _FakeCudart()
        monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
        host = HostExperts(pack.experts, sizes, pin=True, background=bg, spans=pack.expert_span,
                           method=PinMethod(source, threads=2, overlap=overlap))
        assert host.pinned and len(fake.locked) == len(sizes), (source, overlap, bg)
        for i in range(len(sizes)):
            assert torch.equal(host.layers[i], pack.experts(i)), (source, overlap, bg, i)
        host.close()
        assert not fake.locked
    # a span that disagrees with the file (shorter file than its header says) fails by name
    path, off, n = pack.expert_span(0)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: _FakeCudart())
    with pytest.raises(OSError, match="read"):
        HostExperts(pack.experts, sizes, pin=True, spans=lambda i: (path, off + 10**12, n))
    with pytest.raises(ValueError, match="source"):
        PinMethod("mmap")
    assert PinMethod.parse("map,threads=16,overlap=0,switch=none") == \
        PinMethod("map", threads=16, overlap=False, switch=None)


def test_a_later_layers_locking_failure_leaves_nothing_locked(monkeypatch):
    """Layer 2's registration fails while layer 3 is being read (the overlapped locking): from
    there every layer is pageable, nothing stays registered, and the bytes are the blobs."""
    blobs = [torch.randint(0, 256, (5, 1000), dtype=torch.uint8) for _ in range(5)]

    fake = _FailsAt(2, 2)         # the third: cudaErrorMemoryAllocation
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    real_empty = torch.empty

    def no_pinned(*a, pin_memory=False, **kw):   # the fallback allocator fails too
        if pin_memory:
            raise RuntimeError("CUDA error: out of memory (cudaHostAlloc)")
        return real_empty(*a, **kw)
    monkeypatch.setattr(torch, "empty", no_pinned)
    host = HostExperts(lambda i: blobs[i], [1000] * 5, pin=True)
    assert not host.pinned and host.pin_error
    assert fake.locked == {}, "a layer stayed registered after the fallback"
    for i, b in enumerate(blobs):
        assert torch.equal(host.layers[i], b)


def test_register_locks_the_pack_pages_in_place(monkeypatch, tmp_path):
    """PinMethod "register": every layer is the pack's own mapped bytes, locked read-only where
    they lie (no copy: the host holds the blobs once), overlapped or not, in the background or
    not; close() unlocks them all and the pack still reads."""
    import itertools

    from strata.engine.pinning import HOST_REGISTER_READ_ONLY, PinMethod
    from strata.packs import Pack
    from strata.packs.synth import ExpertFormats, synth_pack
    from strata.shapes import get_preset
    pack = Pack.open(synth_pack(tmp_path / "t.pack", get_preset("tiny"),
                                ExpertFormats.of("Q8_0"), progress=False))
    sizes = [pl.blob_size for pl in pack.layers]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    class Flags(_FakeCudart):
        flags: list = []

        def cudaHostRegister(self, ptr, nbytes, flags):
            self.flags.append(flags)
            return super().cudaHostRegister(ptr, nbytes, flags)
    for overlap, bg in itertools.product((True, False), (True, False)):
        fake = Flags()
        monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
        host = HostExperts(pack.experts, sizes, pin=True, background=bg, spans=pack.expert_span,
                           method=PinMethod("register", overlap=overlap))
        assert host.pinned and len(fake.locked) == len(sizes)
        for i in range(len(sizes)):
            # the file's own pages through a shared read-only map: a lock on the pack's
            # private map would make Linux copy every page into anonymous memory
            assert _map_perms(host.layers[i].data_ptr()) == "r--s"
            assert torch.equal(host.layers[i].reshape(-1), pack.experts(i).reshape(-1))
            assert fake.locked[host.layers[i].data_ptr()] == pack.experts(i).numel()
        assert all(f & HOST_REGISTER_READ_ONLY for f in fake.flags)
        host.close()
        assert not fake.locked
    assert torch.equal(pack.experts(0)[:1], pack.experts(0)[:1].clone())


def _map_perms(addr: int) -> str:
    """The permissions /proc/self/maps gives the mapping holding address `addr`."""
    with open("/proc/self/maps") as f:
        for line in f:
            span, perms = line.split()[:2]
            a, b = (int(x, 16) for x in span.split("-"))
            if a <= addr < b:
                return perms
    raise AssertionError(f"{addr:#x} is in no mapping")


def test_shared_read_map_is_the_file_span_shared_and_read_only(tmp_path):
    """shared_read_map: exactly the span's bytes, from an offset off the map's granularity, in
    a shared read-only mapping (so a read-only lock takes the file's pages, not copies)."""
    import mmap

    from strata.engine.pinning import shared_read_map
    data = torch.randint(0, 256, (3 * mmap.ALLOCATIONGRANULARITY + 123,), dtype=torch.uint8)
    f = tmp_path / "blob.bin"
    f.write_bytes(data.numpy().tobytes())
    for off, n in ((0, 10), (1, 5000), (mmap.ALLOCATIONGRANULARITY + 7, 2 * 4096 + 1),
                   (mmap.ALLOCATIONGRANULARITY, 100)):
        m, t = shared_read_map(str(f), off, n)
        assert t.numel() == n and torch.equal(t, data[off:off + n])
        assert _map_perms(t.data_ptr()) == "r--s"
        del t


def test_register_refused_leaves_the_pack_pageable_and_uncopied(monkeypatch):
    """A driver that will not lock a layer in place (no read-only registration): that layer and
    the rest stay the source's pageable bytes, nothing stays locked, nothing was copied."""
    from strata.engine.pinning import PinMethod
    blobs = [torch.randint(0, 256, (5, 1000), dtype=torch.uint8) for _ in range(4)]

    fake = _FailsAt(1, 801)       # the second: cudaErrorNotSupported
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    host = HostExperts(lambda i: blobs[i], [1000] * 4, pin=True,
                       method=PinMethod("register"))
    assert not host.pinned and "801" in host.pin_error and fake.locked == {}
    for i, b in enumerate(blobs):
        assert host.layers[i].data_ptr() == b.data_ptr()


class _SlowCudart(_FakeCudart):
    """Registrations that take `delay` s each, the most at once counted; the `fail_at`-th one
    (0-based) refused."""
    def __init__(self, delay: float, fail_at: int | None = None):
        super().__init__()
        import threading
        self.delay, self.fail_at, self.calls, self.now, self.peak = delay, fail_at, 0, 0, 0
        self.mutex = threading.Lock()

    def cudaHostRegister(self, ptr, nbytes, flags):
        import time
        with self.mutex:
            n, self.calls = self.calls, self.calls + 1
            self.now += 1
            self.peak = max(self.peak, self.now)
        time.sleep(self.delay)
        with self.mutex:
            self.now -= 1
            if n == self.fail_at:
                return 2          # cudaErrorMemoryAllocation
            self.locked[ptr] = nbytes
        return 0


def test_register_locks_up_to_lockers_layers_at_once(monkeypatch):
    """PinMethod "register", lockers=3: at most three layers lock at once (and more than one
    does), every layer ends locked in place; a refusal while others are locking waits for them,
    so nothing stays locked and every layer is the source's own bytes."""
    import pytest

    from strata.engine.pinning import PinMethod
    blobs = [torch.randint(0, 256, (5, 1000), dtype=torch.uint8) for _ in range(7)]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    fake = _SlowCudart(0.05)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    host = HostExperts(lambda i: blobs[i], [1000] * 7, pin=True, background=True,
                       method=PinMethod("register", lockers=3))
    assert host.pinned and 2 <= fake.peak <= 3
    assert sorted(fake.locked) == sorted(b.data_ptr() for b in blobs)
    assert host.lock_s >= 7 * 0.05       # summed over the threads
    host.close()
    assert not fake.locked
    for fail_at in (0, 3, 6):
        fake = _SlowCudart(0.05, fail_at=fail_at)
        monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
        host = HostExperts(lambda i: blobs[i], [1000] * 7, pin=True,
                           method=PinMethod("register", lockers=3))
        assert not host.pinned and "failed" in host.pin_error, fail_at
        assert fake.locked == {} and fake.now == 0, fail_at
        assert [t.data_ptr() for t in host.layers] == [b.data_ptr() for b in blobs]
    with pytest.raises(ValueError, match="lockers"):
        PinMethod("register", lockers=0)
    for text in ("pread,lockers=4", "map,lockers=2", "register,overlap=0,lockers=2"):
        with pytest.raises(ValueError, match="applies to 'register' with overlap"):
            PinMethod.parse(text)       # used where it applies, refused elsewhere
    assert PinMethod.parse("register,lockers=8") == PinMethod("register", lockers=8)


def test_pin_method_locks_a_resident_pack_in_place_only_when_a_copy_would_not_fit(
        tmp_path, monkeypatch):
    """The default copy wherever it fits; a pack file already in host memory (on a tmpfs: its
    experts are views of the map) whose pinned copy would not fit beside it: "register"; a
    pack on a disk stays the copy (the host-memory check then says what does not fit). An
    in-memory pack (MemoryPack, Requant, a GGUF read as a pack: each layer built when asked)
    always takes the copy, so the host check counts its bytes instead of finding room that the
    built layers then take. Where the file lies is the mount table's to say (on_tmpfs, held to a
    table of its own below)."""
    import strata.engine.host as host_mod
    from strata.engine.host import pin_method
    from strata.packs import Pack
    from strata.packs.from_gguf import GGUFModel
    from strata.packs.memory import MemoryPack
    from strata.packs.requant import Requant
    from strata.packs.synth import ExpertFormats, synth_pack
    from strata.packs.synth_gguf import synth_gguf
    from strata.shapes import get_preset
    tiny = get_preset("tiny")
    pack = Pack.open(synth_pack(tmp_path / "t.pack", tiny, ExpertFormats.of("Q8_0"),
                                progress=False))
    mem = MemoryPack(tiny, ExpertFormats.of("Q8_0"))
    gguf = GGUFModel(synth_gguf(tmp_path / "t.gguf", tiny, progress=False))
    built = (mem, Requant(mem, ExpertFormats.of("Q4_0")), gguf)
    for tmpfs in (False, True):
        monkeypatch.setattr(host_mod, "on_tmpfs", lambda path, t=tmpfs: t)
        for p in (pack, *built):
            assert pin_method(p, 10, 100).source == "pread"       # fits: the copy
            assert pin_method(p, 10, None).source == "pread"      # the OS does not say
        for p in built:
            assert pin_method(p, 100, 10).source == "pread", p
        assert pin_method(pack, 100, 10).source == ("register" if tmpfs else "pread")
    # what both engines ask before their host check: the method, and the host bytes its pinned
    # blobs take beyond the pack (0 in place); nothing pinned without CUDA or --unpinned
    monkeypatch.setattr(host_mod, "host_available", lambda: 10)
    assert host_mod.host_pinning(pack, 100, True, True) == (host_mod.PinMethod("register"), 0)
    assert host_mod.host_pinning(mem, 100, True, True) == (host_mod.PinMethod(), 100)
    for pin, cuda in ((False, True), (True, False)):
        method, extra = host_mod.host_pinning(pack, 100, pin, cuda)
        assert method.source == "pread" and extra == 100
    monkeypatch.setattr(host_mod, "host_available", lambda: 1000)
    assert host_mod.host_pinning(pack, 100, True, True) == (host_mod.PinMethod(), 100)


def test_on_tmpfs_reads_the_deepest_mount_above_a_path(tmp_path):
    """The longest mount point above the path decides (a disk mounted inside a tmpfs is a
    disk); mount points with spaces (\\040 in the table); a table that cannot be read: False."""
    from strata.hostmem import on_tmpfs
    root = tmp_path / "m"
    (root / "shm dir" / "disk").mkdir(parents=True)
    esc = str(root / "shm dir").replace(" ", "\\040")
    table = tmp_path / "mounts"
    table.write_text(f"/dev/sda1 / ext4 rw 0 0\ntmpfs {esc} tmpfs rw 0 0\n"
                     f"/dev/sdb1 {esc}/disk xfs rw 0 0\n")
    assert on_tmpfs(root / "shm dir" / "a.pack", table)
    assert not on_tmpfs(root / "shm dir" / "disk" / "a.pack", table)
    assert not on_tmpfs(root / "a.pack", table)
    assert not on_tmpfs(root / "a.pack", tmp_path / "no-such-table")


def _rss_anon() -> int:
    """This process's anonymous resident bytes (/proc/self/status RssAnon)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) << 10
    raise AssertionError("no RssAnon in /proc/self/status")


@pytest.mark.gpu
def test_register_in_place_copies_nothing_on_the_gpu(tmp_path):
    """PinMethod "register" with the real driver: every layer locked (pinned), the bytes the
    pack's, and the process's anonymous memory grows by far less than the experts' bytes. A lock
    of the pack's private map made Linux copy each page into anonymous memory (GLM-4.5-Air's
    61.5 GiB of experts, until the OOM killer came); the shared read-only map copies nothing."""
    from strata.engine.pinning import PinMethod
    from strata.packs import Pack
    from strata.packs.synth import ExpertFormats, synth_pack
    from strata.shapes import get_preset
    shape = get_preset("tiny").with_(d_model=512, d_expert=512, n_expert=64)   # ~110 MB
    pack = Pack.open(synth_pack(tmp_path / "t.pack", shape, ExpertFormats.of("Q8_0"),
                                progress=False))
    sizes = [pl.blob_size for pl in pack.layers]
    total = sum(s * shape.n_expert for s in sizes)
    for i in range(len(sizes)):              # the file's pages resident before the count
        pack.experts(i).sum()
    before = _rss_anon()
    host = HostExperts(pack.experts, sizes, pin=True, spans=pack.expert_span,
                       method=PinMethod("register", overlap=False))
    grown = _rss_anon() - before
    try:
        assert host.pinned, host.pin_error
        assert all(host.layers[i].is_pinned() for i in range(len(sizes)))
        for i in range(len(sizes)):
            assert torch.equal(host.layers[i].reshape(-1), pack.experts(i).reshape(-1))
        assert grown < total / 4, f"locking in place grew anonymous memory by {grown:,} B"
    finally:
        host.close()
