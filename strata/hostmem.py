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


def on_tmpfs(path, mounts="/proc/self/mounts") -> bool:
    """Whether `path` lies on a tmpfs (/dev/shm and the like: its pages are host memory already,
    not a disk's cache the kernel may drop), from the longest mount point above it in the mount
    table `mounts`; False where the OS does not say."""
    try:
        real = os.path.realpath(path)
        best, kind = "", ""
        with open(mounts) as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mnt = parts[1].replace("\\040", " ")
                inside = real == mnt or real.startswith(mnt.rstrip("/") + "/")
                if inside and len(mnt) >= len(best):
                    best, kind = mnt, parts[2]
        return kind == "tmpfs"
    except OSError:
        return False
