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
