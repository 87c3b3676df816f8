"""The loan: whole cache slots borrowed from the TOP of the expert cache for one prompt.

At most `lend_cap` (default 0.9) of the cache's bytes; room is counted in the bytes of the slots
actually lent (a cache slot holds its own layer's blob, which may be smaller than max_blob).
Borrowed slots lose their experts (the cache's index forgets them); `refill()` reloads each from
the source so the cache's bytes end exactly as they started. Used as a context manager the loan
refills even when the prompt fails, so a failed request never leaves a half-refilled cache.
"""
from __future__ import annotations

from strata.memory.cache import ExpertCache
from strata.memory.carve import Carve

LEND_CAP = 0.9


class Loan:
    def __init__(self, cache: ExpertCache, need: int, lend_cap: float = LEND_CAP):
        lay = cache.layout
        self.cache = cache
        self.lend_cap = lend_cap
        self.n_slots = lay.slots_for(need, lend_cap)       # PlanError when it cannot
        self.first = lay.n_slots - self.n_slots
        self.offset, self.nbytes = lay.loan_span(self.n_slots, lend_cap)
        self.buffer = cache.buffer[self.offset:lay.nbytes]  # uint8 view into the cache
        self.active = True
        for i in range(self.first, lay.n_slots):
            cache.evict_slot(i)

    @property
    def slots(self) -> range:
        return range(self.first, self.first + self.n_slots)

    def carve(self) -> Carve:
        return Carve(self.buffer)

    def refill(self) -> None:
        """Reload every borrowed slot's own expert; the cache is whole again."""
        if not self.active:
            return
        # The alignment padding between slots was lent too: the cache keeps it zero.
        self.buffer.zero_()
        self.cache.fill(self.slots)   # queued copies, one wait (strata.memory.cache)
        self.active = False

    def __enter__(self) -> "Loan":
        return self

    def __exit__(self, *exc) -> None:
        self.refill()
