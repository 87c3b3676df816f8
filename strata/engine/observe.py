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

And, from the streaming provider of each participant (named `part`, e.g. "gpu0"), pass by pass —
the lanes' timeline (strata.engine.trace writes it as a Chrome/Perfetto trace):
- on_chunk(part, start, n_tokens, mark): a chunk of n_tokens at position `start` begins;
- on_layer(part, layer, begin, end): the layer's compute (attention, routing, every pass) was
  enqueued between the marks `begin` and `end` on the compute lane;
- on_copy(part, layer, expert, nbytes, start, done): the expert's blob was copied into a ring
  slot on the copy lane between `start` and `done`;
- on_pass(part, layer, index, begin, end, wait, ahead): pass `index` of the layer computed
  between `begin` and `end`; `wait` is the (before, after) pair bracketing the compute lane's
  stall on the pass's copies, or None when it needed none; `ahead`: how many copies beyond the
  pass's own were already queued on the copy lane when the pass was enqueued (the next passes'
  experts, strata.engine.provider says how far ahead they run and why).
A mark is a CUDA timing event (read it after the device synchronized, e.g. in on_result:
strata.engine.device.Lane.elapsed) or, on the CPU, a time.perf_counter() float. These hooks are
only called when an observer is attached, so an engine without observers records nothing extra.

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

    def on_chunk(self, part: str, start: int, n_tokens: int, mark) -> None:
        pass

    def on_layer(self, part: str, layer: int, begin, end) -> None:
        pass

    def on_copy(self, part: str, layer: int, expert: int, nbytes: int, start, done,
                count: int = 1) -> None:
        """One host-to-device copy: `count` blobs of `layer` from `expert` on, `nbytes` in all."""
        pass

    def on_pass(self, part: str, layer: int, index: int, begin, end, wait,
                ahead: int = 0) -> None:
        pass

    def on_read(self, part: str, begin, end) -> None:
        """The prompt's timed read on this participant: marks (CUDA events on its compute lane,
        perf_counter on the CPU) taken as the timer starts and after the last sync, so a trace
        shows what of the read lies outside the lanes' own work."""
        pass
