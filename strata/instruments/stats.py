"""llama.cpp's statistics (tools/perplexity/perplexity.cpp), as pure functions of sums.

Every figure llama-perplexity prints is one of these, so strata's numbers mean what model cards
quote:

    ppl_estimate(sum, sum2, n)        perplexity mode: exp(mean NLL), and its error
                                      ppl * sqrt((sum2/n - mean²) / (n - 1))   (no n > 10 rule)
    mean_and_uncertainty(sum, sum2, n)  KLD mode: (mean, sqrt((sum2/n - mean²) / (n - 1))),
                                      the error 0 unless the variance is positive and n > 10
    covariance(sa, sb, sab, n)        (sab/n - sa/n · sb/n) / (n - 1), 0 below n = 10
    percentile(sorted, f)             linear between order statistics at f·(n - 1)
    median(sorted)                    the middle value, or the mean of the two middle ones

Sums are float64 (llama.cpp accumulates in double); per-token values are what it keeps as float.
"""
from __future__ import annotations

import math
from collections.abc import Sequence


def ppl_estimate(sum_nll: float, sum_nll2: float, count: int) -> tuple[float, float]:
    """(PPL, its standard error) as llama-perplexity's final line: the error of the mean NLL
    (sample variance over count - 1) carried through exp, i.e. times PPL. NaN error when the
    variance is not positive (llama.cpp then prints "Unexpected negative standard deviation")."""
    if count < 1:
        raise ValueError("no scored token")
    mean = sum_nll / count
    var = sum_nll2 / count - mean * mean
    ppl = math.exp(mean)
    if var > 0 and count > 1:
        return ppl, math.sqrt(var / (count - 1)) * ppl
    return ppl, math.nan


def mean_and_uncertainty(total: float, total2: float, count: int) -> tuple[float, float]:
    """(mean, standard error of the mean) as the KL-divergence mode computes them."""
    if count < 1:
        return 0.0, 0.0
    f = total / count
    df = total2 / count - f * f
    return f, (math.sqrt(df / (count - 1)) if df > 0 and count > 10 else 0.0)


def covariance(sum_a: float, sum_b: float, sum_ab: float, count: int) -> float:
    """The covariance of the two means (llama.cpp's `covariance`: already divided by n - 1)."""
    if count < 10:
        return 0.0
    return (sum_ab / count - (sum_a / count) * (sum_b / count)) / (count - 1)


def percentile(values: Sequence[float], fraction: float) -> float:
    """llama.cpp's percentile of sorted `values`: p = fraction·(n - 1), linear between the
    order statistics floor(p) and floor(p) + 1; the ends at fraction <= 0 / >= 1."""
    if not len(values):
        raise ValueError("no values")
    if fraction <= 0:
        return float(values[0])
    if fraction >= 1:
        return float(values[-1])
    p = fraction * (len(values) - 1)
    ip = int(p)
    p -= ip
    return float((1 - p) * values[ip] + p * values[min(ip + 1, len(values) - 1)])


def median(values: Sequence[float]) -> float:
    """The median of sorted `values` as llama.cpp takes it (mean of the middle two when even)."""
    n = len(values)
    if not n:
        raise ValueError("no values")
    return float(values[n // 2]) if n % 2 else 0.5 * float(values[n // 2] + values[n // 2 - 1])


def ratio_stats(sum_nll: float, sum_nll2: float, sum_base: float, sum_base2: float,
                sum_cross: float, count: int) -> dict:
    """PPL(Q) against PPL(base) as llama.cpp's "Perplexity statistics" block: each PPL ± error,
    the correlation of the two mean log-PPLs, ln(PPL(Q)/PPL(base)), the ratio and the
    difference, each ± its error (errors combined with the covariance). Where rounding makes a
    combined variance negative (a model against its own base) the error is 0; llama.cpp prints
    nan there."""
    lq, dlq = mean_and_uncertainty(sum_nll, sum_nll2, count)
    lb, dlb = mean_and_uncertainty(sum_base, sum_base2, count)
    cov = covariance(sum_nll, sum_base, sum_cross, count)
    ppl, ppl_base = math.exp(lq), math.exp(lb)
    dppl, dppl_base = ppl * dlq, ppl_base * dlb
    den = dlq * dlb
    cor = cov / den if den > 0 else math.nan
    ln_ratio = lq - lb
    dln = math.sqrt(max(dlq * dlq + dlb * dlb - 2.0 * cov, 0.0))
    ratio = math.exp(ln_ratio)
    ddiff = math.sqrt(max(dppl * dppl + dppl_base * dppl_base - 2.0 * ppl * ppl_base * cov, 0.0))
    return {"ppl": ppl, "ppl_err": dppl, "ppl_base": ppl_base, "ppl_base_err": dppl_base,
            "cor": cor, "ln_ratio": ln_ratio, "ln_ratio_err": dln,
            "ratio": ratio, "ratio_err": ratio * dln,
            "diff": ppl - ppl_base, "diff_err": ddiff}
