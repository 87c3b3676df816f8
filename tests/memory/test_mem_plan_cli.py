"""`strata plan` and `strata demo`: options, JSON fields, the exit-2 line, size parsing."""
import json

import pytest

from strata.cli import main

FIELDS = {"chunk", "ring", "ring_bytes", "bytes_needed", "room", "probes", "rule", "fits",
          "max_blob", "participants"}
PART_FIELDS = {"name", "ring", "ring_bytes", "bytes_needed", "room", "fits", "cache", "loan",
               "tail", "vram", "layers", "dense"}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for k in ("STRATA_PREFILL_RING", "STRATA_STREAM_ALL_MIN", "STRATA_PF_FUSED"):
        monkeypatch.delenv(k, raising=False)


def plan_json(capsys, *argv):
    rc = main(["plan", *argv, "--json"])
    out = capsys.readouterr()
    return rc, json.loads(out.out), out.err


def test_json_fields(capsys):
    rc, d, _ = plan_json(capsys, "--preset", "qwen3-30b-a3b", "--quant", "Q8_0", "--vram", "12GiB")
    assert rc == 0 and FIELDS <= set(d) and d["fits"] is True
    assert d["rule"] == "full-ring" and d["probes"] == 7 and d["max_blob"] == 5_013_504
    assert d["ring"] == 384 * 1_382_400 // 5_013_504
    (p,) = d["participants"]
    assert PART_FIELDS <= set(p) and p["tail"] == p["loan"] - (p["bytes_needed"] + 255) // 256 * 256 >= 0


def test_several_gpus_and_legacy(capsys):
    rc, d, _ = plan_json(capsys, "--preset", "seed-512e", "--quant", "Q2_0", "--vram", "8GiB",
                         "--vram", "6GiB", "--scan", "legacy")
    assert rc == 0 and d["rule"] == "legacy" and d["ring"] == 384
    assert [p["name"] for p in d["participants"]] == ["CUDA0", "CUDA1"]
    assert d["participants"][0]["layers"] == [0, 17] and d["participants"][1]["layers"] == [17, 30]


