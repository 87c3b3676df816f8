"""How a kernel finds one layer's experts: blobs at byte offsets inside one uint8 arena.

The arena is whatever buffer holds the blobs (the expert cache, the loan's ring slots, a pack's
memory map on the CPU); the slot table maps expert id -> byte offset of its blob, -1 when the
expert is not resident. The blob layout (gate/up/down offsets and formats) is data, shared by all
experts of the layer.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from strata.blob import BlobLayout


@dataclass
class ExpertSet:
    arena: torch.Tensor        # uint8 [nbytes]
    slot_offset: torch.Tensor  # int64 [E]: byte offset of expert e's blob in `arena`, -1 = absent
    layout: BlobLayout

    @property
    def n_expert(self) -> int:
        return int(self.slot_offset.numel())

    @property
    def device(self) -> torch.device:
        return self.arena.device
