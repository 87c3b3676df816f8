"""What a process held live on each GPU at its peak over a stretch of work: torch's allocated
bytes (the expert cache, dense weights, KV, and every transient a read allocates beside the
plan's carve; not the CUDA context nor the allocator's cached free blocks, which it releases and
retries before it fails), to set beside the budget it was planned for."""
from __future__ import annotations

import torch


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
