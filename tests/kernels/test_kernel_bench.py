"""experiments/kernel_bench.py --smoke runs on the CPU and writes strata.bench's long-format CSV."""
import importlib.util
from pathlib import Path

from strata import bench

ROOT = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("kernel_bench",
                                                  ROOT / "experiments" / "kernel_bench.py")
    kb = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kb)
    return kb


def test_kernel_bench_smoke(tmp_path):
    rc = _load().main(["--smoke", "--T", "5", "--formats", "Q8_0", "--reps", "1",
                       "--out", str(tmp_path)])
    assert rc == 0
    rows = bench.read_csv(tmp_path / "kernel_bench_smoke.csv")
    assert {"gpu", "commit", "timestamp", "config", "figure", "value", "bound"} <= set(rows[0])
    checks = [r for r in rows if r["figure"] == "rel_err"]
    assert {r["config"]["arm"] for r in checks} == {"strata-dp", "strata-sk", "strata-decoded",
                                                    "strata-decoded-grouped", "grouped_mm-bf16", "decode+grouped_mm",
                                                    "strata-plane", "strata-int8",
                                                    "strata-plane-int8"}
    assert all(r["value"] < r["bound_value"] for r in checks)
    tf = [r for r in rows if r["figure"] == "tflops"]
    assert tf and all(r["gate"].startswith("normalized error") and r["timer"] for r in tf)
    assert not list(tmp_path.glob("*.partial.csv"))
    assert (tmp_path / "kernel_bench_smoke.png").stat().st_size > 5_000


def test_kernel_bench_plane_arms_and_tiles(tmp_path):
    """--arms keeps the named arms (and grouped_mm-bf16, the bound); --tiles adds one
    strata-plane arm per PlaneTile; BF16 has no plane arm."""
    rc = _load().main(["--smoke", "--T", "5", "--formats", "BF16", "Q8_0", "--reps", "1",
                       "--arms", "strata-dp", "strata-plane", "--tiles", "16x32x64/w4s2/tma",
                       "--out", str(tmp_path)])
    assert rc == 0
    rows = bench.read_csv(tmp_path / "kernel_bench_smoke.csv")
    arms = {(r["config"]["format"], r["config"]["arm"]) for r in rows if r["figure"] == "tflops"}
    assert arms == {("BF16", "strata-dp"), ("BF16", "grouped_mm-bf16"), ("Q8_0", "strata-dp"),
                    ("Q8_0", "grouped_mm-bf16"), ("Q8_0", "strata-plane"),
                    ("Q8_0", "strata-plane[16x32x64/w4s2/tma]")}
    assert all(r["value"] < r["bound_value"] for r in rows if r["figure"] == "rel_err")


def test_kernel_bench_int8_tiles(tmp_path):
    """--int8-tiles adds one strata-int8 arm per Int8Tile, held to the int8 path's bound."""
    rc = _load().main(["--smoke", "--T", "5", "--formats", "Q8_0", "--reps", "1",
                       "--arms", "strata-int8", "--int8-tiles", "32x32/w4s2", "32x32/w4s2k2",
                       "--out", str(tmp_path)])
    assert rc == 0
    rows = bench.read_csv(tmp_path / "kernel_bench_smoke.csv")
    arms = {r["config"]["arm"] for r in rows if r["figure"] == "tflops"}
    assert arms == {"grouped_mm-bf16", "strata-int8", "strata-int8[32x32/w4s2]",
                    "strata-int8[32x32/w4s2k2]"}
    assert all(r["value"] < r["bound_value"] for r in rows if r["figure"] == "rel_err")


