"""What a file is, from its first bytes: GGUF, strata pack, safetensors, NumPy .npy, or other.

Every error about a file of the wrong kind names the kind it found ("x.gguf is a GGUF file, not
a pack: run strata pack x.gguf -o x.pack first"), and the output checks (strata.atomic) refuse to
write one kind of file over another. Reading the kind costs one small read: the first 8 bytes,
plus, for a safetensors file, its header up to the strata metadata key.
"""
from __future__ import annotations

import struct
from pathlib import Path

GGUF, PACK, SAFETENSORS, NPY, FOLDER, EMPTY, OTHER, MISSING = (
    "gguf", "pack", "safetensors", "npy", "folder", "empty", "other", "missing")

NAMES = {GGUF: "a GGUF file", PACK: "a strata pack",
         SAFETENSORS: "a safetensors file without strata pack metadata",
         NPY: "a NumPy .npy file", FOLDER: "a folder", EMPTY: "an empty file",
         OTHER: "not a GGUF, pack, safetensors or .npy file", MISSING: "missing"}

_GGUF_MAGIC = b"GGUF"
_NPY_MAGIC = b"\x93NUMPY"
_PACK_KEY = b'"strata.pack"'
_SNIFF_HEADER = 1 << 20   # bytes of a safetensors header searched for the pack key
MAX_HEADER = 256 << 20    # a pack header beyond this is corruption, not a model


def kind(path) -> str:
    """One of GGUF, PACK, SAFETENSORS, NPY, FOLDER, EMPTY, OTHER, MISSING."""
    p = Path(path)
    if p.is_dir():
        return FOLDER
    if not p.exists():
        return MISSING
    try:
        with open(p, "rb") as f:
            head = f.read(8)
            if not head:
                return EMPTY
            if head.startswith(_GGUF_MAGIC):
                return GGUF
            if head.startswith(_NPY_MAGIC):
                return NPY
            if len(head) == 8:
                (n,) = struct.unpack("<Q", head)
                first = f.read(1)
                if 2 <= n <= (256 << 20) and first == b"{":
                    f.seek(8)
                    return PACK if _PACK_KEY in f.read(min(n, _SNIFF_HEADER)) else SAFETENSORS
    except OSError:
        return OTHER
    return OTHER


def describe(path) -> str:
    """'a GGUF file', 'a strata pack', ... for messages."""
    return NAMES[kind(path)]


def not_a(path, wanted: str) -> str | None:
    """A one-line reason when `path` is a known kind other than `wanted`, with what to run;
    None when it is `wanted` or its kind is unknown (the reader then says what is wrong)."""
    k = kind(path)
    if k == wanted or k in (OTHER, EMPTY, MISSING):
        return None
    what = {PACK: "a pack", GGUF: "a GGUF file"}.get(wanted, wanted)
    hint = {
        (GGUF, PACK): f": run `strata pack {path} -o {Path(path).with_suffix('.pack')}` first",
        (PACK, GGUF): ": it is already packed; strata plan/prefill/verify read it directly",
        (SAFETENSORS, PACK): ": give its Hugging Face folder to `strata pack DIR -o OUT.pack`",
        (NPY, PACK): " (perhaps logits from --dump-logits)",
        (FOLDER, PACK): ": a Hugging Face folder is packed with `strata pack DIR -o OUT.pack`",
    }.get((k, wanted), "")
    return f"{path} is {NAMES[k]}, not {what}{hint}"
