"""Recorder: what an experiment's measure function talks to (checks, timings, figures)."""
from __future__ import annotations

from pathlib import Path

import torch

from strata.bench import record
from strata.bench.gate import run_check
from strata.bench.timing import Timing, time_fn


class Recorder:
    """Collects one run's rows. Figures come in through `add`; timed ones through `timed`, which
    runs the kernel's check on the very inputs it times before a single repeat is counted."""

    def __init__(self, experiment: str, label: str = "tree", *, root: str | Path = ".",
                 warmup: int = 5, repeats: int = 20, device=None, settle_s: float = 0.0):
        self.experiment, self.label = experiment, label
        self.warmup, self.repeats, self.settle_s = warmup, repeats, settle_s
        self.device = torch.device(device) if device is not None else (
            torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))
        import triton
        self._common = dict(experiment=experiment, label=label, gpu=record.gpu_name(),
                            commit=record.commit_of(root), timestamp=record.utc_now(),
                            torch=torch.__version__, triton=triton.__version__)
        self.rows: list[dict] = []
        self.partial_path: Path | None = None   # set by bench.main: where flush() writes

    def flush(self) -> None:
        """Write the rows so far (a long run cut short keeps what it measured)."""
        if self.partial_path is not None and self.rows:
            record.write_csv(self.rows, self.partial_path)

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"

    def add(self, figure: str, value: float | str, unit: str, *, bound: str = "",
            bound_value: float | None = None, gate: str = "", timer: str = "", **config) -> dict:
        """One long-format row: `figure` = `value` `unit` for this config, judged against
        `bound` (words) / `bound_value` (the same ceiling as a number in `unit`)."""
        value = float(value) if isinstance(value, (int, float)) else value
        if self.settle_s and timer:   # a timed figure: say how it was timed
            config = dict(config, settle_s=self.settle_s)
        row = self._common | dict(config=dict(config), figure=figure, value=value,
                                  unit=unit, bound=bound, bound_value=bound_value, gate=gate,
                                  timer=timer)
        self.rows.append(row)
        return row

    def add_timing(self, t: Timing, flops: float, *, gate: str, **config) -> None:
        """A timed kernel's two rows: its median `ms` and the TFLOP/s that makes of `flops`."""
        self.add("ms", t.median_ms, "ms", gate=gate, timer=t.timer, **config)
        self.add("tflops", flops / t.median_s / 1e12, "TFLOP/s", gate=gate, timer=t.timer,
                 **config)

    def timed(self, fn, *, check, what: str) -> Timing:
        """Check, then time fn(). `check()` compares the kernel against its reference on exactly
        the inputs fn() uses (see strata.bench.gate); a failure raises GateRefused and nothing
        is timed. Returns the Timing; pass `gate=what, timer=t.timer` to `add`."""
        run_check(what, check)
        return time_fn(fn, device=self.device, warmup=self.warmup, repeats=self.repeats,
                       settle_s=self.settle_s)
