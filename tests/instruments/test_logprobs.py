"""Per-token rows (llama.cpp's uint16 base rows, NLL, KLD, Δp, top token) on hand-computed cases,
and the windows the protocol cuts."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from strata.errors import StrataError
from strata.instruments.logprobs import (LOG_RANGE, base_log_probs, kld_rows, nll_rows,
                                         quantize_rows, row_width)
from strata.instruments.windows import Windows

STEP = LOG_RANGE / 65535          # a base row's log-prob resolution (nats)


def test_row_width_is_two_floats_and_the_vocabulary_padded_to_even():
    assert row_width(3) == 8 and row_width(4) == 8 and row_width(151936) == 151940


def test_quantize_a_row_by_hand():
    # logits 2, 0, -20: max 2, min clipped to 2 - 16 = -14, scale 16/65535
    lg = torch.tensor([[2.0, 0.0, -20.0]])
    lse = math.log(1 + math.exp(-2) + math.exp(-22))
    row = quantize_rows(lg)
    assert row.shape == (1, 8) and row.dtype == np.uint16
    scale, low = row[0, :4].copy().view(np.float32)
    assert scale == pytest.approx(16 / 65535, rel=1e-6)
    assert low == pytest.approx(-14 - 2 - lse, rel=1e-6)
    assert list(row[0, 4:7]) == [65535, round(14 / STEP), 0]     # 14/STEP = 57343.125
    assert row[0, 7] == 0                                         # the pad
    lp = base_log_probs(row, 3)[0]
    assert float(lp[0]) == pytest.approx(-lse, abs=STEP)
    assert float(lp[1]) == pytest.approx(-2 - lse, abs=STEP)
    assert float(lp[2]) == pytest.approx(-16 - lse, abs=1e-5)     # below the range: its floor


def test_a_flat_row_is_exact():
    # every logit equal: scale 0, every q 0, log p = min_log_prob = -ln V exactly
    row = quantize_rows(torch.zeros(1, 4))
    assert row[0, :4].copy().view(np.float32)[0] == 0.0
    assert not row[0, 4:].any()
    assert torch.allclose(base_log_probs(row, 4), torch.full((1, 4), -math.log(4)))


def test_quantized_log_probs_are_within_half_a_step():
    g = torch.Generator().manual_seed(0)
    lg = 3 * torch.randn(5, 1001, generator=g)
    lp = torch.log_softmax(lg.double(), dim=1)
    back = base_log_probs(quantize_rows(lg), 1001).double()
    kept = lp > lp.max(dim=1, keepdim=True).values - LOG_RANGE
    err = (back - lp).abs()[kept]
    assert float(err.max()) <= STEP / 2 + 1e-5      # rounding to the grid + float32 arithmetic


def test_nll_rows():
    lg = torch.tensor([[0.0, math.log(3.0)], [5.0, 5.0]])
    nll = nll_rows(lg, torch.tensor([0, 1]))
    assert nll.dtype == torch.float64
    assert nll.tolist() == pytest.approx([math.log(4.0), math.log(2.0)], rel=1e-7)


def test_kld_of_a_model_against_a_flat_base_by_hand():
    # base uniform over 2 tokens (exact: a flat row); the model gives 3/4, 1/4.
    # KL(base || Q) = ½ ln(½ / ¾) + ½ ln(½ / ¼) = ½ ln(4/3); target token 1:
    # NLL ln 4, base NLL ln 2, Δp = ¼ - ½; top tokens both 0 (the base's first of a tie)
    base = quantize_rows(torch.zeros(1, 2))
    r = kld_rows(torch.tensor([[math.log(3.0), 0.0]]), base, torch.tensor([1]))
    assert float(r.kld[0]) == pytest.approx(0.5 * math.log(4 / 3), rel=1e-6)
    assert float(r.nll[0]) == pytest.approx(math.log(4), rel=1e-6)
    assert float(r.nll_base[0]) == pytest.approx(math.log(2), rel=1e-6)
    assert float(r.p_diff[0]) == pytest.approx(-0.25, rel=1e-6)
    assert bool(r.same_top[0])
    r = kld_rows(torch.tensor([[0.0, math.log(3.0)]]), base, torch.tensor([1]))
    assert not bool(r.same_top[0])          # the model's top is 1, the base's (tie) 0


def test_kld_skips_base_entries_below_the_range():
    # base logits 0, -30: the second is below max - 16, its term is left out (llama.cpp's
    # p_log_base > -16 test), so the KLD is p₀·(log p₀ - log q₀) alone
    base = quantize_rows(torch.tensor([[0.0, -30.0]]))
    r = kld_rows(torch.tensor([[0.0, 0.0]]), base, torch.tensor([0]))
    lp0 = float(base_log_probs(base, 2)[0, 0])
    assert float(r.kld[0]) == pytest.approx(math.exp(lp0) * (lp0 + math.log(2)), rel=1e-6)


def test_a_row_against_its_own_base_is_within_the_step():
    # |KLD| <= max |δ| · Σ p_base, δ the rounding of a log-prob (<= STEP / 2 + float error)
    g = torch.Generator().manual_seed(1)
    lg = 4 * torch.randn(16, 300, generator=g)
    r = kld_rows(lg, quantize_rows(lg), torch.arange(16))
    bound = (STEP / 2 + 1e-5) * math.exp(STEP)
    assert float(r.kld.abs().max()) <= bound
    lp = torch.log_softmax(lg, dim=1)
    tgt = lp[torch.arange(16), torch.arange(16)]
    kept = tgt > lp.max(dim=1).values - LOG_RANGE      # a target below the range reads its floor
    assert 0 < int(kept.sum()) < 16
    assert float((r.nll - r.nll_base).abs()[kept].max()) <= STEP / 2 + 1e-5
    assert bool((r.nll_base[~kept] <= r.nll[~kept]).all())
    assert bool(r.same_top.all())


def test_windows_put_bos_first_and_score_the_second_half():
    w = Windows.of(list(range(100, 123)), ctx=8, bos=1)      # 23 tokens: 2 windows, 7 dropped
    assert (w.n, w.first, w.n_scored) == (2, 4, 3)
    assert w.ids(1).tolist() == [1, 109, 110, 111, 112, 113, 114, 115]
    assert w.targets(1).tolist() == [113, 114, 115]          # predicted by positions 4, 5, 6
    assert w.batch(0, 2)[0].tolist() == [1, 101, 102, 103, 104, 105, 106, 107]
    assert Windows.of(list(range(16)), ctx=8, bos=None).ids(1)[0] == 8


@pytest.mark.parametrize("ctx, n, words", [(7, 100, "odd"), (2, 100, "too small"),
                                           (8, 15, "at least 16")])
def test_windows_refuse(ctx, n, words):
    with pytest.raises(StrataError, match=words):
        Windows.of(list(range(n)), ctx=ctx, bos=None)
