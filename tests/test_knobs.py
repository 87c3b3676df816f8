"""Every STRATA_* variable read in strata/ is in config.py (table, KNOBS) and in docs/knobs.md."""
import re
from pathlib import Path

import strata.config as config

ROOT = Path(__file__).resolve().parents[1]
NAME = re.compile(r"\bSTRATA_[A-Z0-9_]+\b")


def _table(text: str) -> list[str]:
    """The knob rows of a markdown table (lines starting with '| <VARIABLE>')."""
    return [line.strip() for line in text.splitlines()
            if re.match(r"\|\s*[A-Z][A-Z0-9_]+\s*\|", line.strip())]


def _used() -> set[str]:
    return {n for p in (ROOT / "strata").rglob("*.py") for n in NAME.findall(p.read_text())}


def test_the_scan_finds_the_known_knobs():
    # guards the regex: a scan that finds nothing would make the next test vacuous
    assert {"STRATA_PREFILL_RING", "STRATA_PF_FUSED", "STRATA_MMQ_SLAB"} <= _used()


def test_every_strata_variable_is_documented():
    table = " ".join(_table(config.__doc__))
    docs = (ROOT / "docs" / "knobs.md").read_text()
    for name in sorted(_used()):
        assert name in config.KNOBS, f"{name} is read in strata/ but missing from config.KNOBS"
        assert f"| {name} " in table, f"{name} is missing from strata/config.py's docstring table"
        assert f"| {name} " in docs, f"{name} is missing from docs/knobs.md"


def test_docs_table_is_config_table():
    docs = _table((ROOT / "docs" / "knobs.md").read_text())
    assert docs == _table(config.__doc__), "docs/knobs.md's table differs from strata/config.py's"
    assert [r.split("|")[1].strip() for r in docs] == list(config.KNOBS)
