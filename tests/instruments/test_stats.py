"""llama.cpp's statistics on hand-computed cases (tools/perplexity/perplexity.cpp's formulas)."""
from __future__ import annotations

import math

import pytest

from strata.instruments import stats


def test_ppl_estimate_is_exp_mean_and_the_error_of_the_mean_carried_through_exp():
    # NLL 1, 2, 3: mean 2, population variance 14/3 - 4 = 2/3, error of the mean
    # sqrt((2/3) / (3 - 1)) = sqrt(1/3), times PPL = e²
    ppl, err = stats.ppl_estimate(6.0, 14.0, 3)
    assert ppl == pytest.approx(math.exp(2), rel=1e-15)
    assert err == pytest.approx(math.exp(2) * math.sqrt(1 / 3), rel=1e-14)


def test_ppl_estimate_without_spread_has_no_error():
    ppl, err = stats.ppl_estimate(3 * math.log(2), 3 * math.log(2) ** 2, 3)
    assert ppl == pytest.approx(2.0, rel=1e-15) and math.isnan(err)


def test_mean_and_uncertainty_needs_more_than_ten_values():
    # 0..10: mean 5, population variance 385/11 - 25 = 10, error sqrt(10 / 10) = 1
    assert stats.mean_and_uncertainty(55.0, 385.0, 11) == pytest.approx((5.0, 1.0), rel=1e-15)
    # 0..9: ten values, llama.cpp gives no error
    assert stats.mean_and_uncertainty(45.0, 285.0, 10) == (4.5, 0.0)
    assert stats.mean_and_uncertainty(0.0, 0.0, 0) == (0.0, 0.0)


def test_covariance_is_that_of_the_means():
    # a = b = 0..10: (385/11 - 5·5) / (11 - 1) = 1; below ten values it is 0
    assert stats.covariance(55.0, 55.0, 385.0, 11) == pytest.approx(1.0, rel=1e-15)
    assert stats.covariance(36.0, 36.0, 204.0, 9) == 0.0


def test_percentile_interpolates_between_order_statistics():
    v = [0.0, 1.0, 2.0, 3.0, 4.0]
    assert stats.percentile(v, 0.9) == pytest.approx(3.6)      # p = 0.9·4 = 3.6
    assert stats.percentile([0.0, 10.0], 0.25) == pytest.approx(2.5)
    assert stats.percentile(v, 0.0) == 0.0 and stats.percentile(v, 1.0) == 4.0
    assert stats.percentile([7.0], 0.5) == 7.0


def test_median_takes_the_middle_or_the_mean_of_the_two_middles():
    assert stats.median([1.0, 2.0, 3.0]) == 2.0
    assert stats.median([1.0, 2.0, 3.0, 4.0]) == 2.5


def test_ratio_stats_of_a_model_against_itself():
    # NLL 0..10 for both: ratio 1, ln ratio 0 with no error, correlation 1
    r = stats.ratio_stats(55.0, 385.0, 55.0, 385.0, 385.0, 11)
    assert r["ratio"] == 1.0 and r["ln_ratio"] == 0.0 and r["diff"] == 0.0
    assert r["ppl"] == pytest.approx(math.exp(5)) and r["ppl_err"] == pytest.approx(math.exp(5))
    assert r["cor"] == pytest.approx(1.0) and r["ln_ratio_err"] == pytest.approx(0.0, abs=1e-7)


def test_ratio_stats_of_a_shifted_model():
    # Q's NLL = base's + 1 on 0..10: ln ratio 1, its error 0 (perfectly correlated), ratio e
    r = stats.ratio_stats(66.0, 506.0, 55.0, 385.0, 440.0, 11)
    assert r["ln_ratio"] == pytest.approx(1.0) and r["ratio"] == pytest.approx(math.e)
    assert r["cor"] == pytest.approx(1.0) and r["ln_ratio_err"] == pytest.approx(0.0, abs=1e-7)
