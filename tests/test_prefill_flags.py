"""Every flag of `strata prefill` is honoured or refused on both paths: the all-resident read
(no budget) and the streaming engine (--vram / --cache). A flag is honoured when its effect shows
in the run's own --json report (the device it ran on, the KV dtype and bytes its caches
allocated, the ring, the chunk, the layers per participant); refused when the run exits 2 with
one line. A flag that neither shows nor refuses fails here: a silent ignore (issue 35: the
resident read ran `--devices cuda:7` on the CPU and exited 0).

Both a GQA model (Qwen3-MoE, the model's KVCache / the engine's PromptKV) and an MLA one
(DeepSeek-V3: MLACache) are read, as their KV goes through different caches.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from strata.cli import main
from strata.packs import Pack
from strata.packs.memory import MemoryPack
from strata.packs.synth import ExpertFormats
from tests.models.fp32_bound import rel
from tests.models.hf_family import DS_TINY
from tests.models.hf_tiny import TINY

TOKENS = "5,17,255,0,3,99,42,7,7,128,64,1,2"
N = 13
STREAM = ["--vram", "2GiB", "--cache", "3MiB"]
PATHS = {"resident": [], "streamed": STREAM}


@pytest.fixture(scope="module", params=["qwen3moe", "deepseek2"])
def pack(request, tmp_path_factory):
    shape = TINY if request.param == "qwen3moe" else DS_TINY
    mem = MemoryPack(shape, ExpertFormats.of("BF16"), distinct=2, variants=1, device="cpu")
    return mem.save(tmp_path_factory.mktemp(request.param) / "m.pack", progress=False,
                    tokenizer=False)


def run(pack, capsys, tmp_path, *flags):
    """(exit code, the --json report or the one line it printed, logits or None)."""
    out = tmp_path / "l.npy"
    rc = main(["prefill", str(pack), "--tokens", TOKENS, "--json", "--dump-logits", str(out),
               "--force", *flags])
    cap = capsys.readouterr()
    if rc != 0:
        lines = [ln for ln in (cap.err + cap.out).splitlines() if ln.strip()]
        assert rc == 2 and len(lines) == 1 and "Traceback" not in cap.err, (flags, cap.err)
        return rc, lines[0], None
    return rc, json.loads(cap.out), np.load(out)


def kv_of(rep) -> tuple[str, int, int, int]:
    """(KV dtype, VRAM bytes, host bytes the run's caches allocated, VRAM bytes the plan counts)
    from either report (the resident read has no plan: its count is the shape's, kv_bytes)."""
    kv = rep["kv"]
    if isinstance(kv, str):
        return kv, rep["kv_bytes"], 0, rep["kv_plan_bytes"]
    return kv["dtype"], kv["vram_bytes"], kv["host_bytes"], kv["plan_vram_bytes"]


@pytest.mark.skipif(torch.cuda.device_count() > 7, reason="this machine has a cuda:7")
@pytest.mark.parametrize("path", list(PATHS))
def test_devices_on_a_missing_gpu_are_refused(pack, capsys, tmp_path, path):
    for flags in (["--devices", "cuda:7"], ["--device", "cuda:7"]):
        rc, line, _ = run(pack, capsys, tmp_path, *PATHS[path], *flags)
        assert rc == 2 and "cuda:7" in line


@pytest.mark.parametrize("path", list(PATHS))
def test_one_device_is_the_run_s_device(pack, capsys, tmp_path, path):
    rc, rep, _ = run(pack, capsys, tmp_path, *PATHS[path], "--devices", "cpu")
    assert rc == 0
    assert (rep["device"] == "cpu") if path == "resident" else (rep["devices"] == ["cpu"])


def test_a_layer_split_streams_or_is_refused(pack, capsys, tmp_path):
    rc, line, _ = run(pack, capsys, tmp_path, "--devices", "cpu,cpu")
    assert rc == 2 and "--vram" in line
    rc, line, _ = run(pack, capsys, tmp_path, "--layer-split", "1,1")
    assert rc == 2 and "--layer-split" in line
    two = ["--vram", "2GiB", "--vram", "2GiB", "--cache", "3MiB", "--devices", "cpu,cpu"]
    L = Pack.open(pack).shape.n_layer
    for split in ([1, L - 1], [L - 1, 1]):
        rc, rep, got = run(pack, capsys, tmp_path, *two, "--layer-split", f"{split[0]},{split[1]}")
        assert rc == 0 and rep["devices"] == ["cpu", "cpu"] and rep["layers"] == split


@pytest.mark.parametrize("flags", [["--ring", "3"], ["--batch", "1"], ["--max-prompt", "64"],
                                   ["--lend-cap", "0.5"], ["--scan", "legacy"],
                                   ["--unpinned"], ["--fused"], ["--prefill", "auto:512"]])
def test_streaming_only_flags(pack, capsys, tmp_path, flags):
    """Refused on the resident read (nothing there for them to shape); honoured streamed."""
    rc, line, _ = run(pack, capsys, tmp_path, *flags)
    assert rc == 2 and flags[0] in line
    # the legacy scan's first chunk is 256 tokens: a cache that holds its ring
    budget = ["--vram", "2GiB", "--cache", "64MiB"] if flags[0] == "--scan" else STREAM
    rc, rep, _ = run(pack, capsys, tmp_path, *budget, *flags)
    assert rc == 0
    parts = rep["plan"]["participants"]
    if flags[0] == "--ring":
        assert rep["prefill_ring"] == 3
    if flags[0] == "--batch":
        assert all(p["batch"] == 1 for p in parts)
    if flags[0] == "--unpinned":
        assert rep["pinned"] is False


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("kv", ["bf16", "fp32", "int8"])
def test_kv_dtype_is_kept_and_counted(pack, capsys, tmp_path, path, kv):
    """--kv names the dtype every cache of the run keeps (int8 takes the engine's PromptKV /
    MLACache, so the resident read streams), and the bytes allocated are the plan's."""
    rc, rep, _ = run(pack, capsys, tmp_path, *PATHS[path], "--kv", kv)
    assert rc == 0
    got, vram, host, plan = kv_of(rep)
    assert got == kv and host == 0 and vram == plan > 0


@pytest.mark.parametrize("kv", ["bf16", "fp32"])
def test_one_kv_dtype_on_every_path(pack, capsys, tmp_path, kv):
    """The same --kv read resident, streamed, and streamed with a host-held window keeps that
    dtype: each path's logits move by what keeping the other dtype moves them (`far`, every key
    and value rounded the other way), and paths computing in the same order agree to a hundredth
    of it (fp32's rounding is 2^-16 of bf16's).

    The window path attends over its host and VRAM pieces, so its fp32 sums run in another order
    than the one-piece read at the same chunking. With an fp32 store that is order noise (4e-7
    here). A bf16 store turns a key that order noise carries across a rounding boundary into a
    whole bf16 step: how many keys tip depends on the CPU's summation order (none on an AVX2
    machine, one step's 3.2e-4 = far/32 on an AVX-512 Xeon), but each tipped key moves by one
    step while a store in the other dtype moves every key; so that comparison's bound is far/8,
    and the report's dtype and host bytes (checked per path) say which store ran."""
    runs = {"resident": [], "streamed": STREAM, "resident, chunk 4": ["--chunk", "4"],
            "window": [*STREAM, "--kv-resident", "4", "--chunk", "4", "--ring", "8"]}
    logits = {}
    for dtype in ("bf16", "fp32"):
        for name, flags in runs.items():
            rc, rep, got = run(pack, capsys, tmp_path, *flags, "--kv", dtype)
            assert rc == 0 and kv_of(rep)[0] == dtype, name
            if name == "window":
                assert kv_of(rep)[2] > 0 and rep["kv"]["plan_host_bytes"] == kv_of(rep)[2]
            logits[dtype, name] = got
    other = "fp32" if kv == "bf16" else "bf16"
    far = rel(logits[other, "resident"], logits[kv, "resident"])
    for name in runs:     # every path stores the dtype it names: the other one is `far` away
        assert rel(logits[kv, name], logits[other, name]) > far / 2, name
    assert rel(logits[kv, "streamed"], logits[kv, "resident"]) < far / 100
    window = rel(logits[kv, "window"], logits[kv, "resident, chunk 4"])
    assert window < (far / 100 if kv == "fp32" else far / 8)


@pytest.mark.parametrize("path", list(PATHS))
def test_experts_chunk_and_dtype_are_honoured(pack, capsys, tmp_path, path):
    ring = ["--ring", "8"] if path == "streamed" else []   # a forced chunk beside a ring that fits
    rc, rep, _ = run(pack, capsys, tmp_path, *PATHS[path], *ring, "--experts", "torch", "--chunk",
                     "5", "--dtype", "bfloat16")
    assert rc == 0 and rep["experts"] == "torch" and rep["dtype"] == "bfloat16"
    assert (rep["chunk"] if path == "resident" else rep["prefill_chunk"]) == 5
    assert kv_of(rep)[0] == "bf16"    # auto: the dense dtype's

