"""Host blobs: pinned when CUDA is there; when pinning fails, pageable with one log line."""
import logging

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
    from strata.engine.host import PIN_SWITCH_INTERVAL
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
