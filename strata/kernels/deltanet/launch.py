"""The launch choices of the chunked gated delta rule as pinnable data (strata.kernels.deltanet
.chunk reads them; the planner reads `split` through sizes.chunk_buffers).

    DeltaLaunch(warps, stages, bv, prec, split, backend)
      warps, stages  the two kernels' num_warps / num_stages
      bv             the dv block of the scan (a power of two, 16..128)
      prec           tl.dot's input precision: "tf32x3" (three tf32 products per fp32 one, within
                     12 u of fp32's), "tf32" (one; ~1e-3 relative), "ieee" (FMA dots, no tensor
                     cores). The interpreter computes every precision as fp32.
      split          False: the scan writes o as it walks the chunks (the fused form: neither the
                     per-chunk states nor v_new reach memory). True: the scan keeps only what
                     depends on the state (v_new = u - w S, written over u in place, and the
                     inter-chunk part (q exp(G)) S into an fp32 buffer `oi` [T, Hv, dv]); a third
                     kernel, parallel over chunks, adds the intra-chunk part tril(q k^T decay)
                     v_new. The same products in the same order: o equal to the fused form's.
      backend        "strata": the kernels above. "fla": fla-core's five forward kernels on
                     buffers strata hands in (strata.kernels.deltanet.fla_rule; an optional
                     dependency; the other fields do not apply to it), its intermediates in the
                     activations' dtype: 8x faster at T 32768 on the H100, its state ~4e-3 from
                     the fp64 recurrence where strata's keeps 1e-6.

The default is the fused form at tf32x3 (experiments/results/deltanet_fla-NVIDIA_H100_80GB_HBM3-
da71bcb: 31.7 ms at T 32768 for Qwen3.5's heads, the scan the sequential part). In a whole read
backend=fla is faster: the full-size Qwen3.5-35B-A3B Q4_K_M streamed under 12 GiB (H100, 3f27780,
llama_side-qwen3.5-… and bench-qwen3.5-…-long{,-fla}) reads 8K / 32K / 131K / 262K at 12,965 /
29,584 / 10,215 / 5,797 tok/s with it against 8,541 / 16,297 / 7,117 / 5,023. It stays opt-in
(`--delta backend=fla`) until the GPU suite and the instruments' KLD have run with it as the
default: its state is 4e-3 from the fp64 recurrence where strata's keeps 1e-6, and the hybrids'
GPU tests derive their bounds for strata's. `pin_delta_launch(split=True)` and the precisions
are there to be measured too (experiments/deltanet_fla.py --arms; in a whole read,
benchmarks/profile_read.py --delta). The planner counts the buffers of the launch in force
(sizes.chunk_buffers).
"""
from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, fields

from strata.errors import StrataError
from strata.kernels.pins import pinned_record

PRECISIONS = ("tf32x3", "tf32", "ieee")
BACKENDS = ("strata", "fla")


@dataclass(frozen=True)
class DeltaLaunch:
    # 8 warps: the WY kernel then holds its [64, 128] tiles without a spill under tf32x3; the
    # scan spills ~1.8 KB a thread at BV 16 or 32, 4 or 8 warps alike
    # (tests/kernels/compile_deltanet.py)
    warps: int = 8
    # the default 3 pipelines the scan's loads into ~100 more spilled bytes
    stages: int = 1
    bv: int = 32            # Hv * dv / 32 scan programs (128 for Qwen3.5's 32 x 128)
    prec: str = "tf32x3"
    split: bool = False
    backend: str = "strata"

    def __post_init__(self):
        if self.warps not in (1, 2, 4, 8, 16):
            raise StrataError(f"DeltaLaunch: warps must be 1, 2, 4, 8 or 16, got {self.warps!r}")
        if not isinstance(self.stages, int) or not 1 <= self.stages <= 4:
            raise StrataError(f"DeltaLaunch: stages must be 1..4, got {self.stages!r}")
        if self.bv not in (16, 32, 64, 128):
            raise StrataError(f"DeltaLaunch: bv must be 16, 32, 64 or 128, got {self.bv!r}")
        if self.prec not in PRECISIONS:
            raise StrataError(f"DeltaLaunch: prec must be one of {PRECISIONS}, got "
                              f"{self.prec!r}")
        if not isinstance(self.split, bool):
            raise StrataError(f"DeltaLaunch: split must be a bool, got {self.split!r}")
        if self.backend not in BACKENDS:
            raise StrataError(f"DeltaLaunch: backend must be one of {BACKENDS}, got "
                              f"{self.backend!r}")

    @property
    def spec(self) -> str:
        """The fields that differ from the default as `parse` reads them ("backend=fla",
        "split,prec=tf32"), or "default": what a report says ran."""
        d = DeltaLaunch()
        parts = [f.name if v is True else f"{f.name}={v}"
                 for f in fields(self) if (v := getattr(self, f.name)) != getattr(d, f.name)]
        return ",".join(parts) or "default"

    @classmethod
    def parse(cls, text: str) -> "DeltaLaunch":
        """"split,prec=tf32,bv=64" -> DeltaLaunch (names of fields; a bare name sets a bool)."""
        kw: dict = {}
        names = {f.name: f for f in fields(cls)}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, _, val = part.partition("=")
            if key not in names:
                raise StrataError(f"DeltaLaunch: unknown field {key!r} in {text!r}; fields: "
                                  f"{', '.join(names)}")
            if not val:
                kw[key] = True
            elif names[key].type in ("int", int):
                try:
                    kw[key] = int(val)
                except ValueError:
                    raise StrataError(f"DeltaLaunch: {key} takes an int, got {val!r}") from None
            elif names[key].type in ("bool", bool):
                kw[key] = val.lower() in ("1", "true", "yes")
            else:
                kw[key] = val
        return cls(**kw)


DEFAULT = DeltaLaunch()
_PIN: ContextVar[DeltaLaunch | None] = ContextVar("strata_delta_launch", default=None)


def delta_launch() -> DeltaLaunch:
    """The launch in force: the pinned one, else DEFAULT."""
    pin = _PIN.get()
    return DEFAULT if pin is None else pin


def delta_spec(shape) -> str | None:
    """What a report says of `shape`'s delta rule: the launch in force (DeltaLaunch.spec) where
    it has linear-attention layers, else None."""
    return delta_launch().spec if getattr(shape, "linear", None) is not None else None


def launch_from_flag(text: str, flag: str = "--delta") -> DeltaLaunch:
    """A `--delta SPEC` flag ("backend=fla", "split,prec=tf32": DeltaLaunch.parse) as the launch
    to pin, checked before any heavy work: fla's backend needs fla-core importable (one line
    when it is not)."""
    try:
        launch = DeltaLaunch.parse(text)
    except StrataError as e:
        raise StrataError(f"{flag} {text!r}: {e}") from None
    if launch.backend == "fla":
        from strata.kernels.deltanet.fla_rule import fla_kernels
        fla_kernels()
    return launch


def pin_delta_launch(launch: DeltaLaunch | None = None, **changes):
    """Inside the block the delta rule launches `launch` (or the one in force with `changes`),
    and the planner counts its buffers."""
    return pinned_record(_PIN, delta_launch(), launch, changes, "pin_delta_launch")
