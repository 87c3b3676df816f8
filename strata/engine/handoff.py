"""What travels between the ranks of a pipeline (strata.engine.distributed): the hidden states
[T, D] handed from rank r to r + 1, each behind a 1-element status header, the per-chunk ok flag
(an all-reduce MIN) and the gathered per-rank objects (plans, errors). Every wait has the
timeout, so a rank that died leaves the others with an error, not a hang; an error on any rank
is raised on every rank as the lowest failing rank's line.

    wire = Handoff(rank, world, device, timeout_s, width=D, dtype=torch.bfloat16)
    works = wire.send(x)            # None: a "failed" header only
    ok, x = wire.recv(n, want=True)
    raise_first(enumerate(wire.gather(error)), world)
"""
from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from strata.errors import StrataError, allocation_failed, first_line

_OK, _FAILED = 1, 0          # the hand-off's status header


class Handoff:
    """One rank's end of the pipeline's wire: on the CPU under gloo, on its GPU under NCCL."""

    def __init__(self, rank: int, world: int, device: torch.device, timeout_s: float, *,
                 width: int, dtype: torch.dtype):
        self.rank, self.world, self.timeout_s = rank, world, timeout_s
        self.width, self.dtype = width, dtype
        self.device = device if dist.get_backend() == "nccl" else torch.device("cpu")

    def send(self, x: torch.Tensor | None) -> list:
        """Hand `x` (None: this rank failed) to the next rank; the (Work, buffer) pairs to
        wait for (the buffers stay referenced until sent)."""
        dst = self.rank + 1
        head = torch.tensor([_OK if x is not None else _FAILED], dtype=torch.int64,
                            device=self.device)
        works = [(dist.isend(head, dst), head)]
        if x is not None:
            x = x.to(self.device).contiguous()
            works.append((dist.isend(x, dst), x))
        return works

    def recv(self, n: int, want: bool) -> tuple[bool, torch.Tensor | None]:
        """(upstream healthy, hidden states [n, D] or None). `want` False: drop them."""
        src = self.rank - 1
        head = torch.empty(1, dtype=torch.int64, device=self.device)
        self.wait(dist.irecv(head, src))
        if int(head[0]) != _OK:
            return False, None
        x = torch.empty(n, self.width, dtype=self.dtype, device=self.device)
        self.wait(dist.irecv(x, src))
        return True, (x if want else None)

    def wait(self, work) -> None:
        """Wait for a hand-off (a Work, or (Work, its buffer)) within the timeout."""
        if isinstance(work, tuple):
            work = work[0]
        if not work.wait(datetime.timedelta(seconds=self.timeout_s)):
            raise StrataError(f"rank {self.rank}: a hand-off timed out after "
                              f"{self.timeout_s:.0f} s; a neighbouring rank died or hung")

    def all_ok(self, ok: bool) -> bool:
        """Every rank's `ok`, and-ed (a collective: every rank calls it)."""
        flag = torch.tensor([1 if ok else 0], dtype=torch.int64, device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag[0])

    def gather(self, obj) -> list:
        """Every rank's `obj`, in rank order (a collective)."""
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out


def raise_first(errors, world: int) -> None:
    """Raise the lowest failing rank's error of (rank, error or None) pairs, the same on every
    rank that gathered them."""
    for r, e in errors:
        if e is not None:
            raise StrataError(f"rank {r} of {world}: {e}")


def rank_message(e: BaseException) -> str:
    """The one line another rank hears of this rank's error."""
    if isinstance(e, StrataError):
        return str(e).splitlines()[0]
    if isinstance(e, torch.cuda.OutOfMemoryError):
        return allocation_failed(e)
    return f"{type(e).__name__}: {first_line(e)}"
