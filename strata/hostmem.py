"""Host memory available now, asked of the OS without torch (strata.engine.early reads ahead
before torch is imported; strata.budget checks every plan against the same figure)."""
from __future__ import annotations

import os


def host_available() -> int | None:
    """Bytes of host memory available now (None when the OS does not say)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
