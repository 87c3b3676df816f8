"""A transformers wheel cut to what a GGUF's tokenizer needs, for the device calls' carry.

The device image's transformers (5.17) rebuilds no tokenizer from a GGUF, so llama_cpp.sh puts a
carried 5.24 wheel first on its steps' path. The whole wheel (13.5 MB) with the prebuilt llama.cpp
tools and the tree passes the 64 MiB a call carries; the model folders are most of it, and the GGUF
integration imports only a few tokenizers. This keeps `models/auto` and the folders
`transformers/integrations/gguf/` imports (read from its source, not listed here), drops the rest,
and rewrites RECORD so pip installs the result:

    pip download --no-deps -d /tmp/tw transformers==5.24.0
    python benchmarks/text_wheel.py /tmp/tw/transformers-5.24.0-py3-none-any.whl .whl-text/

Models built from transformers' own classes (the HF-folder tests) need the whole wheel: the cut one
serves synth, pack and the tokenizer of strata's text paths only.
"""
from __future__ import annotations

import base64
import hashlib
import re
import sys
import zipfile
from pathlib import Path

GGUF_DIR = "transformers/integrations/gguf/"
IMPORT = re.compile(r"from \.\.\.models\.([a-z0-9_]+)")


def kept_models(z: zipfile.ZipFile) -> set[str]:
    """The model folders the GGUF integration imports, and auto."""
    names = {"auto"}
    for n in z.namelist():
        if n.startswith(GGUF_DIR) and n.endswith(".py"):
            names.update(IMPORT.findall(z.read(n).decode()))
    return names


def keep(name: str, models: set[str]) -> bool:
    parts = name.split("/")
    if parts[:2] != ["transformers", "models"] or len(parts) < 4:
        return True     # outside models/, or models/__init__.py
    return parts[2] in models


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or not argv[0].endswith(".whl"):
        print("usage: python benchmarks/text_wheel.py TRANSFORMERS.whl OUT_DIR", file=sys.stderr)
        return 2
    src, out_dir = Path(argv[0]), Path(argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    dst = out_dir / src.name
    tmp = dst.with_suffix(".whl.part")
    try:
        z = zipfile.ZipFile(src)
    except (OSError, zipfile.BadZipFile) as e:
        print(f"text_wheel: cannot read {src} as a wheel ({e}); give transformers' .whl",
              file=sys.stderr)
        return 2
    with z:
        models = kept_models(z)
        record = next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))
        names = [n for n in z.namelist() if n != record and not n.endswith("/") and keep(n, models)]
        lines = []
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as w:
            for n in names:
                data = z.read(n)
                w.writestr(n, data)
                lines.append(record_line(n, data))
            w.writestr(record, "\n".join(lines + [f"{record},,"]) + "\n")
    tmp.replace(dst)    # whole or not at all
    print(f"{dst}: {dst.stat().st_size / 1e6:.1f} MB (models kept: {', '.join(sorted(models))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
