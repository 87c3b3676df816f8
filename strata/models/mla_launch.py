"""The launch choices of MLA's blocked attention as pinnable data (strata.models.mla launches
them; strata.models.mla_scratch sizes the scratch from them, the one count strata.planning
carves).

    MLALaunch(backend, block, merge)
      backend  "efficient": each key block one launch of torch's memory-efficient attention
               kernel, the values at their own width Hv (what SDPA picks for q/k heads of 192
               and values of 128). "flash": torch's flash forward with its log-sum-exp, the
               values zero-padded to the q/k width hd (flash takes one head width for q, k and
               v): the scratch's values hold max(hd, Hv) columns a head instead of Hv (1.5x
               at DeepSeek-V3's 192 / 128), and the kernel's PV product runs at hd wide.
      block    B, queries and keys per launch. A chunk of T tokens over itself launches
               ceil(T/B)·(ceil(T/B) + 1)/2 times and merges all but ceil(T/B) of them; a larger
               B launches and merges fewer times for more scratch (k and v rows min(B, S), the
               state's min(B, T)).
      merge    "torch": each key block folded into the fp32 state in plain torch (two passes
               over acc and a handful of [H, n] launches); "fused": one Triton launch a block
               (strata.kernels.attention.merge.lse_merge: acc and o read once, acc written
               once).

The default is the efficient kernel at B = 2048 with the torch merge, the path measured so far
(an H100 profile of DeepSeek-V3 at T = 32768: 1,582 ms of 2,280 in that kernel against a
~415 ms floor at flash's rate, ~220 ms in the merge). `pin_mla_launch(backend="flash")` /
`block=` / `merge="fused"` are there for the A/B (benchmarks/mla_bench.py --arms,
benchmarks/gpu_session.sh step mlaflash); the default moves only on a GPU timing.
"""
from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

from strata.errors import StrataError
from strata.kernels.pins import pinned_record

MLA_BLOCK = 2048   # the default B (strata.models.mla_scratch's docstring says why)
BACKENDS = ("efficient", "flash")
MERGES = ("torch", "fused")


@dataclass(frozen=True)
class MLALaunch:
    backend: str = "efficient"
    block: int = MLA_BLOCK
    merge: str = "torch"

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise StrataError(f"MLALaunch: backend must be one of {BACKENDS}, got "
                              f"{self.backend!r}")
        if isinstance(self.block, bool) or not isinstance(self.block, int) or self.block < 1:
            raise StrataError(f"MLALaunch: block must be a positive int, got {self.block!r}")
        if self.merge not in MERGES:
            raise StrataError(f"MLALaunch: merge must be one of {MERGES}, got {self.merge!r}")


DEFAULT = MLALaunch()
_PIN: ContextVar[MLALaunch | None] = ContextVar("strata_mla_launch", default=None)


def mla_launch() -> MLALaunch:
    """The launch in force: the pinned one, else DEFAULT."""
    pin = _PIN.get()
    return DEFAULT if pin is None else pin


def pin_mla_launch(launch: MLALaunch | None = None, **changes):
    """Inside the block MLA's attention launches `launch` (or the one in force with `changes`),
    and the planner counts its scratch."""
    return pinned_record(_PIN, mla_launch(), launch, changes, "pin_mla_launch")


__all__ = ["BACKENDS", "DEFAULT", "MERGES", "MLALaunch", "MLA_BLOCK", "mla_launch",
           "pin_mla_launch"]
