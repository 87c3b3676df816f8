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
               "triton": strata's own block kernel (strata.kernels.attention.mla_block): the
               scores from two dots over the q/k width's parts (192 = 128 + 64), the values
               at Hv, and the softmax state carried from key block to key block inside the
               launches (each folds its block into the fp32 state, the last writes o), so
               no merge runs: `merge` is not read.
               "cudnn": cuDNN's attention (strata.models.mla_attend.attend_block_cudnn), q/k
               and v at their own widths, each block's (o, lse) merged as efficient's are; its
               masked block is the query block's own n keys (key_blocks(square=True): cuDNN
               aligns its causal mask top-left), the keys before it in blocks of B, so a
               chunk's short last query block takes one block more; on a GPU without cuDNN's
               attention (before Hopper,
               strata.kernels.attention.flash_prefix.blocks_kernel) the triton backend runs
               instead: its scratch is the same.
      block    B, queries and keys per launch. A chunk of T tokens over itself launches
               ceil(T/B)·(ceil(T/B) + 1)/2 times and merges all but ceil(T/B) of them; a larger
               B launches and merges fewer times for more scratch (k and v rows min(B, S), the
               state's min(B, T)). Unpinned, the engine's carve grows B to 2B, 4B, ... up
               to the chunk where the scratch costs no bytes (block_grows; the feed-forward
               phase the longer: strata.planning.mla_wider), and the attention runs at the
               block its scratch carries.
      key_block  the cudnn backend's keys a launch before the masked block (at least B; None:
               B): a query block of B attends its own B keys masked and the keys before them in
               blocks of key_block, so fewer merges a query block for a scratch of key_block
               rows of k and v (the state stays B rows).
      merge    "torch": each key block folded into the fp32 state in plain torch (two passes
               over acc and a handful of [H, n] launches); "fused": one Triton launch a block
               (strata.kernels.attention.merge.lse_merge: acc and o read once, acc written
               once).
      out_bytes  the most one launch's output may take (efficient, flash, cudnn: torch's ops
               allocate it beside the carve, [heads, n, width] in the attention's dtype, and it
               lives until its merge; efficient's fp32 accumulator of that shape counts too):
               a block launches over all H heads while n·H·width values fit, else over
               groups of the most heads that do (launch_heads), each
               merged into its heads' rows of the state. The heads are independent, so a
               group's launch is the whole launch's rows for those heads; at B 4096 and
               DeepSeek-V3's 128 value heads of 128 the whole launch is 128 MiB, and a block
               the carve grew to 16,384 (or 32,768) would have asked for 0.5 (1) GiB of the
               reserve (strata.memory.rig.RESERVE) in one piece. The triton backend writes into
               the state and allocates none.

The default on a GPU is cudnn at B = 4096 (strata's triton kernel where the GPU has no cuDNN
attention), by an A/B on the H100 at 6e3010d (benchmarks/mla_bench.py, one DeepSeek-V3 layer's
blocked attention, and benchmarks/profile_read.py --what resident --preset deepseek-v3 --quant
Q4_K_M --layers 5 --T 8192 32768 --mla-backend triton|cudnn; experiments/results/
*mla_cudnn*-NVIDIA_H100-6e3010d*): the attention 7.61 -> 6.58 ms at T 8192 and 113.7 -> 95.9
ms at 32768, 307.6 -> 260.3 ms for 32,768 queries after 28,672 cached; the 5-layer read 51,630
-> 50,884 tok/s at 8K (alike) and 34,197 -> 37,972 at 32K (attention 532 -> 389 ms of it,
against its 346 ms floor). cudnn at B = 8192 ran 85.1 ms at 32768 but 32.2 (against 22.1) for
4,096 queries after 28,672 keys (its masked block not square then: the efficient kernel; the
square tiling since), and doubles the scratch.
Before it triton at B = 4096 (b6aff0d: 12.45 -> 7.52 ms at T 8192 and 185.3 -> 115.0 ms at
32768 against flash at 4096 with the fused merge), and before that flash at 4096 with the fused
merge had replaced efficient at 2048 with the torch merge (974a332: the 5-layer read 34,465 /
14,477 -> 45,906 / 24,671 tok/s). Smaller blocks were slower at every backend. The scratch of
cudnn and triton holds V at Hv (~0.61 GB at DeepSeek-V3's heads, flash's ~0.67), counted by the
planner from this record as every other launch's.

