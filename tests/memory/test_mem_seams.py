"""strata.memory knows no model and no kernel: it imports none of their modules. It reads no
environment: it imports nothing of strata.config and never touches os.environ.

Everything it sizes from a model or a kernel (layout dims, KV bytes, dense bytes, workspace rows,
scratch reserve) arrives as numbers through strata.memory.sizes.Sizes and plan_prefill's
arguments, assembled outside by strata.planning; the launch choices arrive as a RingPolicy
(strata.config.ring_policy builds it at the edge).
"""
import ast
import subprocess
import sys
from pathlib import Path

import strata.memory

MEMORY = Path(strata.memory.__file__).parent
FORBIDDEN = ("strata.kernels", "strata.models", "strata.packs", "strata.shapes",
             "strata.planning", "strata.engine", "strata.config")


def _imports(path: Path) -> list[str]:
    """Every module an import statement in `path` names, lazy ones inside functions included."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append(node.module)
            out += [f"{node.module}.{a.name}" for a in node.names]
    return out


def _forbidden(name: str) -> bool:
    return any(name == f or name.startswith(f + ".") for f in FORBIDDEN)


def test_no_memory_module_imports_a_model_or_kernel_module():
    files = sorted(MEMORY.glob("*.py"))
    assert len(files) >= 9
    bad = {p.name: [m for m in _imports(p) if _forbidden(m)] for p in files}
    assert {k: v for k, v in bad.items() if v} == {}


def test_no_memory_module_reads_the_environment():
    """No `os.environ` / `os.getenv` in memory (strata.config is a FORBIDDEN import): the knobs
    reach it as a RingPolicy argument, read by the caller when a plan or a prompt starts."""
    bad = {}
    for p in sorted(MEMORY.glob("*.py")):
        tree = ast.parse(p.read_text(), str(p))
        hits = [ast.unparse(n) for n in ast.walk(tree)
                if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                and n.value.id == "os" and n.attr in ("environ", "getenv", "environb")]
        if hits:
            bad[p.name] = hits
    assert bad == {}


def test_importing_memory_loads_no_model_or_kernel_module():
    code = ("import sys, strata.memory; "
            "print('\\n'.join(m for m in sys.modules if m.startswith('strata.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=MEMORY.parents[1]).stdout.split()
    assert "strata.memory.scan" in out
    assert [m for m in out if _forbidden(m)] == []


def test_the_scan_sees_lazy_imports(tmp_path):
    """The scan itself can fail: an import inside a function body is seen."""
    f = tmp_path / "m.py"
    f.write_text("import strata.units\n\ndef f():\n    from strata.kernels import tiles\n")
    assert [m for m in _imports(f) if _forbidden(m)] == ["strata.kernels", "strata.kernels.tiles"]
