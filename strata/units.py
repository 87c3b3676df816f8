"""Byte sizes as people write them: 12GiB, 800MiB, 1.5GB, 4096."""
from __future__ import annotations

import re

from strata.errors import StrataError

_UNITS = {"": 1, "b": 1,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Bytes in `text` ('12GiB', '800MiB', '1.5GB', '4096'); a clear error otherwise."""
    if isinstance(text, int):
        return text
    m = _RE.match(str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise StrataError(f"cannot read size {text!r}: write bytes or a number with a unit "
                          f"(B, KiB, MiB, GiB, TiB, KB, MB, GB, TB), e.g. 12GiB or 800MiB")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def fmt_bytes(n: int) -> str:
    """Bytes for a human: '506.25 MiB'."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"
