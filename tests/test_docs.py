"""docs/ stay in step with the code: every CLI flag and preset is on docs/cli.md, every link
resolves."""
import re
from pathlib import Path

import pytest

from strata.cli import COMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _subparsers():
    p = build_parser()
    (action,) = [a for a in p._actions if a.__class__.__name__ == "_SubParsersAction"]
    return action.choices


@pytest.mark.parametrize("command", COMMANDS)
def test_every_flag_is_documented(command):
    text = (DOCS / "cli.md").read_text()
    section = text.split(f"## strata {command}\n", 1)
    assert len(section) == 2, f"docs/cli.md has no '## strata {command}' section"
    body = section[1].split("\n## ", 1)[0]
    sp = _subparsers()[command]
    for action in sp._actions:
        for opt in action.option_strings:
            if opt in ("-h", "--help"):
                continue
            assert f"`{opt}" in body or f" {opt}`" in body or f"`{opt}`" in body, \
                f"strata {command} {opt} is not on docs/cli.md"


def test_relative_links_resolve():
    for page in DOCS.glob("*.md"):
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.name} links to missing {target}"


def test_every_preset_is_listed():
    """docs/cli.md's `--preset` row names every preset but the tiny-<arch> ones (which it names
    as a group): a preset added to strata.shapes lands there too."""
    from strata.shapes import PRESETS
    doc = (ROOT / "docs" / "cli.md").read_text()
    row = re.search(r"`strata\.shapes\.PRESETS`: ([^;]*);", doc).group(1)
    listed = {n.strip() for n in row.replace(" and a tiny-<arch> per architecture", "").split(",")}
    assert listed == {n for n in PRESETS if not n.startswith("tiny-")}
