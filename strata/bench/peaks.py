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
