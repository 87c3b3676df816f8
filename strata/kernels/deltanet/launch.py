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
                     dependency, `strata[fla]`; the other fields do not apply to it), its
                     intermediates in the activations' dtype. "auto" (the default): fla where
                     the activations are bf16 / fp16, fla-core 0.6.0 is installed and the
                     process has CUDA (or the plan is for CUDA: strata.kernels.pins.
                     planning_for), else strata, and strata wherever another field is set
                     (`--delta split` asks for strata's split scan) (`resolved`, which the
                     planner and the launcher both read: one answer for the buffers counted
                     and those taken).

Why auto picks fla for a bf16 read: it is 5-10x faster from T 2048 (experiments/results/
deltanet_fla-NVIDIA_H100_80GB_HBM3-47eafc3: 3.29 ms against the tf32x3 scan's 26.29 at T 32768),
and in a whole read of the full-size Qwen3.5-35B-A3B Q4_K_M streamed under 12 GiB (H100, 3f27780)
12,965 / 29,584 / 10,215 / 5,797 tok/s at 8K / 32K / 131K / 262K against 8,541 / 16,297 / 7,117 /
5,023. Its state is ~4e-3 from the fp64 recurrence (bf16's own step: w, u and v_new are kept in the
activations' dtype) where strata's keeps 1e-6; a bf16 read rounds every projection around it to
that step already, and over a text its distributions move by a KLD of 0.0058 from strata's, 1/18 of
what the Q4_K_M mix moves them (0.1031; Qwen3.5-35B-A3B's first 8 layers,
experiments/results/quant_quality-qwen3.5-35b-a3b-L8-fla-NVIDIA_H100-35b7826). An fp32 read keeps
strata's fp32-exact scan, as does every read on the CPU (the torch twin). `--delta backend=strata`
pins strata's kernels for a bf16 read; `pin_delta_launch(split=True)` and the precisions are there
to be measured (experiments/deltanet_fla.py --arms; in a whole read, benchmarks/profile_read.py
--delta). The planner counts the buffers of the launch in force (sizes.chunk_buffers).
"""
from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, fields
from functools import lru_cache

from strata._backend import _has_cuda
from strata.errors import StrataError
from strata.kernels.pins import pinned_record, plan_target

PRECISIONS = ("tf32x3", "tf32", "ieee")
BACKENDS = ("auto", "strata", "fla")


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
    backend: str = "auto"

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

    def resolved(self, itemsize: int) -> str:
        """The backend that runs for activations of `itemsize` bytes in this process (or on the
        device strata.kernels.pins.planning_for names): the pinned one, or auto's choice (the
        module docstring)."""
        if self.backend != "auto":
            return self.backend
        tuned = any(getattr(self, f.name) != f.default for f in fields(self)
                    if f.name != "backend")        # fields of strata's own kernels: it runs them
        return ("fla" if not tuned and itemsize <= 2 and _fla_installed() and _target_cuda()
                else "strata")

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


def _target_cuda() -> bool:
    """Whether the read being planned or run is on CUDA: the device type planning_for names
    (strata plan, which plans a GPU from any host: strata.kernels.pins), else whether this
    process has CUDA."""
    target = plan_target()
    return _has_cuda() if target is None else target == "cuda"


@lru_cache(maxsize=1)
def _fla_installed() -> bool:
    """fla-core at the version fla_rule launches is installed (fla_rule.fla_version)."""
    from strata.kernels.deltanet.fla_rule import FLA_VERSION, fla_version
    return fla_version() == FLA_VERSION


DEFAULT = DeltaLaunch()
_PIN: ContextVar[DeltaLaunch | None] = ContextVar("strata_delta_launch", default=None)


def delta_launch() -> DeltaLaunch:
    """The launch in force: the pinned one, else DEFAULT."""
    pin = _PIN.get()
    return DEFAULT if pin is None else pin


def pinned_delta_launch() -> DeltaLaunch | None:
    """The launch pin_delta_launch (--delta) holds in force, None when none is."""
    return _PIN.get()


def delta_spec(shape, itemsize: int = 2) -> str | None:
    """What a report says of `shape`'s delta rule where it has linear-attention layers (else
    None): the launch in force (DeltaLaunch.spec) and, for auto, the backend it resolved to for
    activations of `itemsize` bytes ("default: fla")."""
    if getattr(shape, "linear", None) is None:
        return None
    L = delta_launch()
    return f"{L.spec}: {L.resolved(itemsize)}" if L.backend == "auto" else L.spec


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
