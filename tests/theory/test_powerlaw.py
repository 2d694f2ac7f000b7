"""Def. 11's power-law miss model and the fit of r with its uncertainty."""

from __future__ import annotations

import re

import numpy as np
import pytest
from scipy import stats

from theory import fit_r, miss_rate

FANOUTS = np.array([1, 2, 4, 8, 16, 32])


def test_miss_rate_power_law_and_its_caps() -> None:
    assert miss_rate(4, 1.0) == pytest.approx(0.25)
    assert miss_rate(0, 1.0) == 1.0  # nothing guessed: always a miss
    assert miss_rate(1, 0.7) == 1.0  # docs/ssd.md's form: one guess buys nothing
    assert miss_rate(0.5, 1.0) == 1.0  # real fan-outs below 1 are capped
    assert miss_rate(1, 0.7, scale=0.4) == pytest.approx(0.4)
    assert miss_rate(np.array([[1], [2]]), np.array([0.5, 1.0])).shape == (2, 2)


def test_fit_recovers_r_exactly_from_noiseless_data() -> None:
    fit = fit_r(FANOUTS, 0.5 * FANOUTS**-0.8)
    assert fit.r == pytest.approx(0.8) and fit.scale == pytest.approx(0.5)
    assert fit.r_stderr == pytest.approx(0.0, abs=1e-9)
    fixed = fit_r(FANOUTS, FANOUTS**-0.8, fix_scale=True)
    assert fixed.r == pytest.approx(0.8) and fixed.scale == 1.0 and fixed.dof == FANOUTS.size - 1


def test_fit_of_the_cli_example() -> None:
    fit = fit_r([1, 2, 4, 8], [0.5, 0.3, 0.17, 0.09])
    assert 0.75 < fit.r < 0.9 and fit.r_ci[0] < fit.r < fit.r_ci[1]
    assert fit.dof == 2 and fit.method.startswith("linregress")


def test_fit_recovers_a_known_r_within_its_interval() -> None:
    """One seeded noisy data set: a correct 95% interval misses with probability 5% (fixed by the seed)."""
    rng = np.random.default_rng(11)
    noisy = 0.5 * FANOUTS**-0.8 * np.exp(rng.normal(0, 0.1, FANOUTS.size))
    lo, hi = fit_r(FANOUTS, noisy).r_ci
    assert lo < 0.8 < hi


@pytest.mark.parametrize("fix_scale", [False, True])
def test_fit_interval_has_its_stated_coverage(fix_scale: bool) -> None:
    """Over 400 synthetic data sets with log-normal noise (the model the t interval assumes; the fixed-scale
    fit starts at F = 4 so that F^(−r)·noise stays below 1) the 95% interval must cover the true r about 380
    times. We accept any count the Binomial(400, 0.95) law gives with probability ≥ 1e-4 on each side, so a
    correct interval fails with probability < 2e-4. Negative control: intervals half as wide fail the check.
    """
    rng = np.random.default_rng(2026 + fix_scale)
    r_true, scale, trials = 0.8, 1.0 if fix_scale else 0.5, 400
    fanouts = FANOUTS[2:] if fix_scale else FANOUTS
    covered = covered_half = 0
    for _ in range(trials):
        noisy = scale * fanouts**-r_true * np.exp(rng.normal(0, 0.15, fanouts.size))
        fit = fit_r(fanouts, noisy, fix_scale=fix_scale)
        covered += fit.r_ci[0] <= r_true <= fit.r_ci[1]
        half = (fit.r_ci[1] - fit.r_ci[0]) / 4
        covered_half += abs(fit.r - r_true) <= half
    lo, hi = stats.binom.ppf([1e-4, 1 - 1e-4], trials, 0.95)
    assert lo <= covered <= hi
    assert not lo <= covered_half <= hi


@pytest.mark.parametrize(
    ("fanout", "miss", "fragment"),
    [
        ([1, 2, 4], [0.5, 0.3], "one miss rate per fan-out"),
        ([1, 2, 4], [0.5, 0.0, 0.1], "miss rates must lie in (0, 1]"),
        ([0.5, 2, 4], [0.5, 0.3, 0.1], "fan-outs must be >= 1"),
        ([1, 2], [0.5, 0.3], "at least 3 points"),
        ([2, 2, 2], [0.5, 0.3, 0.2], "two distinct fan-outs"),
    ],
)
def test_bad_fit_input_raises_value_error(fanout, miss, fragment: str) -> None:
    with pytest.raises(ValueError, match=re.escape(fragment)):
        fit_r(fanout, miss)