@pytest.mark.parametrize("flag,ring", [("--unpinned", 96 * 1_382_400 // 2_654_208),
                                       ("--fused", 512)],   # 533 by bytes, capped: native
                         ids=["unpinned", "fused"])
def test_ring_flags(capsys, flag, ring):
    rc, d, _ = plan_json(capsys, "--preset", "qwen3-30b-a3b", "--quant", "Q4_K", flag)
    assert rc == 0 and d["ring"] == ring


def test_forced_chunk_that_does_not_fit_exits_2_with_one_line(capsys):
    rc = main(["plan", "--preset", "seed-512e", "--quant", "Q2_0", "--vram", "6GiB",
               "--chunk", "32768"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert "needs" in err[0] and "room" in err[0] and " B " in err[0]


def test_nothing_fits_exits_2_with_one_line(capsys):
    rc = main(["plan", "--preset", "seed-512e", "--quant", "Q2_0", "--cache", "20MiB"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "needs" in err[0] and "room" in err[0]


@pytest.mark.parametrize("size", ["12GiB", "12884901888", "12288MiB"])
def test_sizes(capsys, size):
    rc, d, _ = plan_json(capsys, "--preset", "qwen3-30b-a3b", "--vram", size)
    assert rc == 0 and d["participants"][0]["vram"] == 12 << 30


@pytest.mark.parametrize("argv", [["--vram", "12 parsecs"], ["--prefill", "fast"],
                                  ["--prefill", "auto:x"], ["--lend-cap", "1.5"],
                                  ["--chunk", "256", "--prefill", "auto"]],
                         ids=["bad-size", "bad-prefill", "bad-max", "bad-cap", "chunk-and-auto"])
def test_bad_options_exit_2(capsys, argv):
    with pytest.raises(SystemExit) as e:
        main(["plan", "--preset", "tiny", *argv])
    assert e.value.code == 2


def test_scan_max_and_quant_errors(capsys):
    assert main(["plan", "--preset", "qwen3-30b-a3b", "--prefill", "auto:1000"]) == 2
    assert "multiple of 256" in capsys.readouterr().err
    assert main(["plan", "--preset", "seed-512e", "--quant", "Q4_K"]) == 2
    assert "multiple of 256" in capsys.readouterr().err


def test_prefill_max(capsys):
    rc, d, _ = plan_json(capsys, "--preset", "qwen3-30b-a3b", "--prefill", "auto:4096")
    assert rc == 0 and d["chunk"] == 4096 and d["probes"] == 4   # grid of 16: ceil(log2 16)


def test_plan_a_pack(capsys, tmp_path, monkeypatch):
    """--pack plans the pack's own blob sizes: its max_blob and nativeness reach the plan."""
    monkeypatch.setenv("STRATA_PREFILL_RING", "2")   # a tiny model: the 16-slot floor won't fit
    from strata.packs.synth import ExpertFormats, synth_pack
    from strata.shapes import get_preset
    path = synth_pack(tmp_path / "t.pack", get_preset("tiny"), ExpertFormats.of("Q8_0"),
                      progress=False)
    rc, d, _ = plan_json(capsys, "--pack", str(path), "--vram", "2GiB", "--cache", "1MiB",
                         "--chunk", "16")
    from strata.packs import Pack
    assert rc == 0 and d["fits"] and d["ring"] == 2 and d["chunk"] == 16
    assert d["max_blob"] == Pack.open(path).max_blob


def test_plan_a_pack_says_how_its_experts_would_be_pinned(capsys, tmp_path, monkeypatch):
    """--pack: a host line and a JSON "host" entry, decided as the engine decides at this host's
    memory (strata.engine.host.pin_method): a pinned copy beside the pack where it fits; locked
    in place where the pack lies on a tmpfs and a copy would not fit; nothing for --preset (no
    file) or --unpinned."""
    import strata.engine.host as host_mod
    import strata.hostmem as hostmem
    from strata.packs.synth import ExpertFormats, synth_pack
    from strata.shapes import get_preset
    monkeypatch.setenv("STRATA_PREFILL_RING", "2")
    shape = get_preset("tiny")
    path = synth_pack(tmp_path / "t.pack", shape, ExpertFormats.of("Q8_0"), progress=False)
    from strata.packs import Pack
    blobs = sum(pl.blob_size for pl in Pack.open(path).layers) * shape.n_expert
    argv = ["--pack", str(path), "--vram", "2GiB", "--cache", "1MiB", "--chunk", "16"]
    for mod in (hostmem, host_mod):     # what plan shows, and what the engines' call reads
        monkeypatch.setattr(mod, "host_available", lambda: 10 * blobs)
    rc, d, _ = plan_json(capsys, *argv)
    assert rc == 0 and d["host"] == {"experts_bytes": blobs, "method": "pread",
                                     "extra_bytes": blobs, "available_bytes": 10 * blobs}
    for mod in (hostmem, host_mod):
        monkeypatch.setattr(mod, "host_available", lambda: blobs // 2)
    monkeypatch.setattr(host_mod, "on_tmpfs", lambda path: True)
    rc, d, _ = plan_json(capsys, *argv)
    assert d["host"]["method"] == "register" and d["host"]["extra_bytes"] == 0
    assert main(["plan", *argv]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("  host "))
    assert "locked in place" in line and "a copy would not fit" in line
    rc, d, _ = plan_json(capsys, *argv, "--unpinned")
    assert "host" not in d
    rc, d, _ = plan_json(capsys, "--preset", "tiny", "--vram", "2GiB")
    assert "host" not in d


def test_missing_pack_is_clear(capsys, tmp_path):
    assert main(["plan", "--pack", str(tmp_path / "x.pack")]) == 2
    assert "x.pack" in capsys.readouterr().err


def test_table_and_demo(capsys):
    assert main(["plan", "--preset", "qwen3-30b-a3b"]) == 0
    out = capsys.readouterr().out
    assert "full-ring" in out and "CUDA0" in out and "holds every expert" not in out
    assert main(["plan", "--preset", "qwen3-30b-a3b", "--quant", "Q2_0", "--vram", "80GiB"]) == 0
    assert "holds every expert" in capsys.readouterr().out
