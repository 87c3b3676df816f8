"""benchmarks/ring_ab.py end to end on a tiny pack (CPU): the plan's ring and explicit rings, each
a `strata bench` process, gathered into one CSV and PNG; bad arguments and empty input refused."""
import csv

import pytest

from strata.packs.synth import ExpertFormats, synth_pack
from strata.shapes import get_preset
from tests.scripts import load_script


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    return str(synth_pack(tmp_path_factory.mktemp("r") / "t.pack", get_preset("tiny"),
                          ExpertFormats.of("Q8_0"), progress=False))


def test_ring_ab_reads_each_ring_and_gathers_them(pack, tmp_path):
    mod = load_script("benchmarks/ring_ab.py")
    out = tmp_path / "o"
    assert mod.main([pack, "--vram", "2GiB", "-p", "24", "-r", "1", "--rings", "3,5",
                     "--name", "t", "--out", str(out)]) == 0
    rows = list(csv.DictReader((out / "t.csv").open()))
    planned = int(rows[0]["ring"])
    assert [int(r["ring"]) for r in rows] == [planned, 3, 5]
    assert all(r["test"] == "pp24" and float(r["tokens_per_s"]) > 0 for r in rows)
    assert (out / "t.png").stat().st_size > 0
    # --from: the arms' own CSVs again, no reads
    arms = sorted(out.glob("ring_ab-t-24-*.csv"))
    assert len(arms) == 3
    assert mod.main(["--from", *map(str, arms), "--name", "again", "--out", str(out)]) == 0
    assert sorted(r["ring"] for r in csv.DictReader((out / "again.csv").open())) == \
        sorted(r["ring"] for r in rows)


def test_ring_ab_pins_the_pass_apart_from_the_ring(pack, tmp_path, capsys):
    """An arm R/B reads with --batch B (plan/B at the plan's ring): the rows say the pass the
    arm pinned, the plan's own arm none."""
    mod = load_script("benchmarks/ring_ab.py")
    assert mod.arms_of("64,plan/256,780/130") == [(64, None), (None, 256), (780, 130)]
    for bad in ("0", "plan", "x/2", "4/0"):
        with pytest.raises(ValueError):
            mod.arms_of(bad)
    out = tmp_path / "o"
    assert mod.main([pack, "--vram", "2GiB", "-p", "24", "-r", "1", "--rings", "plan/1,4/2",
                     "--name", "t", "--out", str(out)]) == 0
    said = [ln for ln in capsys.readouterr().out.splitlines()
            if ln.startswith("[ring_ab] strata.cli bench")]
    assert [("--ring 4" in ln, ln.split("--batch ")[1] if "--batch" in ln else "")
            for ln in said] == [(False, ""), (False, "1"), (True, "2")]
    rows = list(csv.DictReader((out / "t.csv").open()))
    assert [r["batch"] for r in rows] == ["", "1", "2"] and rows[2]["ring"] == "4"
    assert rows[0]["ring"] == rows[1]["ring"]      # plan/1: the plan's ring, passes of one


def test_ring_ab_refuses_what_it_cannot_read(tmp_path, capsys):
    mod = load_script("benchmarks/ring_ab.py")
    empty = tmp_path / "e.csv"
    empty.write_text("model,test\n")
    assert mod.main(["--from", str(empty), "--out", str(tmp_path)]) == 2
    assert "no bench rows" in capsys.readouterr().err
    assert mod.main(["--from", str(tmp_path / "gone.csv"), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot read" in err and "\n" not in err and not list(tmp_path.glob("*.png"))
    for bad in ([], ["x.pack", "--from", str(empty)], ["x.pack", "--rings", "a,b"]):
        with pytest.raises(SystemExit) as e:
            mod.main(bad)
        assert e.value.code == 2
