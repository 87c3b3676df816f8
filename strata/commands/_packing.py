"""--pack-prompts: how many tokens a prompt (or a batch of packed prompts) may hold, and the reads
a prompts file becomes when consecutive prompts are packed into one chunk."""
from __future__ import annotations


def batch_room(args, prompts) -> int:
    """The tokens a prompt may hold: the longest prompt's, or with --pack-prompts a batch's
    (--chunk, else every prompt's up to the scan's ceiling), the KV each reserves."""
    longest = max(len(t) for t in prompts)
    if not args.pack_prompts:
        return longest
    from strata.memory.scan import SCAN_MAX
    cap = args.chunk or args.prefill or SCAN_MAX
    return max(longest, min(sum(len(t) for t in prompts), cap))


def read_batches(engine, prompts, room: int):
    """(tokens, Packed or None, plan or None) per read: each prompt alone (room 0), or
    consecutive prompts packed, as many as the chunk of the plan for `room` tokens holds (a
    prompt longer than it alone, in chunks)."""
    from strata.models.packed import Packed
    if not room:
        yield from ((t, None, None) for t in prompts)
        return
    plan = engine.plan(room)
    group: list = []
    for t in [*prompts, None]:
        if group and (t is None or sum(map(len, group)) + len(t) > plan.chunk):
            if len(group) == 1:
                yield group[0], None, None
            else:
                yield [i for g in group for i in g], Packed.of(map(len, group)), plan
            group = []
        if t is not None:
            group.append(t)
