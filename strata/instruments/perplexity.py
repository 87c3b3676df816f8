"""The instrument: a text's windows through a logits source, scored as llama-perplexity does.

    res = measure(windows, read)                       # PPL ± error, the running PPL per window
    res = measure(windows, read, save=writer)          # ... and the base file's rows
    res = measure(windows, read, base=Base.open(p))    # KL-divergence from the base

`read` is strata.instruments.windows.Read: int64 [n, ctx] -> float32 [n, n_scored, V], called
with `per_call` windows at a time. The instrument neither knows nor cares how the logits are
made (strata.commands.perplexity: many windows per streamed batch, as packed sequences).

Perplexity mode follows llama.cpp's `perplexity()`: NLL sums in float64, PPL = exp(mean) and
its error from the sample variance (stats.ppl_estimate). KL-divergence mode follows
`kl_divergence()`: every sum of its `kl_divergence_result` and the per-token KLD and Δp kept
for the percentiles (stats.mean_and_uncertainty, percentile, median).
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from strata.errors import StrataError
from strata.instruments import stats
from strata.instruments.kldfile import Base, BaseWriter
from strata.instruments.logprobs import KldRows, kld_rows, nll_rows, quantize_rows
from strata.instruments.windows import Read, Windows

PERCENTILES = (0.999, 0.99, 0.95, 0.90, 0.10, 0.05, 0.01, 0.001)       # KLD's, as printed
P_DIFF_PERCENTILES = (0.999, 0.99, 0.95, 0.90, 0.75, 0.25, 0.10, 0.05, 0.01, 0.001)


@dataclass
class KldSums:
    """llama.cpp's kl_divergence_result, plus the per-token values its percentiles sort."""
    sum_nll: float = 0.0
    sum_nll2: float = 0.0
    sum_nll_base: float = 0.0
    sum_nll_base2: float = 0.0
    sum_nll_nll_base: float = 0.0
    sum_kld: float = 0.0
    sum_kld2: float = 0.0
    sum_p_diff: float = 0.0
    sum_p_diff2: float = 0.0
    sum_p_diff4: float = 0.0
    max_p_diff: float = 0.0
    n_same_top: int = 0
    count: int = 0
    kld_values: list = field(default_factory=list)      # float32 [n] per window
    p_diff_values: list = field(default_factory=list)

    def add(self, r: KldRows) -> None:
        p2 = r.p_diff.double() ** 2
        self.sum_nll += float(r.nll.sum())
        self.sum_nll2 += float((r.nll ** 2).sum())
        self.sum_nll_base += float(r.nll_base.sum())
        self.sum_nll_base2 += float((r.nll_base ** 2).sum())
        self.sum_nll_nll_base += float((r.nll * r.nll_base).sum())
        self.sum_kld += float(r.kld.sum())
        self.sum_kld2 += float((r.kld ** 2).sum())
        self.sum_p_diff += float(r.p_diff.double().sum())
        self.sum_p_diff2 += float(p2.sum())
        self.sum_p_diff4 += float((p2 * p2).sum())
        self.max_p_diff = max(self.max_p_diff, float(r.p_diff.abs().max()))
        self.n_same_top += int(r.same_top.sum())
        self.count += r.nll.numel()
        self.kld_values.append(r.kld.float().numpy())
        self.p_diff_values.append(r.p_diff.float().numpy())

    def running(self) -> dict:
        """The per-window row llama.cpp prints: PPL, ln(PPL(Q)/PPL(base)), KLD, Δp RMS and same
        top p, each ± its error so far."""
        rs = stats.ratio_stats(self.sum_nll, self.sum_nll2, self.sum_nll_base,
                               self.sum_nll_base2, self.sum_nll_nll_base, self.count)
        kld, kld_err = stats.mean_and_uncertainty(self.sum_kld, self.sum_kld2, self.count)
        rms, rms_err = self._rms()
        top, top_err = self._top()
        return {"ppl": rs["ppl"], "ppl_err": rs["ppl_err"], "ln_ratio": rs["ln_ratio"],
                "ln_ratio_err": rs["ln_ratio_err"], "kld": kld, "kld_err": kld_err,
                "p_diff_rms": rms, "p_diff_rms_err": rms_err, "same_top": top,
                "same_top_err": top_err}

    def _rms(self) -> tuple[float, float]:
        mse, mse_err = stats.mean_and_uncertainty(self.sum_p_diff2, self.sum_p_diff4, self.count)
        rms = math.sqrt(mse)
        return rms, (0.5 / rms * mse_err if rms > 0 else 0.0)

    def _top(self) -> tuple[float, float]:
        top = self.n_same_top / self.count
        return top, (math.sqrt(top * (1 - top) / (self.count - 1)) if self.count > 1 else 0.0)

    def summary(self) -> dict:
        """Everything llama.cpp's three closing blocks print (perplexity, KL divergence, token
        probability), as plain data; percentiles keyed by their fraction as printed."""
        kv = np.sort(np.concatenate(self.kld_values))
        pv = np.sort(np.concatenate(self.p_diff_values))
        kld, kld_err = stats.mean_and_uncertainty(self.sum_kld, self.sum_kld2, self.count)
        dp, dp_err = stats.mean_and_uncertainty(self.sum_p_diff, self.sum_p_diff2, self.count)
        rms, rms_err = self._rms()
        top, top_err = self._top()
        return {
            "count": self.count,
            "perplexity": stats.ratio_stats(self.sum_nll, self.sum_nll2, self.sum_nll_base,
                                            self.sum_nll_base2, self.sum_nll_nll_base,
                                            self.count),
            "kld": {"mean": kld, "err": kld_err, "max": float(kv[-1]), "min": float(kv[0]),
                    "median": stats.median(kv),
                    "percentiles": {f"{100 * f:g}": stats.percentile(kv, f)
                                    for f in PERCENTILES}},
            "p_diff": {"mean": dp, "err": dp_err, "max": float(pv[-1]), "min": float(pv[0]),
                       "median": stats.median(pv),
                       "percentiles": {f"{100 * f:g}": stats.percentile(pv, f)
                                       for f in P_DIFF_PERCENTILES},
                       "rms": rms, "rms_err": rms_err, "max_abs": self.max_p_diff},
            "same_top": {"p": top, "err": top_err},
        }


