"""Outputs that are whole or absent, and never land on something they should not.

    out = check_output(args.out, "-o", kind=PACK, inputs=[src], force=args.force)   # before work
    with atomic_write(out) as tmp:      # a temp file in the target's folder
        write(tmp)                      # renamed onto `out` only when this block succeeds

`check_output` runs before any work (so a bad path fails in a second, not after the prompt):
the folder must exist and be writable, the path must not be a folder, must not be one of the
command's inputs, and must not hold an existing file of another kind (magic bytes,
strata.filekind) unless `force`. `atomic_write` removes its temp file on any failure (a full disk
included) and turns the OS error into one line naming the path.
"""
from __future__ import annotations

import errno
import os
from contextlib import contextmanager
from pathlib import Path

from strata import filekind
from strata.errors import StrataError


def _same(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def check_output(path, flag: str, *, kind: str | None = None, inputs=(), force: bool = False
                 ) -> Path:
    """`path` as a Path when writing there is safe; a one-line StrataError otherwise."""
    p = Path(path)
    if str(path) == "" or p.name in ("", ".", ".."):
        raise StrataError(f"{flag} {str(path)!r} is not a file name; give a file path")
    if p.is_dir():
        raise StrataError(f"{flag} {p} is a folder; give a file path inside it "
                          f"(e.g. {p / ('out.' + (kind or 'out'))})")
    parent = p.parent
    if not parent.is_dir():
        what = "is not a folder" if parent.exists() else "does not exist"
        raise StrataError(f"{flag} {p}: the folder {parent} {what}; create it or give another path")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise StrataError(f"{flag} {p}: the folder {parent} is not writable; give another path")
    if p.exists() and not os.access(p, os.W_OK):
        raise StrataError(f"{flag} {p}: the file exists and is not writable; give another path")
    for src in inputs:
        if src is not None and _same(p, Path(src)):
            if not force:
                raise StrataError(f"{flag} {p} is the input itself ({filekind.describe(p)}); "
                                  f"writing there would replace it: give another path or --force")
    if kind is not None and p.exists() and not force:
        found = filekind.kind(p)
        if found not in (kind, filekind.EMPTY):
            raise StrataError(f"{flag} {p} already exists and is {filekind.NAMES[found]}; this "
                              f"writes {filekind.NAMES.get(kind, kind)}: give another path or "
                              f"--force to replace it")
    return p


def tmp_path(path) -> Path:
    """The temp name beside `path` (same folder, so the rename is atomic; same suffix)."""
    p = Path(path)
    return p.with_name(f".{p.name}.{os.getpid()}.partial{p.suffix}")


def os_error_line(e: OSError, path=None) -> str:
    """One line for an OS error (while writing `path`, when given)."""
    where = path or e.filename
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        what = "no space left on the device" if e.errno == errno.ENOSPC else "disk quota exceeded"
        return (f"{what} while writing {where or 'an output'}; the partial file was removed: "
                f"free space or write elsewhere")
    if path is not None:
        return f"cannot write {path}: {e.strerror or e}"
    return f"{e.strerror or e}" + (f": {where}" if where else "")


@contextmanager
def atomic_write(path):
    """Yield a temp path beside `path`; on success rename it onto `path`, on failure remove it."""
    p = Path(path)
    tmp = tmp_path(p)
    try:
        yield tmp
        os.replace(tmp, p)
    except OSError as e:
        _unlink(tmp)
        raise StrataError(os_error_line(e, p)) from None
    except BaseException:
        _unlink(tmp)
        raise


def _unlink(p: Path) -> None:
    try:
        p.unlink()
    except FileNotFoundError:
        pass
