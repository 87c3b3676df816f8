"""Watching a prefill engine without changing it: the observer hook.

    class Loans(EngineObserver):
        def __init__(self):
            self.lent = []

        def on_loan(self, part, need, loan):
            self.lent.append((part.name, need, loan.n_slots))

    engine = PrefillEngine(pack, cfg, observers=[Loans()])   # or engine.observers.append(...)

The engine calls every observer, in list order, at these points of a prompt:
- on_plan(plan, chunk, ring): the plan is made and resolved for this prompt (its chunk and its
  ring, slots or "STAGE"), before anything is borrowed;
- on_loan(part, need, loan): participant `part` borrowed `loan` (a strata.memory.Loan: its
  n_slots, nbytes) for `need` bytes, what the prompt layout asks for at this chunk and ring
  (the scratch slab's size classes, when lent too, come on top);
- on_result(result): the prompt completed (a PrefillResult); not called when it failed.

Observers only read: what they are handed belongs to the engine (a loan is refilled after the
prompt). The default methods do nothing, so an observer overrides only the points it watches.
Experiments use this instead of patching engine classes or flipping environment knobs.
"""
from __future__ import annotations


class EngineObserver:
    def on_plan(self, plan, chunk: int, ring) -> None:
        pass

    def on_loan(self, part, need: int, loan) -> None:
        pass

    def on_result(self, result) -> None:
        pass
