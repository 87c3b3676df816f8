"""benchmarks/dequant_bench.py runs end to end (--smoke: tiny shapes, the interpreter on a CPU)."""

import pytest

from strata import bench
from tests.scripts import load_script


def _load():
    return load_script("benchmarks/dequant_bench.py")


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_dequant_bench_smoke(tmp_path):
    argv = ["--smoke", "--formats", "Q8_0,IQ3_S", "--out-dtypes", "bf16,fp32", "--out-dir",
            str(tmp_path), "--decoders", "elem,runs"]
    assert _load().main(argv) == 0
    (csv_path,) = tmp_path.glob("dequant-*-smoke.csv")
    assert csv_path.with_suffix(".png").stat().st_size > 0
    rows = [r for r in bench.read_csv(csv_path) if r["figure"] == "dequantize rate"]
    got = [(r["config"]["format"], r["config"]["out_dtype"], r["config"]["decoder"]) for r in rows]
    assert got == [(f, d, dec) for f in ("Q8_0", "IQ3_S") for d in ("bfloat16", "float32")
                   for dec in ("elem", "runs")]
    for r in rows:
        assert r["commit"] and r["gpu"] and "--smoke" in r["config"]["command"]
        assert r["gate"].startswith("bit-exact") and r["bound"].startswith("4.19 TB/s")
        # bytes moved: the blocks read + the matrix written (8 x 256 weights in smoke mode)
        c = r["config"]
        assert c["bytes_written"] == 8 * 256 * (2 if c["out_dtype"] == "bfloat16" else 4)
        assert r["value"] > 0 and r["unit"] == "GB/s"


def test_dequant_bench_refuses_a_wrong_kernel(tmp_path, monkeypatch):
    mod = _load()
    monkeypatch.setattr(mod, "dequantize", lambda raw, fmt, dtype, tiles=None:
                        mod.dequantize_torch(raw, fmt, dtype) + 1)
    assert mod.main(["--smoke", "--formats", "Q8_0", "--out-dir", str(tmp_path)]) == 1
    assert not list(tmp_path.glob("*.csv"))


def test_dequant_bench_experts_smoke(tmp_path):
    """--mode experts: the decode-once paths of one format, input/output GB/s beside the copy."""
    argv = ["--smoke", "--mode", "experts", "--formats", "Q4_K", "--sb-tiles", "64x1",
            "--out-dir", str(tmp_path)]
    assert _load().main(argv) == 0
    (csv_path,) = tmp_path.glob("dequant-experts-*-smoke.csv")
    assert csv_path.with_suffix(".png").stat().st_size > 0
    rows = bench.read_csv(csv_path)
    assert [r["figure"] for r in rows].count("copy rate measured") == 1
    rates = [r for r in rows if r["figure"] == "decode-once input rate"]
    assert [(r["config"]["path"], r["config"]["tile_rows"], r["config"]["tile_superblocks"])
            for r in rates] == [("bytes", 64, 0), ("superblocks", 64, 1)]
    for r in rates:
        c = r["config"]
        assert c["bytes_read"] == 2 * 8 * 144 and c["bytes_written"] == 2 * 8 * 256 * 2
        assert r["gate"].startswith("bit-exact") and r["value"] > 0 and r["unit"] == "GB/s"


def test_dequant_bench_word_tiles(tmp_path):
    """--word-tiles: one row per Q8_0 word-path tile, each gated bit for bit before it is timed."""
    argv = ["--smoke", "--mode", "experts", "--formats", "Q8_0", "--paths", "words",
            "--word-tiles", "64x64,16x256", "--out-dir", str(tmp_path)]
    assert _load().main(argv) == 0
    (csv_path,) = tmp_path.glob("dequant-experts-*-smoke.csv")
    rates = [r for r in bench.read_csv(csv_path) if r["figure"] == "decode-once input rate"]
    assert [(r["config"]["path"], r["config"]["tile_rows"], r["config"]["tile_cols"])
            for r in rates] == [("words", 64, 64), ("words", 16, 256)]


def test_dequant_bench_experts_refuses_a_wrong_kernel(tmp_path, monkeypatch):
    mod = _load()
    monkeypatch.setattr(mod, "dequantize_torch", lambda raw, fmt, dtype:
                        dequant_torch_plus_one(mod, raw, fmt, dtype))
    argv = ["--smoke", "--mode", "experts", "--formats", "Q4_K", "--paths", "superblocks",
            "--sb-tiles", "64x1", "--out-dir", str(tmp_path)]
    assert mod.main(argv) == 1
    assert not list(tmp_path.glob("*.csv"))


def dequant_torch_plus_one(mod, raw, fmt, dtype):
    from strata.kernels import dequantize_torch
    return dequantize_torch(raw, fmt, dtype) + 1


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_dequant_bench_mxfp4_stream(tmp_path):
    """MXFP4 in --mode experts: the byte path, then its stream of words at each --stream-blocks
    size, each gated bit for bit before it is timed."""
    argv = ["--smoke", "--mode", "experts", "--formats", "MXFP4", "--paths", "bytes,words",
            "--stream-blocks", "16,64", "--out-dir", str(tmp_path)]
    assert _load().main(argv) == 0
    (csv_path,) = tmp_path.glob("dequant-experts-*-smoke.csv")
    rates = [r for r in bench.read_csv(csv_path) if r["figure"] == "decode-once input rate"]
    assert [(r["config"]["path"], r["config"]["tile_blocks"]) for r in rates] == [
        ("bytes", 0), ("words", 16), ("words", 64)]
    assert rates[0]["config"]["bytes_read"] == 2 * 8 * 8 * 17


def test_dequant_bench_expert_shape_must_be_whole_blocks(capsys):
    """gpt-oss's width (2880) is whole MXFP4 blocks, not whole Q4_K super-blocks: one line."""
    argv = ["--mode", "experts", "--formats", "MXFP4,Q4_K", "--expert-shape", "4,2880,2880"]
    assert _load().main(argv) == 2
    assert "not whole Q4_K blocks" in capsys.readouterr().err
