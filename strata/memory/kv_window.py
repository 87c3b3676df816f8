"""`--kv-resident auto`: how many tokens of each full layer's KV stay in VRAM, chosen from plans.

The KV of a long prompt is charged to the VRAM budget before the expert cache (strata.memory.rig:
cache = VRAM - dense - KV - reserve), and the scan then borrows its chunk and ring from that
cache. So the resident window W trades against the chunk and the ring. The rule:

1. The target is the plan with the KV spilled as far as the grid allows (W = the grid's first
   step): the most room the cache can give, so the scan's own objective (the largest chunk that
   leaves the full ring; else its fallback ring) picks the best chunk and ring there is.
2. All resident when that plan (a prompt of the longest length the run reserves KV for) fits
   and reads that prompt in as few chunks as the target: today's plan, unchanged, number for
   number. Each chunk streams every expert once, so an all-resident plan that fits only by
   reading more chunks (a long prompt's KV squeezing the chunk: qwen3.5-35b-a3b at 262K under
   12 GiB would read 94 chunks of 2,816 tokens, the target 8 of 32,768) spills instead; one
   whose shorter chunk still reads the prompt in as many chunks keeps its KV (spilling would
   only add the host KV's traffic).
3. W is the largest window on the grid (multiples of 256 tokens below the prompt; every token
   for a prompt of at most 256) whose plan still fits with the target's chunk, rule and ring on
   every participant; the tokens outside it live in pinned host memory.
4. When spilling does not help (no full-attention layer, nothing to spill, or even the target
   does not fit) the choice is all resident, and the run fails as an all-resident one would,
   with that plan's own one-line reason.

The ring compared is the scan's full (or fallback) ring, before a long prompt grows it into the
chunk's leftover room (the caller plans without growth): the window takes that room, and the
ring grows into whatever the chosen window leaves. Search: bisection, as the scan's. Raising W
takes `full layers x KVB` bytes a token from the cache (times the lend cap from the room) and
gives back only the one layer's staging buffer (KVB a token), so with two or more full layers
"fits with the target's chunk and ring" is a prefix of the grid; `plans` counts the plans made.

    choice = choose(max_prompt, plan_at, spills=True)   # plan_at(window | None) -> Plan
    choice.window      # None: all resident; else tokens per full layer in VRAM
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

from strata.errors import StrataError
from strata.memory.scan import GRID, Plan, last_fitting

AUTO = "auto"


@dataclass(frozen=True)
class KVChoice:
    """What `--kv-resident auto` chose for prompts up to `tokens`, and why."""
    window: int | None      # tokens of each full layer's KV in VRAM (None: all resident)
    tokens: int             # the longest prompt it was chosen for (the KV reserve)
    why: str                # fits | spilled | squeezed (all resident fits, more chunks) | no-help
    chunk: int = 0          # the plan's chunk and ring it keeps (the target's when spilled)
    ring: int | str = 0
    rule: str = ""
    plans: int = 0          # plans made to choose
    reason: str = ""        # the all-resident plan's failure, when it did not fit

    def to_dict(self) -> dict:
        return asdict(self)

    def line(self) -> str:
        """One line: what auto chose and why."""
        ring = self.ring if self.ring == "STAGE" else f"a {self.ring}-slot ring"
        if self.why == "fits":
            return (f"auto: all resident (the KV of {self.tokens:,} tokens fits beside chunk "
                    f"{self.chunk} and {ring})")
        if self.why == "no-help":
            return "auto: all resident (keeping less KV in VRAM would not make the plan fit)"
        grid = f"{GRID}-token grid" if self.tokens > GRID else "any token count"
        return (f"auto: the newest {self.window:,} tokens of each full layer in VRAM, the rest "
                f"in pinned host memory: all resident {self.reason}; {self.window:,} is the "
                f"largest window ({grid}) that keeps chunk {self.chunk} and {ring} "
                f"({self.rule}), as with the KV spilled ({self.plans} plans)")


def windows(max_prompt: int) -> list[int]:
    """The windows auto considers for prompts up to max_prompt: multiples of GRID below it (every
    token count below it when it is at most GRID)."""
    step = GRID if max_prompt > GRID else 1
    return list(range(step, max_prompt, step))


def chunks(tokens: int, plan: Plan) -> int:
    """How many chunks `plan` reads a prompt of `tokens` in."""
    return -(-tokens // plan.chunk)


def plan_key(plan: Plan) -> tuple:
    """What a window must keep of the target: chunk, rule and every participant's ring."""
    return plan.chunk, plan.rule, tuple((p.ring, p.ring_slots) for p in plan.participants)


def choose(max_prompt: int, plan_at: Callable[[int | None], Plan], *, spills: bool) -> KVChoice:
    """The window for prompts up to max_prompt (module docstring). `plan_at(window)`: the plan of
    a prompt of max_prompt tokens with that window (None: all resident), without ring growth; it
    may raise StrataError (no room for a cache). `spills`: the model has a full-attention layer
    (a sliding layer keeps only its window, whatever W says)."""
    made: dict = {}

    def plan(window):
        if window not in made:
            try:
                made[window] = plan_at(window)
            except StrataError as e:
                made[window] = e
        return made[window]

    def fits(p) -> bool:
        return isinstance(p, Plan) and p.fits

    whole = plan(None)
    grid = windows(max_prompt)
    target = plan(grid[0]) if spills and grid else None
    if fits(whole) and not (fits(target) and chunks(max_prompt, target) < chunks(max_prompt,
                                                                                 whole)):
        return KVChoice(None, max_prompt, "fits", whole.chunk, whole.ring, whole.rule, len(made))
    if not fits(target):
        return KVChoice(None, max_prompt, "no-help", plans=len(made))
    key = plan_key(target)
    best = last_fitting(grid, lambda w: fits(plan(w)) and plan_key(plan(w)) == key)
    if fits(whole):
        return KVChoice(best, max_prompt, "squeezed", target.chunk, target.ring, target.rule,
                        len(made), f"would read {chunks(max_prompt, whole)} chunks of "
                                   f"{whole.chunk} tokens, not {chunks(max_prompt, target)}")
    reason = whole.short_of() if isinstance(whole, Plan) else str(whole).split(";")[0]
    return KVChoice(best, max_prompt, "spilled", target.chunk, target.ring, target.rule,
                    len(made), "does not fit: " + reason)


def parse(text: str) -> int | str | None:
    """A --kv-resident value: auto, all (None: every token resident) or N >= 1 tokens; a
    StrataError naming the flag otherwise."""
    t = str(text).strip().lower()
    if t == AUTO:
        return AUTO
    if t == "all":
        return None
    try:
        n = int(t)
    except ValueError:
        raise StrataError(f"--kv-resident takes auto, all or a number of tokens, got "
                          f"{text!r}") from None
    if n < 1:
        raise StrataError(f"--kv-resident must be at least 1 token (or auto, all), got {n}")
    return n
