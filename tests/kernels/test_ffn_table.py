"""The expert-FFN table `--experts auto` reads: the packaged ffn_table.json is what
strata.bench.ffn_table derives from the kernel_bench CSVs it names (one source: the
measurement), and FfnTable's choice follows the rates (interpolation in log2 rows, FLOP shares,
the proxy of an unmeasured format, the fallback GPU) on tables made here."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from strata.bench.ffn_table import derive
from strata.errors import StrataError
from strata.kernels.moe.choices import TABLE, FfnTable, decode_class

ROOT = Path(__file__).resolve().parents[2]


def test_the_packaged_table_is_derived_from_its_csvs():
    t = json.loads(TABLE.read_text())
    csvs = [ROOT / s["csv"] for s in t["sources"]]
    assert csvs and all(p.exists() for p in csvs)
    assert derive(csvs, root=ROOT) == t


def test_every_measured_point_chooses_its_faster_path():
    """At a measured point (one of the table's own), the choice is the path with more TFLOP/s."""
    t = FfnTable.load()
    for gpu, fmts in t.gpus.items():
        for fmt, pts in fmts.items():
            rows = [p["rows"] for p in pts]
            for p in pts:
                if rows.count(p["rows"]) > 1 or not {"kernel", "decoded"} <= set(p["tflops"]):
                    continue
                k, d = p["tflops"]["kernel"], p["tflops"]["decoded"]
                if k != d:
                    assert t.choose(gpu, [(fmt, 1.0)], p["rows"]) == \
                        ("kernel" if k > d else "decoded"), (gpu, fmt, p)


def _table(**curves):
    return FfnTable({"G": {f: [{"rows": r, "tflops": dict(zip(("kernel", "decoded"), kd))}
                               for r, kd in pts] for f, pts in curves.items()}},
                    ({"commit": "abc1234", "csv": "x.csv", "gpu": "G"},))


def test_rates_interpolate_in_log_rows_and_hold_at_the_ends():
    t = _table(Q8_0=[(16, (10.0, 2.0)), (256, (50.0, 100.0))])
    assert t.rate("G", "Q8_0", "kernel", 64) == pytest.approx(10 + 40 * math.log2(4) / 4)
    assert t.rate("G", "Q8_0", "kernel", 1) == 10.0 and t.rate("G", "Q8_0", "kernel", 4096) == 50.0
    # u of the way from 16 to 256 rows (in log2): kernel 10 + 40u, decoded 2 + 98u, equal at
    # u = 8 / 58
    cross = 16 * 2 ** (4 * 8 / 58)
    assert t.choose("G", [("Q8_0", 1.0)], cross * 0.95) == "kernel"
    assert t.choose("G", [("Q8_0", 1.0)], cross * 1.05) == "decoded"
    # below the fewest rows measured, the table says nothing: the fused kernel, even where the
    # first point's decoded figure is higher
    low = _table(Q4_K=[(32, (8.0, 24.0)), (128, (30.0, 110.0))])
    assert low.choose("G", [("Q4_K", 1.0)], 32) == "decoded"
    assert low.choose("G", [("Q4_K", 1.0)], 31) == "kernel"


def test_a_pass_of_two_formats_weighs_each_by_its_flop_share():
    """Time = sum(share / rate): A's kernel is 2x faster, B's decoded 4x faster."""
    t = _table(Q8_0=[(64, (20.0, 10.0))], Q4_K=[(64, (10.0, 40.0))])
    # kernel: 2/3/20 + 1/3/10 = 0.0667; decoded: 2/3/10 + 1/3/40 = 0.075 -> kernel
    assert t.choose("G", [("Q8_0", 2 / 3), ("Q4_K", 1 / 3)], 64) == "kernel"
    # kernel: 1/3/20 + 2/3/10 = 0.0833; decoded: 1/3/10 + 2/3/40 = 0.05 -> decoded
    assert t.choose("G", [("Q8_0", 1 / 3), ("Q4_K", 2 / 3)], 64) == "decoded"


def test_unmeasured_formats_and_gpus_take_their_class_and_the_first_gpu():
    t = _table(Q8_0=[(64, (20.0, 10.0))], Q4_K=[(64, (10.0, 40.0))],
               IQ3_S=[(64, (1.0, 4.0)), (128, (1.0, 4.0))])
    assert decode_class("Q6_K") == decode_class("Q4_K") == "kquant"
    assert t.proxy("G", "Q6_K") == "Q4_K" and t.proxy("G", "Q4_0") == "Q8_0"
    assert t.proxy("G", "IQ4_XS") == "IQ3_S"
    assert t.proxy("G", "MXFP4") == "IQ3_S"          # no mx format measured: the most points
    assert t.gpu("Other GPU") == "G"
    line = t.describe("Other GPU", ["Q4_K", "Q6_K"])
    assert "no table for Other GPU" in line and "Q6_K as Q4_K" in line and "abc1234" in line


def test_a_format_another_gpu_measured_takes_that_curve():
    """MXFP4 measured on H only: G reads H's MXFP4 points (not G's proxy of the mx class), says
    so, and chooses by them; a format no GPU measured still takes G's proxy."""
    t = _table(Q8_0=[(64, (20.0, 10.0))], IQ3_S=[(64, (1.0, 4.0)), (128, (1.0, 4.0))])
    t.gpus["H"] = {"MXFP4": [{"rows": 64.0, "tflops": {"kernel": 30.0, "decoded": 5.0}}]}
    assert t.curve("G", "MXFP4") == ("H", "MXFP4") and t.curve("G", "Q8_0") == ("G", "Q8_0")
    assert t.curve("G", "IQ4_XS") == ("G", "IQ3_S")
    assert t.rate("G", "MXFP4", "kernel", 64) == 30.0
    assert t.choose("G", [("MXFP4", 1.0)], 64) == "kernel"      # IQ3_S's curve says decoded
    assert "MXFP4 (measured on H)" in t.describe("G", ["MXFP4"])


def test_a_missing_or_empty_table_is_one_line(tmp_path):
    with pytest.raises(StrataError, match="experiments/ffn_table.py"):
        FfnTable.load(tmp_path / "none.json")
    (tmp_path / "e.json").write_text('{"gpus": {}}')
    with pytest.raises(StrataError, match="holds no GPU"):
        FfnTable.load(tmp_path / "e.json")


def test_the_script_remakes_the_table_from_recorded_csvs(tmp_path, capsys):
    """experiments/ffn_table.py --from: the packaged table's own CSVs give the packaged table;
    a CSV that is not there is one line, exit 2, nothing written."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("ffn_table_script",
                                                  ROOT / "experiments" / "ffn_table.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    t = json.loads(TABLE.read_text())
    out = tmp_path / "t.json"
    assert script.main(["--from", *[str(ROOT / s["csv"]) for s in t["sources"]],
                        "--table", str(out), "--out", str(tmp_path)]) == 0
    assert json.loads(out.read_text()) == t
    assert script.main(["--from", str(tmp_path / "no.csv"), "--table",
                        str(tmp_path / "u.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("ffn_table: no such CSV") and not (tmp_path / "u.json").exists()
