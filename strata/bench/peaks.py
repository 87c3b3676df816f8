"""What a process held on each GPU at its peak over a stretch of work: torch's caching
allocator's reserved bytes (the expert cache, dense weights, KV, and every transient a read
allocates beside the plan's carve; not the CUDA context), to set beside the budget it was
planned for."""
from __future__ import annotations

import torch


class Peaks:
    """Starts counting at construction: `read()` -> each device's peak reserved bytes since
    (None for a device that is not CUDA)."""

    def __init__(self, devices):
        self.devices = [torch.device(d) for d in devices]
        for d in self.devices:
            if d.type == "cuda":
                torch.cuda.synchronize(d)
                torch.cuda.reset_peak_memory_stats(d)

    def read(self) -> list[int | None]:
        return [torch.cuda.max_memory_reserved(d) if d.type == "cuda" else None
                for d in self.devices]
