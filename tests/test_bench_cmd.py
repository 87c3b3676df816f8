"""`strata bench` and `strata prefill`'s --prompts-file / --trace / --no-warmup on a tiny pack (CPU)."""
import csv
import functools
import io
import json

import pytest

from strata.cli import main
from strata.commands import bench as bench_cmd
from strata.commands.bench import PART_COLUMNS
from strata.packs.synth import ExpertFormats, synth_pack
from strata.shapes import get_preset

# a cache of a few blobs, so most experts stream through a 2-slot ring
STREAM = ["--vram", "1GiB", "--cache", "90KiB", "--chunk", "32", "--ring", "2"]


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    return str(synth_pack(tmp_path_factory.mktemp("b") / "t.pack", get_preset("tiny"),
                          ExpertFormats.of("Q8_0"), progress=False))


def test_bench_rows_csv_and_json(pack, capsys, tmp_path):
    assert main(["bench", pack, "-p", "40,70", "-r", "2", "-o", "json", *STREAM,
                 "--trace", str(tmp_path / "b.json")]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["test"] for r in rows] == ["pp40", "pp70"]
    for r in rows:
        assert r["reps"] == 2 and r["tokens_per_s"] > 0 and r["tokens_per_s_sd"] >= 0
        assert (r["chunk"], r["ring"]) == (32, 2) and r["bytes_streamed"] > 0
        assert r["pcie_bound_tokens_per_s"] > 0 and r["warmup_s"] > 0
        assert r["planned_for"] == 70 and r["cache_bytes"] > 0   # one engine, planned for 70
        assert r["dense_layers"] == ""        # the CPU decodes every matrix: none kept as blocks
        assert r["peak_vram"] == ""           # no GPU: nothing held on one
    trace = json.loads((tmp_path / "b.json").read_text())
    assert {e.get("cat") for e in trace["traceEvents"]} >= {"copy", "compute", "passes"}
    assert main(["bench", pack, "-p", "40", "-r", "1", "-o", "csv", "--no-warmup", *STREAM,
                 "--dense-layers", "decoded"]) == 0
    got = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(got) == 1 and got[0]["test"] == "pp40" and float(got[0]["warmup_s"]) == 0.0
    assert got[0]["dense_layers"] == "decoded"
    assert main(["bench", pack, "-p", "40", "-r", "1", *STREAM]) == 0
    out = capsys.readouterr().out
    assert "| pp40 |" in out and "compute floor by part" not in out   # no rates on the CPU
    for r in rows:
        assert all(r[c] is None for c in PART_COLUMNS)
    assert set(PART_COLUMNS) <= set(got[0])


def test_bench_rows_list_the_floor_by_part(pack, capsys, monkeypatch):
    """With rates (stand-ins here; measured on CUDA) each row carries the compute floor's parts
    in seconds over the prompt, summing to the floor, and the table a line of them."""
    from strata.bench import roofline as rl
    monkeypatch.setattr(rl, "Rates", functools.partial(
        rl.Rates, measure_gemm=lambda s, T: 3e9, measure_attn=lambda s, T: 5e9,
        measure_dense=lambda s, T: 7e9))
    assert main(["bench", pack, "-p", "40,70", "-r", "1", "-o", "json", *STREAM]) == 0
    rows = json.loads(capsys.readouterr().out)
    shape = get_preset("tiny")
    for r in rows:
        n = r["n_tokens"]
        floor = sum(r[c] for c in PART_COLUMNS)
        assert n / floor == pytest.approx(r["compute_floor_tokens_per_s"])
        # the bound is the slower limit, and of_bound the rate over it
        limits = [r[c] for c in ("pcie_bound_tokens_per_s", "compute_floor_tokens_per_s")
                  if r[c] is not None]
        assert r["bound_tokens_per_s"] == min(limits)
        assert r["of_bound"] == pytest.approx(r["tokens_per_s"] / min(limits))
        assert r["floor_linear_s"] == 0 and r["floor_experts_s"] > 0
        # chunks of 32: the experts' part is every chunk's expert FLOPs at the GEMM rate
        assert r["floor_experts_s"] == pytest.approx(rl.expert_flops(shape, n) / 3e9)
    assert main(["bench", pack, "-p", "40", "-r", "1", *STREAM]) == 0
    out = capsys.readouterr().out
    assert "compute floor by part, seconds a prompt: pp40 experts " in out
    assert bench_cmd.FLOOR_PARTS == rl.FLOOR_PARTS      # the columns name the floor's parts


