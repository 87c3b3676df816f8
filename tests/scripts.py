"""Load a script of benchmarks/ or experiments/ as a module (they are scripts, not a package)."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_script(rel: str):
    """The module of the script at `rel` (from the repository root), freshly executed."""
    path = ROOT / rel
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
