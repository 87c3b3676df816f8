"""The house's structure, read from strata's own imports (module level and inside functions,
and the modules importlib is told to load): no circle among its files, and no arrow that runs
back up, i.e. no circle among its rooms (a package such as strata.models, or a top-level module
such as strata.planning). A failure names the files whose imports close the circle."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "strata"


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in PKG.rglob("*.py")}


def _resolve(name: str) -> str | None:
    """The strata module an import of `name` loads (a name imported from a module: the module)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports(mod: str) -> dict[str, int]:
    """strata modules `mod` imports -> the line of the first import."""
    path = MODULES[mod]
    tree = ast.parse(path.read_text(), str(path))
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out: dict[str, int] = {}

    def add(name: str | None, line: int):
        target = _resolve(name) if name else None
        if target and target != mod and not mod.startswith(target + "."):
            out.setdefault(target, line)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                add(a.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[:len(pkg.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for a in node.names:
                full = f"{base}.{a.name}"
                add(full if full in MODULES else base, node.lineno)
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id",
              None)) in ("import_module", "__import__") and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            add(node.args[0].value, node.lineno)
    return out


def room(mod: str) -> str:
    """The room a module belongs to: its package under strata, or itself when top-level."""
    parts = mod.split(".")
    return ".".join(parts[:2])


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


EDGES = {m: imports(m) for m in MODULES}


def _ties(comp: list[str], key) -> list[str]:
    return [f"{MODULES[a].relative_to(ROOT)}:{line} -> {b}" for a, deps in sorted(EDGES.items())
            for b, line in deps.items() if key(a) in comp and key(b) in comp and key(a) != key(b)]


def test_the_reader_sees_the_imports():
    """The graph is read, not empty: the CLI reaches the engine, the engine the memory manager,
    function-level imports count."""
    assert "strata.engine.prefill" in EDGES["strata.commands.prefill"] or any(
        "strata.engine" in d for d in EDGES["strata.commands.prefill"])
    assert any(d.startswith("strata.memory") for d in EDGES["strata.engine.prefill"])
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


def test_no_circle_among_files():
    graph = {a: set(d) for a, d in EDGES.items()}
    bad = _cycles(graph)
    assert not bad, "\n".join(f"circle {c}:\n  " + "\n  ".join(_ties(c, lambda m: m))
                              for c in bad)


# Arrows still running back up, each named by the file and the room it reaches. The test fails
# when one is gone and still listed, so the list only shrinks.
BACK_UP: set[tuple[str, str]] = set()


def test_no_arrow_runs_back_up():
    graph: dict[str, set[str]] = {}
    seen = set()
    for a, deps in EDGES.items():
        for b in deps:
            if room(b) == room(a):
                continue
            if (a, room(b)) in BACK_UP:
                seen.add((a, room(b)))
                continue
            graph.setdefault(room(a), set()).add(room(b))
    bad = _cycles(graph)
    assert not bad, "\n".join(f"rooms {c} import each other:\n  " + "\n  ".join(_ties(c, room))
                              for c in bad)
    assert sorted(BACK_UP - seen) == [], "gone: strike them from BACK_UP"
