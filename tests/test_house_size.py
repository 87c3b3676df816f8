"""The house's size: no file in strata/ over MAX_LINES lines (split by job, not squeezed), and no
block of more than MAX_REPEAT lines written twice inside strata/ (one shared helper instead).

A block is compared on its normalised lines: each stripped, with blank lines, comments,
docstrings and import statements dropped; every window of MAX_REPEAT + 1 consecutive normalised
lines of every strata/*.py file is hashed, and a window met twice (in one file or two) fails,
naming both places. Identical text only: a block copied and renamed is not caught."""
from __future__ import annotations

import ast
import hashlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "strata"
MAX_LINES = 500
MAX_REPEAT = 12

# Repeats still in strata/ (first place, second place: "path:line"), each to become one shared
# helper. The test fails when a listed one is gone, so the list only shrinks.
REPEATS_ALLOWED: set[tuple[str, str]] = set()


def normalised(text: str) -> list[tuple[int, str]]:
    """(line number, stripped text) of the lines a repeat is judged on."""
    tree = ast.parse(text)
    dropped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            dropped.update(range(node.lineno, node.end_lineno + 1))
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            dropped.update(range(body[0].lineno, body[0].end_lineno + 1))
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if s and not s.startswith("#") and i not in dropped:
            out.append((i, s))
    return out


def repeats(files: dict[str, str], window: int = MAX_REPEAT + 1) -> list[tuple[str, str]]:
    """(first place, second place) of every window of `window` normalised lines met twice;
    `files`: name -> text. Overlapping windows of one repeated block are reported once, at the
    block's first line."""
    seen: dict[str, str] = {}
    out: list[tuple[str, str]] = []
    last: tuple[str, str] | None = None
    for name in sorted(files):
        lines = normalised(files[name])
        last = None
        for k in range(len(lines) - window + 1):
            key = hashlib.sha1("\n".join(s for _, s in lines[k:k + window]).encode()).hexdigest()
            here = f"{name}:{lines[k][0]}"
            if key not in seen:
                seen[key] = here
                last = None
                continue
            if last is None or not _follows(last, (seen[key], here)):
                out.append((seen[key], here))
            last = (seen[key], here)
    return out


def _follows(prev: tuple[str, str], cur: tuple[str, str]) -> bool:
    """`cur` is the next window of the repeat `prev` (both places in the same files)."""
    return all(p.rpartition(":")[0] == c.rpartition(":")[0] for p, c in zip(prev, cur))


def _sources() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for p in sorted(PKG.rglob("*.py"))}


def test_no_file_over_the_limit():
    big = {name: n for name, text in _sources().items()
           if (n := len(text.splitlines())) > MAX_LINES}
    assert not big, f"over {MAX_LINES} lines (split by job): {big}"


def test_the_detector_sees_a_repeat():
    block = "".join(f"x{i} = f(y, {i})\n" for i in range(MAX_REPEAT + 1))
    short = "".join(f"x{i} = f(y, {i})\n" for i in range(MAX_REPEAT))
    noise = '"""doc"""\nimport os\n# a comment\n\n'
    assert repeats({"a.py": block, "b.py": noise + block.replace("\n", "  \n")}) == [
        ("a.py:1", "b.py:5")]
    longer = block + "".join(f"v{i} = g({i})\n" for i in range(3))
    assert repeats({"a.py": longer + "z = 1\n", "b.py": "w = 0\n" + longer}) == [
        ("a.py:1", "b.py:2")]       # one report per repeated block, not one per window
    assert repeats({"a.py": short, "b.py": short}) == []


def test_no_block_repeated():
    found = set(repeats(_sources()))
    new = sorted(found - REPEATS_ALLOWED)
    assert not new, ("blocks of more than %d lines written twice (make one shared helper):\n  "
                     % MAX_REPEAT + "\n  ".join(f"{a}  ==  {b}" for a, b in new))
    assert sorted(REPEATS_ALLOWED - found) == [], "gone: strike them from REPEATS_ALLOWED"
