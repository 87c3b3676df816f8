"""Print the SPEC's ring reference table from strata's own ring arithmetic.

    PYTHONPATH=. python experiments/ring_table.py

Every cell comes from `strata.memory.ring_slots`; tests/memory/test_mem_experiments.py asserts
each against the SPEC's table, so the ring arithmetic and the SPEC cannot drift apart.
"""
from __future__ import annotations

from strata.memory import ring_budget, ring_slots

# (pack, max_blob, native): the three packs of the SPEC's table.
PACKS = [("Q2_0", 1_382_400, False), ("IQ3_S", 2_663_424, True), ("Q8_0", 5_222_400, True)]


def fused_cell(max_blob: int, native: bool) -> str:
    by_bytes = ring_budget(fused=True) // max_blob
    got = ring_slots(max_blob, fused=True, native=native)
    return str(got) if got == by_bytes else f"{by_bytes} → cap {got}"


def rows() -> list[dict]:
    return [{"pack": f"{name} ({'native' if native else 'not native'})",
             "max_blob": f"{blob:,}",
             "unfused pinned": str(ring_slots(blob, native=native)),
             "unpinned": str(ring_slots(blob, pinned=False, native=native)),
             "fused": fused_cell(blob, native)} for name, blob, native in PACKS]


def markdown() -> str:
    rs = rows()
    cols = list(rs[0])
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(r[c] for c in cols) + " |" for r in rs]
    return "\n".join(out)


if __name__ == "__main__":
    print(markdown())