@pytest.mark.parametrize("argv, msg", [
    (["-p", "0"], "-p needs prompt lengths"),
    (["-p", "8k"], "-p takes comma-separated"),
    (["-p", "40", "-r", "0"], "-r must be at least 1"),
])
def test_bench_bad_input(pack, capsys, argv, msg):
    try:
        rc = main(["bench", pack, *argv, *STREAM])
    except SystemExit as e:   # the parser's one-line error
        rc = e.code
    assert rc == 2
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err


def test_prompts_file_reads_every_prompt_in_one_engine(pack, capsys, tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("# a length, ids, a one-token prompt\n40\n\n1,2,3,4,5\n7,\n")
    assert main(["prefill", pack, "--prompts-file", str(f), "--json", *STREAM]) == 0
    reps = json.loads(capsys.readouterr().out)
    assert [r["n_tokens"] for r in reps] == [40, 5, 1]
    assert reps[0]["startup_s"] > 0 and all(r["startup_s"] == 0 for r in reps[1:])
    assert all(r["warmed"] for r in reps)
    # the same prompt alone gives the same next token as inside the file
    assert main(["prefill", pack, "--tokens", "1,2,3,4,5", "--json", *STREAM]) == 0
    assert json.loads(capsys.readouterr().out)["next_token"] == reps[1]["next_token"]


@pytest.mark.parametrize("text, msg", [("", "holds no prompt"), ("abc\n", "line 1"),
                                       ("1,2,999999\n", "outside the vocabulary")])
def test_prompts_file_bad_lines(pack, capsys, tmp_path, text, msg):
    f = tmp_path / "p.txt"
    f.write_text(text)
    assert main(["prefill", pack, "--prompts-file", str(f), *STREAM]) == 2
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err


def test_prompts_file_needs_the_streaming_engine(pack, capsys, tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("4\n")
    assert main(["prefill", pack, "--prompts-file", str(f)]) == 2
    assert "needs the streaming engine" in capsys.readouterr().err


def test_a_hybrid_s_rows_say_which_delta_rule_ran(capsys, tmp_path):
    """A hybrid (tiny Qwen3.5) benched and prefilled: each row and report names the delta-rule
    launch in force and what auto resolved to (strata's kernels on the CPU), or what --delta
    pinned; a model without linear layers has none."""
    import importlib.util
    hybrid = str(synth_pack(tmp_path / "q35.pack", get_preset("tiny-qwen35moe"),
                            ExpertFormats.of("Q8_0"), progress=False))
    run = ["-p", "40", "-r", "1", "--no-warmup", "--vram", "2GiB", "--chunk", "32"]
    assert main(["bench", hybrid, *run, "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["delta"] == "default: strata"
    assert main(["bench", hybrid, *run]) == 0
    assert "delta rule launch (linear-attention layers): default: strata" in capsys.readouterr().out
    assert main(["prefill", hybrid, "--tokens", "1,2,3", "--json", "--vram", "2GiB"]) == 0
    assert json.loads(capsys.readouterr().out)["delta"] == "default: strata"
    if importlib.util.find_spec("fla") is not None:
        assert main(["bench", hybrid, *run, "-o", "csv", "--delta", "backend=fla"]) == 0
        got = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
        assert got[0]["delta"] == "backend=fla"
        # the CPU computes in fp32 beside a bf16 KV: fla's buffers are planned in the engine's
        # dtype, not the KV's (the carve's views were too small for them)
        assert main(["prefill", hybrid, "--tokens", "1,2,3,4,5,6,7,8", "--json", "--vram",
                     "2GiB", "--kv", "bf16", "--delta", "backend=fla"]) == 0
        assert json.loads(capsys.readouterr().out)["delta"] == "backend=fla"
    tiny = str(synth_pack(tmp_path / "t.pack", get_preset("tiny"), ExpertFormats.of("Q8_0"),
                          progress=False))
    assert main(["bench", tiny, *run, "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["delta"] is None


def test_the_pcie_bound_counts_the_kv_staged_back(pack, capsys):
    """With part of a prompt's KV held on the host, the later chunks copy it back over the same
    link as the experts: the row's kv_streamed is those bytes and its PCIe bound their sum's
    time at the H2D rate of the run (bytes_streamed alone would be a bound no read can reach)."""
    host_kv = ["--vram", "1GiB", "--cache", "200KiB", "--chunk", "32", "--ring", "2"]
    assert main(["bench", pack, "-p", "96", "-r", "1", "-o", "json", *host_kv,
                 "--kv-resident", "16"]) == 0
    r = json.loads(capsys.readouterr().out)[0]
    assert r["kv_streamed"] > 0
    link_s = (r["bytes_streamed"] + r["kv_streamed"]) / (r["h2d_gbps"] * 1e9)
    assert r["pcie_bound_tokens_per_s"] == pytest.approx(96 / link_s, rel=1e-9)
    assert main(["bench", pack, "-p", "96", "-r", "1", "-o", "json", *host_kv]) == 0
    assert json.loads(capsys.readouterr().out)[0]["kv_streamed"] == 0    # all resident


def test_the_documented_columns_are_the_csv_columns():
    """docs/cli.md lists bench's CSV/JSON columns in COLUMNS' order, every one."""
    import re
    from pathlib import Path

    from strata.commands.bench import COLUMNS
    doc = (Path(__file__).parents[1] / "docs" / "cli.md").read_text()
    listed = re.search(r"CSV/JSON columns: `([^`]*)`", doc).group(1)
    assert [c.strip() for c in listed.split(",")] == COLUMNS


def test_bench_s_copy_rate_times_runs_of_the_pack_s_blobs(pack, capsys, monkeypatch):
    """The PCIe bound's rate (roofline.h2d_rate) is timed on runs of a layer's blobs as well as
    blob by blob: a pack's HostExperts hands each layer as one block, so the runs exist, each
    several whole blobs of one layer."""
    from strata.bench import roofline
    made, real = [], roofline._runs

    def spy(host, held, E, nbytes, *a, **k):
        made.append((host, held, real(host, held, E, nbytes, *a, **k)))
        return made[-1][2]
    monkeypatch.setattr(roofline, "_runs", spy)
    assert main(["bench", pack, "-p", "24", "-r", "1", "-o", "csv", *STREAM]) == 0
    capsys.readouterr()
    ((host, held, runs),) = made
    blob = host.blob(held[0], 0).numel()
    assert runs and all(r.numel() % blob == 0 and r.numel() > blob for r in runs)


@pytest.mark.gpu
def test_the_gpu_row_says_what_the_reads_held(pack, capsys):
    """On the GPU each row carries the timed reads' peak: at least the expert cache it holds,
    within the --vram it was planned for (a tiny model's transients are small), and no line
    on stderr saying otherwise."""
    from strata.units import parse_size
    assert main(["bench", pack, "-p", "40", "-r", "1", "-o", "json", *STREAM,
                 "--devices", "cuda:0"]) == 0
    out = capsys.readouterr()
    (r,) = json.loads(out.out)
    peak = parse_size(r["peak_vram"].replace(",", "").replace(" ", ""))
    assert r["cache_bytes"] <= peak <= parse_size("1GiB")
    assert "past its --vram" not in out.err


@pytest.mark.gpu
def test_prefill_reports_what_the_read_held_on_the_gpu(pack, capsys):
    """strata prefill --json on the GPU: the read's live peak per GPU, at least the expert cache
    and within the --vram it was planned for (a tiny model), and no line saying otherwise."""
    assert main(["prefill", pack, "--prompt-tokens", "40", "--json", *STREAM,
                 "--devices", "cuda:0"]) == 0
    out = capsys.readouterr()
    r = json.loads(out.out)
    (peak,) = r["peak_vram_bytes"]
    assert r["cache_bytes"] <= peak <= 1 << 30 and "past its --vram" not in out.err
