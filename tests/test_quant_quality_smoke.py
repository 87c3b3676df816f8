"""experiments/quant_quality.py --smoke end to end on the CPU: the BF16 base read with its
log-probs saved, every arm (plain quants and stock mixes) read against it with strata's own
instruments, one CSV and one PNG."""
import pytest

from strata import bench
from strata.instruments.logprobs import LOG_RANGE
from tests.scripts import load_script


def _load():
    return load_script("experiments/quant_quality.py")


def test_quant_quality_smoke(tmp_path):
    mod = _load()
    assert mod.main(["--smoke", "--out", str(tmp_path)]) == 0
    rows = bench.read_csv(tmp_path / "quant_quality-small-smoke.csv")
    by = {}
    for r in rows:
        by.setdefault(r["config"]["arm"], {})[r["figure"]] = r
    assert set(by) == {"BF16", *mod.ARMS}
    assert "kld_mean" not in by["BF16"] and by["BF16"]["ppl"]["value"] > 1
    for arm in mod.ARMS:
        f = by[arm]
        assert f["kld_mean"]["value"] > 0 and f["kld_p99"]["value"] >= f["kld_mean"]["value"]
        assert 0 < f["top1_agreement"]["value"] <= 1
        assert f["tokens_per_s"]["value"] > 0 and "CPU" in f["tokens_per_s"]["bound"]
        assert f["ppl"]["config"]["weights"] == "synthesized" and f["ppl"]["commit"]
        assert "quant_quality" in f["ppl"]["config"]["command"] or f["ppl"]["config"]["command"]
    bpw = {a: by[a]["bytes_per_weight"]["value"] for a in by}
    assert bpw["Q2_K"] < bpw["Q4_K_M"] < bpw["Q8_0"] < bpw["BF16"] < 2.01
    # more bits, closer to the base: the plain ggml quants in order
    kld = {a: by[a]["kld_mean"]["value"] for a in mod.ARMS}
    assert kld["Q8_0"] < kld["Q5_0"] < kld["Q4_0"]
    assert by["Q4_K_M"]["ppl"]["config"]["quantizer"] == "ggml-reference+strata-rtn"
    assert (tmp_path / "quant_quality-small-smoke.png").stat().st_size > 5_000


def test_quant_quality_delta_arm_smoke(tmp_path, capsys):
    """--delta-arms on a hybrid: the base weights under fla-core's launch read against the base
    under strata's (the interpreter runs fla's kernels; fp32 on the CPU, so only rounding moves:
    a KLD far under one Q8_0 re-encoding's), and a model without linear attention refused."""
    pytest.importorskip("fla", reason="fla-core is not installed")
    mod = _load()
    assert mod.main(["--smoke", "--arms", "Q8_0", "--delta-arms", "backend=fla",
                     "--out", str(tmp_path)]) == 0
    rows = bench.read_csv(tmp_path / "quant_quality-tiny-qwen35moe-smoke.csv")
    by = {}
    for r in rows:
        by.setdefault(r["config"]["arm"], {})[r["figure"]] = r["value"]
    assert set(by) == {"BF16", "Q8_0", "BF16 delta[backend=fla]"}
    fla = by["BF16 delta[backend=fla]"]
    # the base's log-probs are stored in steps of LOG_RANGE / 65535 (llama.cpp's rows), so its
    # distribution is normalized only to half a step: a KLD of near-equal reads may sit up to
    # that far below zero
    half_step = LOG_RANGE / 65535 / 2
    assert -half_step <= fla["kld_mean"] < by["Q8_0"]["kld_mean"] / 100
    assert fla["top1_agreement"] > 0.99
    assert mod.main(["--preset", "small", "--layers", "1", "--delta-arms", "backend=fla",
                     "--device", "cpu", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "quant_quality: --delta-arms: small has no linear-attention layers"


@pytest.mark.gpu
def test_quant_quality_on_the_gpu(tmp_path):
    """The experiment as the GPU runs it: full-width qwen3-30b-a3b layers (head_dim 128, so a
    later chunk's bf16 prefix goes to flash blocks and the plan carves their buffer), the
    experts streamed under a budget, windows packed into chunks, arms re-encoded on CUDA (a
    Q5_0 encoder built a CPU constant there; a packed chunk handed the flash buffer to
    chunk_attention as its tile scratch; at 3 GiB every arm plans the scan's fallback ring,
    which once counted a slot at its stride alone and found nothing fit). Each arm's KLD is
    positive and Q5_0's under Q4_0's."""
    mod = _load()
    assert mod.main(["--preset", "qwen3-30b-a3b", "--layers", "2", "--tokens", "3072",
                     "--vram", "3GiB", "--arms", "Q5_0,Q4_0,Q4_K_M", "--out", str(tmp_path)]) == 0
    rows = bench.read_csv(next(tmp_path.glob("quant_quality-qwen3-30b-a3b-*.csv")))
    kld = {r["config"]["arm"]: r["value"] for r in rows if r["figure"] == "kld_mean"}
    assert set(kld) == {"Q5_0", "Q4_0", "Q4_K_M"} and min(kld.values()) > 0
    assert kld["Q5_0"] < kld["Q4_0"]
    # each arm streamed through a plan of its own, named in its row (the plot labels its bar)
    plans = [r["config"] for r in rows if r["figure"] == "tokens_per_s"]
    assert len(plans) == 4 and all(c["chunk"] >= 256 and c["bytes_streamed"] > 0 for c in plans)
