"""What a process held live on each GPU at its peak over a stretch of work: torch's allocated
bytes (the expert cache, dense weights, KV, and every transient a read allocates beside the
plan's carve; not the CUDA context nor the allocator's cached free blocks, which it releases and
retries before it fails), to set beside the budget it was planned for."""
from __future__ import annotations

import torch

from strata.units import fmt_bytes


class Peaks:
    """Starts counting at construction: `read()` -> each device's peak live bytes since (None
    for a device that is not CUDA)."""

    def __init__(self, devices):
        self.devices = [torch.device(d) for d in devices]
        for d in self.devices:
            if d.type == "cuda":
                torch.cuda.synchronize(d)
                torch.cuda.reset_peak_memory_stats(d)

    def read(self) -> list[int | None]:
        return [torch.cuda.max_memory_allocated(d) if d.type == "cuda" else None
                for d in self.devices]


def past_budget(names, peaks, vrams, what: str) -> list[str]:
    """One line for each device whose live peak passed its budget (`what`: the reads it was
    measured over, for the line)."""
    return [f"{name} held {fmt_bytes(peak)} live at its peak in {what}, past its --vram "
            f"{fmt_bytes(vram)}: allocations outside the plan (torch's, beside the cache) passed "
            f"the reserve"
            for name, peak, vram in zip(names, peaks, vrams) if peak is not None and peak > vram]


def live_at_peak(events, within: str = "/strata/", skip: tuple[str, ...] = ()
                 ) -> tuple[int, int, list[tuple[str, int, int]]]:
    """Replay one device's allocator trace (torch.cuda.memory._snapshot()["device_traces"][i]:
    events of `action` alloc / free_completed, with `addr`, `size` and the allocation's
    `frames`) -> (peak live bytes, the event index it came at, the blocks live there grouped
    by where they were allocated: (the innermost frame under `within`, count, bytes), the
    largest first). A free of a block allocated before the trace began is skipped, so the peak
    counts the trace's own allocations; so is every block allocated where a `skip` prefix names
    (a measurement beside the reads: bench's GEMM-rate probe)."""
    live: dict[int, tuple[int, str]] = {}
    now = peak = at = 0
    snap: dict[int, tuple[int, str]] = {}
    for i, e in enumerate(events):
        act = e.get("action")
        if act == "alloc":
            where = _where(e.get("frames") or (), within)
            if where.startswith(skip):
                continue
            live[e["addr"]] = (e["size"], where)
            now += e["size"]
            if now > peak:
                peak, at, snap = now, i, dict(live)
        elif act == "free_completed" and e["addr"] in live:
            now -= live.pop(e["addr"])[0]
    groups: dict[str, list[int]] = {}
    for size, where in snap.values():
        g = groups.setdefault(where, [0, 0])
        g[0] += 1
        g[1] += size
    return peak, at, sorted(((w, n, b) for w, (n, b) in groups.items()), key=lambda r: -r[2])


def _where(frames, within: str) -> str:
    for f in frames:   # innermost first
        if within in f.get("filename", ""):
            name = f["filename"].split(within, 1)[1]
            return f"{name}:{f.get('line')} {f.get('name', '')}".strip()
    return "(outside strata)"
