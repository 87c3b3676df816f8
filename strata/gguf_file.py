"""Opening a GGUF file with gguf-py, its failures said in one line (the packer, the tokenizer
reader and `strata verify --source` open GGUFs through it)."""
from __future__ import annotations

import struct

from strata.errors import StrataError

# What gguf-py raises on a corrupted or truncated file (a wrong length or count, a bad type
# code, a string that is not UTF-8): the file's fault, said in one line.
READ_ERRORS = (ValueError, OSError, KeyError, IndexError, OverflowError, MemoryError, TypeError,
               AssertionError, struct.error)


def open_gguf(path):
    """A gguf.GGUFReader of `path` (memory-mapped, read-only); one line when it is another kind
    of file or unreadable."""
    import gguf
    from strata import filekind
    other = filekind.not_a(path, filekind.GGUF)
    if other:
        raise StrataError(other)
    try:
        return gguf.GGUFReader(str(path), "r")
    except READ_ERRORS as e:
        raise StrataError(f"{path} is not a readable GGUF file ({short_error(e)}); truncated or "
                          f"corrupted") from None


def short_error(e: BaseException) -> str:
    """An exception's first line, at most 120 characters (for one-line refusals)."""
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    return text if len(text) <= 120 else text[:117] + "..."