@dataclass
class Result:
    ctx: int
    n_windows: int
    count: int                      # tokens scored
    ppl: float
    ppl_err: float
    running: list[float]            # PPL after each window (llama.cpp's `[i]PPL,` line)
    seconds: float
    kld: dict | None = None         # KldSums.summary() in KL-divergence mode

    def to_dict(self) -> dict:
        return {"ctx": self.ctx, "windows": self.n_windows, "scored_tokens": self.count,
                "ppl": self.ppl, "ppl_err": self.ppl_err, "running_ppl": self.running,
                "seconds": self.seconds,
                "tokens_per_s": self.n_windows * self.ctx / self.seconds if self.seconds else None,
                "kld": self.kld}


def measure(windows: Windows, read: Read, *, per_call: int = 1, save: BaseWriter | None = None,
            base: Base | None = None,
            on_window: Callable[[int, float, KldSums | None], None] | None = None) -> Result:
    """Score every window; `on_window(i, running PPL, KldSums or None)` after window i (1-based)."""
    if save is not None and base is not None:
        raise StrataError("--kld-save and --kld are two runs: save a base with one pack, then "
                          "read another against it")
    w = windows
    sum_nll = sum_nll2 = 0.0
    count, running = 0, []
    sums = KldSums() if base is not None else None
    t0 = time.perf_counter()
    for start in range(0, w.n, per_call):
        stop = min(start + per_call, w.n)
        logits = read(w.batch(start, stop))
        want = (stop - start, w.n_scored)
        if tuple(logits.shape[:2]) != want:
            raise StrataError(f"the logits source gave {list(logits.shape)} for windows "
                              f"{start}..{stop - 1}; the instrument wants {list(want)} + [V]")
        for j, i in enumerate(range(start, stop)):
            lg, tgt = logits[j].float(), w.targets(i)
            if sums is not None:
                r = kld_rows(lg, base.rows(i), tgt)
                sums.add(r)
                nll = r.nll
            else:
                nll = nll_rows(lg, tgt)
                if save is not None:
                    save.add(quantize_rows(lg))
            if not bool(torch.isfinite(nll).all()):
                raise StrataError(f"window {i + 1}: the model's logits are not finite; the pack "
                                  f"reads to NaN/Inf (check it with strata verify)")
            sum_nll += float(nll.sum())
            sum_nll2 += float((nll ** 2).sum())
            count += nll.numel()
            running.append(math.exp(sum_nll / count))
            if on_window is not None:
                on_window(i + 1, running[-1], sums)
    seconds = time.perf_counter() - t0
    if sums is not None:
        ppl, err = stats.mean_and_uncertainty(sum_nll, sum_nll2, count)
        ppl, err = math.exp(ppl), math.exp(ppl) * err
        return Result(w.ctx, w.n, count, ppl, err, running, seconds, sums.summary())
    ppl, err = stats.ppl_estimate(sum_nll, sum_nll2, count)
    return Result(w.ctx, w.n, count, ppl, err, running, seconds)
