"""experiments/deepseek_stream.py --smoke end to end on the CPU (a tiny deepseek2: a dense
first layer, shared expert, grouped routing, MLA), and the layer count it picks for 128 GiB."""
import importlib.util
from pathlib import Path

import pytest
import torch

from strata import bench
from strata.packs.synth import ExpertFormats
from strata.shapes import get_preset

ROOT = Path(__file__).resolve().parents[1]


def _mod():
    spec = importlib.util.spec_from_file_location("deepseek_stream",
                                                  ROOT / "experiments" / "deepseek_stream.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_deepseek_stream_smoke(tmp_path):
    """Two arms: every latent token resident, and 16 a layer (the rest streamed from host)."""
    assert _mod().main(["--smoke", "--kv-resident", "all,16", "--out", str(tmp_path)]) == 0
    rows = bench.read_csv(tmp_path / "deepseek_stream-smoke.csv")
    tps = [r for r in rows if r["figure"] == "tokens_per_s"]
    got = {(r["config"]["prompt"], r["config"]["kv_resident"]) for r in tps}
    assert got == {(40, None), (64, None), (40, 16), (64, 16)}
    kvb = {(r["config"]["prompt"], r["config"]["kv_resident"]): r["value"] for r in rows
           if r["figure"] == "kv_bytes_streamed"}
    # chunks of 32: the second chunk of each prompt streams min(32, T - 16) tokens a layer
    tok = _mod().SMOKE.kv_bytes(1) * _mod().SMOKE.n_layer
    assert kvb == {(40, None): 0, (64, None): 0, (40, 16): 24 * tok, (64, 16): 32 * tok}
    assert all(r["value"] > 0 and r["bound_value"] > 0 for r in tps)
    assert all(r["config"]["moe_layers"] == 3 for r in tps)
    assert (tmp_path / "deepseek_stream-smoke.png").stat().st_size > 5_000


def test_a_128_gib_host_holds_16_q4k_moe_layers():
    """6.34 GB a Q4_K MoE layer: ~125 GiB available minus the dense host copy and headroom."""
    n = _mod().layers_that_fit(get_preset("deepseek-v3"), ExpertFormats.of("Q4_K"), 125 << 30)
    assert n == 16


def test_mla_bench_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("mla_bench", ROOT / "benchmarks" / "mla_bench.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--smoke", "--out", str(tmp_path)]) == 0
    rows = bench.read_csv(tmp_path / "mla_bench-smoke.csv")
    assert {(r["config"]["arm"], r["config"]["P"]) for r in rows if r["figure"] == "ms"} == \
        {(a, p) for a in ("blocked", "all_at_once", "absorbed") for p in (0, 32)}


def test_mla_bench_flash_arms_smoke(tmp_path):
    """The flash A/B's arms (gpu_session.sh mlaflash) run on the CPU (the stand-in kernel) and
    pass the gate; a bad arm is refused in one line (exit 2)."""
    spec = importlib.util.spec_from_file_location("mla_bench", ROOT / "benchmarks" / "mla_bench.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    arms = ("blocked", "blocked:flash", "blocked:flash:8", "blocked:efficient:8:fused")
    assert mod.main(["--smoke", "--out", str(tmp_path), "--arms", ",".join(arms)]) == 0
    rows = bench.read_csv(tmp_path / "mla_bench-smoke.csv")
    assert {r["config"]["arm"] for r in rows if r["figure"] == "ms"} == set(arms)
    assert {r["config"]["arm"] for r in rows if r["figure"] == "over_blocked"} == set(arms[1:])
    for bad in ("blocked:fast", "blocked:flash:x", "blocked:flash:8:triton", "nope"):
        with pytest.raises(SystemExit) as e:
            mod.main(["--smoke", "--out", str(tmp_path), "--arms", bad])
        assert e.value.code == 2


def test_mla_bench_triton_arms_smoke(tmp_path):
    """The block kernel's arms (strata.kernels.attention.mla_block, Triton's interpreter on the
    CPU), at the tile in force and at a pinned one, pass the gate; a tile on another backend or
    a malformed tile is refused in one line (exit 2)."""
    spec = importlib.util.spec_from_file_location("mla_bench", ROOT / "benchmarks" / "mla_bench.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    arms = ("blocked", "blocked:triton", "blocked:triton:8:fused:16x16/w4s1")
    assert mod.main(["--smoke", "--out", str(tmp_path), "--arms", ",".join(arms)]) == 0
    rows = bench.read_csv(tmp_path / "mla_bench-smoke.csv")
    assert {r["config"]["arm"] for r in rows if r["figure"] == "ms"} == set(arms)
    for bad in ("blocked:flash:8:fused:16x16/w4s1", "blocked:triton:8:fused:128x64"):
        with pytest.raises(SystemExit) as e:
            mod.main(["--smoke", "--out", str(tmp_path), "--arms", bad])
        assert e.value.code == 2


def test_cudnn_mla_probe_refuses_a_cpu_in_one_line(tmp_path, capsys, monkeypatch):
    """benchmarks/cudnn_mla_probe.py times cuDNN on a GPU; without one (CUDA hidden here, so the
    check runs on the device machine too) it says so in one line and exits 2, writing nothing
    (its figures: experiments/results/mla_cudnn_probe-*)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    spec = importlib.util.spec_from_file_location("cudnn_mla_probe",
                                                  ROOT / "benchmarks" / "cudnn_mla_probe.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs a CUDA GPU" in err[0] and not list(tmp_path.iterdir())
