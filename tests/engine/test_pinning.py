"""strata.engine.pinning: the threaded copy moves every byte; the benchmark's CPU path runs."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from strata.engine.load import dense_on_devices
from strata.engine.pinning import (COPY_PIECE, Registration, parallel_copy, pinned_copy,
                                   stage_to_device, upload)
from strata.errors import StrataError

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "pin_bench.py"


@pytest.mark.parametrize("n", [1, 4095, 3 * 4096 + 7])
@pytest.mark.parametrize("threads", [1, 3])
def test_parallel_copy_moves_every_byte(n, threads):
    g = torch.Generator().manual_seed(n)
    src = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)
    dst = torch.full((n,), 0xAA, dtype=torch.uint8)
    parallel_copy(dst, src, threads=threads, piece=1000)   # pieces of 1000: a ragged last one
    assert torch.equal(dst, src)


def test_threaded_copies_write_destinations_made_under_inference_mode():
    """The pool's threads copy under the caller's inference mode: a KV store made under
    torch.inference_mode and restored by a caller holding it is written in place (each thread
    has its own mode; outside it torch refuses to update an inference tensor)."""
    g = torch.Generator().manual_seed(1)
    src = torch.randint(0, 256, (5000,), dtype=torch.uint8, generator=g)
    with torch.inference_mode():
        dst = torch.zeros(5000, dtype=torch.uint8)
        parallel_copy(dst, src, threads=3, piece=1000)
        dsts, srcs, store = _pairs("cpu")
        stage_to_device(list(zip(dsts, srcs)), "cpu", threads=3, piece=1 << 20)
    assert torch.equal(dst, src)
    for d, s in zip(dsts, srcs):
        assert torch.equal(d, s.contiguous().view(d.shape)) if d.numel() else True


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


def _dense(seed):
    g = torch.Generator().manual_seed(seed)
    return {"a": torch.randn(3, 5, generator=g).to(torch.bfloat16),      # 30 B
            "norm": torch.randn(7, generator=g),                          # fp32: converted
            "empty": torch.empty(0, 4, dtype=torch.bfloat16),
            "big": torch.randn(40, 33, generator=g).to(torch.bfloat16),   # spans pieces
            "tail": torch.randn(1, generator=g).to(torch.bfloat16),
            # cast as staged (a GGUF's dequantized dense weights are fp32), across pieces
            "wide": torch.randn(50, 31, generator=g) * 3,
            "half": torch.randn(9, 17, generator=g).to(torch.float16)}


@pytest.mark.parametrize("piece", [256, 512, 1 << 20])
@pytest.mark.parametrize("threads", [1, 3])
def test_upload_lands_every_tensor_in_one_buffer(piece, threads):
    """Pieces smaller than a tensor, ragged last pieces and a dtype conversion: every tensor
    comes back equal to `.to(dtype)`, shaped, as a 256-aligned view of one buffer."""
    src = _dense(piece)
    got = upload(src, "cpu", torch.bfloat16, threads=threads, piece=piece)
    assert list(got) == list(src)
    base = got["a"].untyped_storage().data_ptr()
    for name, t in src.items():
        g = got[name]
        assert g.dtype == torch.bfloat16 and g.shape == t.shape
        assert torch.equal(g, t.to(torch.bfloat16)), name
        assert g.untyped_storage().data_ptr() == base, "one buffer"
        if g.numel():   # an empty tensor's data_ptr is 0
            assert (g.data_ptr() - base) % 256 == 0


def _pairs(device):
    """(dst, src) pairs: ragged sizes, a transposed (non-contiguous) source, an empty one, two
    dtypes, and destinations that are slices of one tensor (as a store's rows are)."""
    g = torch.Generator().manual_seed(3)
    store = torch.full((3000,), -1, dtype=torch.int8, device=device)
    srcs = [torch.randint(-128, 127, (700,), generator=g, dtype=torch.int8),
            torch.randn(33, 20, generator=g).to(torch.bfloat16).t(),
            torch.empty(0, dtype=torch.int8),
            torch.randint(-128, 127, (1000,), generator=g, dtype=torch.int8)]
    dsts = [store[:700], torch.full((20, 33), float("nan"), dtype=torch.bfloat16,
                                    device=device), store[700:700], store[2000:3000]]
    return dsts, srcs, store


@pytest.mark.parametrize("piece", [256, 512, 1 << 20])
@pytest.mark.parametrize("threads", [1, 3])
def test_stage_to_device_copies_every_pair(piece, threads):
    """Pieces smaller than a pair, a pair spanning pieces and sources of any layout: every
    destination holds its source's values, bytes outside them untouched."""
    dsts, srcs, store = _pairs("cpu")
    stage_to_device(list(zip(dsts, srcs)), "cpu", threads=threads, piece=piece)
    for d, s in zip(dsts, srcs):
        assert torch.equal(d, s.contiguous().view(d.shape)) if d.numel() else True
    assert (store[700:2000] == -1).all()
    with pytest.raises(StrataError) as e:
        stage_to_device([(store[:10], srcs[0])], "cpu")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("threads", [1, 3])
def test_a_cast_is_staged_whole_elements_or_refused(threads):
    """A cast pair (fp32 source, bf16 destination) lands equal to `.to`, split across pieces
    by its elements; one whose bytes would start mid-element in the staged stream (after a
    3-byte pair) is refused in one line, not cast from shifted bytes."""
    g = torch.Generator().manual_seed(5)
    src = torch.randn(1000, generator=g) * 7
    dst = torch.full((1000,), float("nan"), dtype=torch.bfloat16)
    stage_to_device([(dst, src)], "cpu", threads=threads, piece=256)
    assert torch.equal(dst, src.to(torch.bfloat16))
    odd = torch.zeros(3, dtype=torch.uint8)
    with pytest.raises(StrataError) as e:
        stage_to_device([(odd, torch.ones(3, dtype=torch.uint8)), (dst, src)], "cpu",
                        threads=threads, piece=256)
    assert "\n" not in str(e.value) and "multiple of 2" in str(e.value)
    with pytest.raises(StrataError):          # a cast of another length
        stage_to_device([(dst, src[:999])], "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("inference", [False, True])
def test_stage_to_device_on_the_gpu(inference):
    with torch.inference_mode(inference):   # True: as kv_stores.restore runs under a caller's mode
        dsts, srcs, store = _pairs("cuda")
        stage_to_device(list(zip(dsts, srcs)), "cuda", threads=4, piece=512)
    for d, s in zip(dsts, srcs):
        assert torch.equal(d.cpu(), s.contiguous().view(d.shape))
    assert (store[700:2000] == -1).all()


def test_dense_on_devices_leaves_a_cpu_model_alone():
    src = _dense(0)
    assert dense_on_devices(src, torch.bfloat16, torch.device("cpu")) is src


@pytest.mark.gpu
def test_upload_to_the_gpu_through_pinned_staging():
    src = _dense(1)
    src["big"] = torch.randn(3000, 1000).to(torch.bfloat16)   # 6 MB: several 1 MiB pieces
    got = upload(src, "cuda", torch.bfloat16, threads=4, piece=1 << 20)
    for name, t in src.items():
        assert got[name].is_cuda and torch.equal(got[name].cpu(), t.to(torch.bfloat16)), name