def test_kernel_bench_plane_int8_arms(tmp_path):
    """strata-plane-int8 runs on Q8_0 and Q4_0 (BF16 has no int8 arm), held to the int8 path's
    bound; --int8-tiles adds its arms at the same tiles as strata-int8's."""
    rc = _load().main(["--smoke", "--T", "5", "--formats", "BF16", "Q8_0", "Q4_0", "--reps", "1",
                       "--arms", "strata-int8", "strata-plane-int8", "--int8-tiles", "32x32/w4s2",
                       "--out", str(tmp_path)])
    assert rc == 0
    rows = bench.read_csv(tmp_path / "kernel_bench_smoke.csv")
    arms = {(r["config"]["format"], r["config"]["arm"]) for r in rows if r["figure"] == "tflops"}
    assert arms == {("BF16", "grouped_mm-bf16"), ("Q8_0", "grouped_mm-bf16"),
                    ("Q8_0", "strata-int8"), ("Q8_0", "strata-int8[32x32/w4s2]"),
                    ("Q8_0", "strata-plane-int8"), ("Q8_0", "strata-plane-int8[32x32/w4s2]"),
                    ("Q4_0", "grouped_mm-bf16"), ("Q4_0", "strata-int8"),
                    ("Q4_0", "strata-int8[32x32/w4s2]"), ("Q4_0", "strata-plane-int8"),
                    ("Q4_0", "strata-plane-int8[32x32/w4s2]")}
    checks = [r for r in rows if r["figure"] == "rel_err"]
    assert all(r["value"] < r["bound_value"] for r in checks)
    assert {r["bound_value"] for r in checks if "int8" in r["config"]["arm"]} == \
        {_load().INT8_REL}


def test_kernel_bench_bad_arm_or_tile_is_one_line(tmp_path, capsys):
    kb = _load()
    assert kb.main(["--smoke", "--arms", "strata-fast", "--out", str(tmp_path)]) == 2
    assert kb.main(["--smoke", "--tiles", "128x128", "--out", str(tmp_path)]) == 2
    assert kb.main(["--smoke", "--int8-tiles", "128x48/w4s2", "--out", str(tmp_path)]) == 2
    assert kb.main(["--smoke", "--int8-tiles", "64x64/w4s2k3", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4 and "no arm strata-fast" in err[0] and "BMxBNxBK" in err[1]
    assert "an int8 tile is BMxBN/wWsS" in err[2] and "one of 1, 2, 4, 8" in err[3]


def test_kernel_bench_refuses_a_wrong_kernel(tmp_path, monkeypatch):
    kb = _load()
    real = kb.moe_ffn
    monkeypatch.setattr(kb, "moe_ffn", lambda *a, **k: real(*a, **k) * 2)
    rc = kb.main(["--smoke", "--T", "5", "--formats", "BF16", "--reps", "1",
                  "--out", str(tmp_path)])
    assert rc == 1 and not list(tmp_path.glob("*.csv"))


def test_unfit_shape_format_is_skipped_with_a_reason():
    """Q4_K's 256-weight blocks do not tile seed-512e's F=640: the grid skips the pair, naming
    why, instead of aborting the whole grid there."""
    kb = _load()
    why = kb.supported("Q4_K", kb.SHAPES["seed-512e"])
    assert why and "F=640" in why
    assert kb.supported("Q4_K", kb.SHAPES["qwen3-30b-a3b"]) is None


def test_decoded_dot_ab_smoke(tmp_path):
    """experiments/decoded_dot_ab.py --smoke: the A/B runs only on a GPU session, so this run
    is what notices when a change breaks it."""
    import csv
    spec = importlib.util.spec_from_file_location("decoded_dot_ab",
                                                  ROOT / "experiments" / "decoded_dot_ab.py")
    ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ab)
    out = tmp_path / "dd.csv"
    assert ab.main(["--smoke", "--variants", "swap_fast_pf_w16_magic", "decode",
                    "--out", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert {r["variant"] for r in rows} >= {"grouped_mm-bf16", "swap_fast_pf_w16_magic", "decode"}
    assert all(float(r["rel_err"]) < 1.5e-2 for r in rows if r["rel_err"])
