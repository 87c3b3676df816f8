"""llama-perplexity's printed lines, from strata.instruments.perplexity's numbers.

    progress(i, ppl)        "[i]12.3456,"  one per window (perplexity mode)
    final_line(res)         "Final estimate: PPL = 12.3456 +/- 0.12345"
    KLD_HEADER, kld_row(i, sums.running())   the per-window table of --kl-divergence
    kld_blocks(summary)     the "====== ... statistics ======" blocks it closes with
"""
from __future__ import annotations

import math

KLD_HEADER = ("chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence"
              "              Δp RMS            Same top p")
FEW = 100       # llama.cpp prints no closing statistics on fewer scored tokens


def progress(i: int, ppl: float) -> str:
    return f"[{i}]{ppl:.4f},"


def final_line(ppl: float, err: float) -> str:
    if math.isnan(err):
        return f"Final estimate: PPL = {ppl:.4f} +/- nan (the log-probs have no spread)"
    return f"Final estimate: PPL = {ppl:.4f} +/- {err:.5f}"


def kld_row(i: int, r: dict) -> str:
    return (f"{i:4d}    {r['ppl']:9.4f} ± {r['ppl_err']:9.4f}"
            f"    {r['ln_ratio']:10.5f} ± {r['ln_ratio_err']:10.5f}"
            f"    {r['kld']:10.5f} ± {r['kld_err']:10.5f}"
            f"    {100 * r['p_diff_rms']:6.3f} ± {100 * r['p_diff_rms_err']:6.3f} %"
            f"    {100 * r['same_top']:6.3f} ± {100 * r['same_top_err']:6.3f} %")


def _pct(key: str) -> str:
    """'99.9' -> '99.9%', '1' -> ' 1.0%' (llama.cpp's labels)."""
    return f"{float(key):4.1f}%"


def kld_blocks(s: dict) -> str:
    p, k, d = s["perplexity"], s["kld"], s["p_diff"]
    lines = []
    if s["count"] < FEW:
        lines.append(f"note: {s['count']} scored tokens; llama-perplexity prints these "
                     f"statistics only from {FEW}")
    lines += [
        "====== Perplexity statistics ======",
        f"Mean PPL(Q)                   : {p['ppl']:10.6f} ± {p['ppl_err']:10.6f}",
        f"Mean PPL(base)                : {p['ppl_base']:10.6f} ± {p['ppl_base_err']:10.6f}",
        f"Cor(ln(PPL(Q)), ln(PPL(base))): {100 * p['cor']:6.2f}%",
        f"Mean ln(PPL(Q)/PPL(base))     : {p['ln_ratio']:10.6f} ± {p['ln_ratio_err']:10.6f}",
        f"Mean PPL(Q)/PPL(base)         : {p['ratio']:10.6f} ± {p['ratio_err']:10.6f}",
        f"Mean PPL(Q)-PPL(base)         : {p['diff']:10.6f} ± {p['diff_err']:10.6f}",
        "",
        "====== KL divergence statistics ======",
        f"Mean    KLD: {k['mean']:10.6f} ± {k['err']:10.6f}",
        f"Maximum KLD: {k['max']:10.6f}"]
    kp = k["percentiles"]
    lines += [f"{_pct(q)}   KLD: {kp[q]:10.6f}" for q in ("99.9", "99", "95", "90")]
    lines.append(f"Median  KLD: {k['median']:10.6f}")
    lines += [f"{_pct(q)}   KLD: {kp[q]:10.6f}" for q in ("10", "5", "1", "0.1")]
    lines += [f"Minimum KLD: {k['min']:10.6f}", "",
              "====== Token probability statistics ======",
              f"Mean    Δp: {100 * d['mean']:6.3f} ± {100 * d['err']:5.3f} %",
              f"Maximum Δp: {100 * d['max']:6.3f}%"]
    dp = d["percentiles"]
    lines += [f"{_pct(q)}   Δp: {100 * dp[q]:6.3f}%" for q in ("99.9", "99", "95", "90", "75")]
    lines.append(f"Median  Δp: {100 * d['median']:6.3f}%")
    lines += [f"{_pct(q)}   Δp: {100 * dp[q]:6.3f}%" for q in ("25", "10", "5", "1", "0.1")]
    lines += [f"Minimum Δp: {100 * d['min']:6.3f}%",
              f"RMS Δp    : {100 * d['rms']:6.3f} ± {100 * d['rms_err']:5.3f} %",
              f"Same top p: {100 * s['same_top']['p']:6.3f} ± {100 * s['same_top']['err']:5.3f} %"]
    return "\n".join(lines)