Without CUDA (Triton in its interpreter) the default backend is flash, which falls back to torch
there: the triton kernel would run as interpreted numpy, program by program. Tests pin each
backend to run them all on the CPU.
"""
from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

from strata._backend import INTERPRET
from strata.errors import StrataError
from strata.kernels.attention.flash import OUT_BYTES   # the default out_bytes (every attention's)
from strata.kernels.attention.flash_prefix import blocks_kernel
from strata.kernels.pins import pinned_record

MLA_BLOCK = 4096   # the default B (strata.models.mla_scratch's docstring says why)
DEFAULT_BACKEND = "flash" if INTERPRET else "cudnn"   # see the module docstring
BACKENDS = ("efficient", "flash", "triton", "cudnn")
MERGES = ("torch", "fused")


@dataclass(frozen=True)
class MLALaunch:
    backend: str = DEFAULT_BACKEND
    block: int = MLA_BLOCK
    merge: str = "fused"
    key_block: int | None = None    # cudnn: keys a launch before the masked block (None: block)
    out_bytes: int = OUT_BYTES      # one launch's output at most (the docstring)

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise StrataError(f"MLALaunch: backend must be one of {BACKENDS}, got "
                              f"{self.backend!r}")
        if isinstance(self.block, bool) or not isinstance(self.block, int) or self.block < 1:
            raise StrataError(f"MLALaunch: block must be a positive int, got {self.block!r}")
        kb = self.key_block
        if kb is not None and (isinstance(kb, bool) or not isinstance(kb, int) or
                               kb < self.block or self.backend != "cudnn"):
            raise StrataError(f"MLALaunch: key_block is the cudnn backend's keys a launch, an int "
                              f"of at least the block ({self.block}), or None; got {kb!r} with "
                              f"the {self.backend} backend")
        if self.merge not in MERGES:
            raise StrataError(f"MLALaunch: merge must be one of {MERGES}, got {self.merge!r}")
        ob = self.out_bytes
        if isinstance(ob, bool) or not isinstance(ob, int) or ob < 1:
            raise StrataError(f"MLALaunch: out_bytes must be a positive int, got {ob!r}")


DEFAULT = MLALaunch()
_PIN: ContextVar[MLALaunch | None] = ContextVar("strata_mla_launch", default=None)


def backend_on(backend: str, cuda: bool) -> str:
    """The backend that runs `backend` on this machine: "cudnn" on a CUDA GPU without cuDNN's
    attention (before Hopper: strata.kernels.attention.flash_prefix.blocks_kernel) runs triton,
    whose scratch is the same; every other backend as it is."""
    if backend == "cudnn" and cuda and blocks_kernel() != "cudnn":
        return "triton"
    return backend


def key_rows(block: int, launch: MLALaunch | None = None) -> int:
    """Keys a launch of `launch` (the one in force when None) takes at most at query blocks
    of `block`: its key_block where set (the cudnn backend's unmasked blocks), else the block."""
    launch = mla_launch() if launch is None else launch
    return max(block, launch.key_block or 0)


def value_bytes(backend: str, itemsize: int) -> int:
    """Bytes a block launch of `backend` holds beside the carve for each of its output's values
    of `itemsize` bytes: the output, and the efficient kernel's fp32 accumulator beside it."""
    return itemsize + (4 if backend == "efficient" else 0)


def launch_heads(H: int, n: int, width: int, itemsize: int,
                 launch: MLALaunch | None = None) -> int:
    """Heads one block launch of n queries takes at once: all H while what it holds (n x heads
    x width values of `itemsize` bytes each: value_bytes) fits the launch's out_bytes
    (`launch`: the one in force when None), else the most that do, and at least one."""
    launch = mla_launch() if launch is None else launch
    return max(1, min(H, launch.out_bytes // max(1, n * width * itemsize)))


def mla_launch() -> MLALaunch:
    """The launch in force: the pinned one, else DEFAULT."""
    pin = _PIN.get()
    return DEFAULT if pin is None else pin


def block_grows() -> bool:
    """Whether the plan may run MLA's attention at a larger block than the launch's: only while
    no launch is pinned (a pinned launch runs at its own block). The plan takes the largest of
    B, 2B, 4B, ... up to the chunk whose scratch the carve holds at no cost (the feed-forward
    phase is the larger: strata.planning.mla_dims, strata.memory.layout.PromptLayout.carve)."""
    return _PIN.get() is None


def pin_mla_launch(launch: MLALaunch | None = None, **changes):
    """Inside the block MLA's attention launches `launch` (or the one in force with `changes`),
    and the planner counts its scratch."""
    return pinned_record(_PIN, mla_launch(), launch, changes, "pin_mla_launch")


__all__ = ["BACKENDS", "DEFAULT", "DEFAULT_BACKEND", "MERGES", "MLALaunch", "MLA_BLOCK",
           "OUT_BYTES", "backend_on", "block_grows", "key_rows", "launch_heads", "mla_launch",
           "pin_mla_launch", "value_bytes"]
