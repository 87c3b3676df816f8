"""strata.engine.pinning: the threaded copy moves every byte; the benchmark's CPU path runs."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from strata.engine.pinning import COPY_PIECE, Registration, parallel_copy, pinned_copy

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "pin_bench.py"


@pytest.mark.parametrize("n", [1, 4095, 3 * 4096 + 7])
@pytest.mark.parametrize("threads", [1, 3])
def test_parallel_copy_moves_every_byte(n, threads):
    g = torch.Generator().manual_seed(n)
    src = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)
    dst = torch.full((n,), 0xAA, dtype=torch.uint8)
    parallel_copy(dst, src, threads=threads, piece=1000)   # pieces of 1000: a ragged last one
    assert torch.equal(dst, src)


def test_parallel_copy_refuses_size_mismatch():
    with pytest.raises(ValueError, match="destination bytes"):
        parallel_copy(torch.empty(10, dtype=torch.uint8), torch.empty(11, dtype=torch.uint8))


def test_piece_is_whole_mib():
    assert COPY_PIECE % (1 << 20) == 0


def test_pin_bench_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("pin_bench", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--smoke", "--path", str(tmp_path / "f.bin"), "--out", str(tmp_path)]) == 0
    assert (tmp_path / "pin-smoke.csv").read_text().count("pin rate") == 5


@pytest.mark.gpu
def test_pinned_copy_and_registration_on_the_gpu():
    src = torch.randint(0, 256, (3 << 20,), dtype=torch.uint8)
    p = pinned_copy(src, threads=4)
    assert p.is_pinned() and torch.equal(p, src)
    with Registration(src, read_only=False) as reg:
        assert src.is_pinned()
        d = src.to("cuda", non_blocking=True)
        torch.cuda.synchronize()
        assert torch.equal(d.cpu(), src)
    assert not reg.open
