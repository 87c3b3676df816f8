"""experiments/ring_table.py reproduces the SPEC table cell by cell; scan_ab.py runs end to end."""
import importlib.util
from pathlib import Path

import pytest

from strata import bench

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT.parent / "shared" / "SPEC.md"   # ../shared beside the checkout (workspace and CI)

# The SPEC's "Memory" reference table, cell by cell (pack, max_blob, pinned, unpinned, fused).
EXPECTED = [
    ("Q2_0 (not native)", "1,382,400", "384", "96", "1024"),
    ("IQ3_S (native)", "2,663,424", "199", "49", "531 → cap 512"),
    ("Q8_0 (native)", "5,222,400", "101", "25", "271"),
]


def _load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "experiments" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("row", range(3), ids=["Q2_0", "IQ3_S", "Q8_0"])
def test_ring_table_every_cell(row):
    got = _load("ring_table").rows()[row]
    assert tuple(got.values()) == EXPECTED[row]


def test_ring_table_matches_spec_text():
    if not SPEC.exists():
        pytest.skip("SPEC.md is not beside this checkout")
    text = SPEC.read_text()
    for pack, blob, pinned, unpinned, fused in EXPECTED:
        line = next(l.strip() for l in text.splitlines() if l.strip().startswith(f"| {pack} |"))
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[1:] == [blob, pinned, unpinned, fused], line


def test_scan_ab_writes_csv_and_png(tmp_path, monkeypatch):
    mod = _load("scan_ab")
    monkeypatch.setattr(mod, "VRAM_GIB", [5, 12])
    monkeypatch.setattr(mod, "CASES", {"qwen3-30b-a3b": ["Q8_0"]})
    assert mod.main(["--out", str(tmp_path)]) == 0
    rows = mod.pivot(bench.read_csv(tmp_path / "scan_ab.csv"))
    assert {r["rule"] for r in rows} == {"legacy", "auto"} and len(rows) == 4
    auto5 = next(r for r in rows if r["rule"] == "auto" and r["vram_gib"] == 5)
    assert auto5["status"] == "ok" and int(auto5["probes"]) == 7
    assert (tmp_path / "scan_ab.png").stat().st_size > 10_000
