"""Acceptance and hit models: their tables, the sampled frequencies, and the power-law hit rate vs theory."""

import numpy as np
import pytest

from simulator import (
    ClosedLoop,
    ConstantTiming,
    IidAcceptance,
    PerPositionAcceptance,
    Policy,
    PowerLawHit,
    SimConfig,
    simulate,
)
from simulator.acceptance import ConstantHit, Source, position_pmf, truncated_geometric
from simulator.draws import TableDraws
from theory import expected_hit_probability, outcome_probabilities


def test_truncated_geometric_matches_theory_outcome_probabilities():
    assert truncated_geometric(0.7, 5) == pytest.approx(outcome_probabilities(0.7, 5))


def test_per_position_pmf_by_hand():
    # accept position 1 w.p. 0.9, position 2 w.p. 0.5
    assert position_pmf([0.9, 0.5], 2) == pytest.approx([0.1, 0.45, 0.45])
    model = PerPositionAcceptance((0.9, 0.5, 0.2))
    assert model.pmf(2, Source.DRAFT).sum() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="K = 4 needs 4 per-position rates"):
        model.pmf(4, Source.DRAFT)


def test_sources_get_their_own_rates():
    model = IidAcceptance(0.8, alpha_cache=0.7, alpha_lookup=0.3)
    assert [model.rate(s) for s in Source] == [0.7, 0.8, 0.0, 0.3]
    with pytest.raises(ValueError, match="alpha_lookup"):
        IidAcceptance(0.8).rate(Source.LOOKUP)


def test_the_lookup_backup_can_have_its_own_rates_per_position():
    """A looked-up continuation tends to hold for all K or fail at once; i.i.d. at its mean rate would not."""
    runs = PerPositionAcceptance((0.9,) * 4, alpha_lookup=0.7, alphas_lookup=(0.5, 0.9, 0.9, 0.95))
    assert runs.pmf(4, Source.LOOKUP) == pytest.approx(position_pmf([0.5, 0.9, 0.9, 0.95], 4))
    assert runs.pmf(5, Source.LOOKUP) == pytest.approx(position_pmf([0.5, 0.9, 0.9, 0.95, 0.95], 5))  # last rate on
    assert runs.pmf(4, Source.LOOKUP)[4] == pytest.approx(0.5 * 0.9 * 0.9 * 0.95)
    iid = PerPositionAcceptance((0.9,) * 4, alpha_lookup=0.7)  # without them: i.i.d. at alpha_lookup
    assert iid.pmf(4, Source.LOOKUP) == pytest.approx(truncated_geometric(0.7, 4))
    assert runs.pmf(4, Source.RANDOM) == pytest.approx(truncated_geometric(0.0, 4))  # random tokens unchanged
    with pytest.raises(ValueError, match="alphas_lookup\\[1\\]"):
        PerPositionAcceptance((0.9,), alphas_lookup=(0.5, 1.5))


def test_sampled_k_follow_the_table():
    # 100,000 draws: each frequency's standard error is below 0.0016, so ±0.008 is 5 standard errors
    draws = TableDraws(IidAcceptance(0.6), None, 3, Source.DRAFT, None, None, np.random.default_rng(0))
    ks = [draws.accepted([False])[0] for _ in range(100_000)]
    assert np.bincount(ks, minlength=4) / len(ks) == pytest.approx(truncated_geometric(0.6, 3), abs=0.008)


def test_power_law_hit_rate_matches_theory():
    alpha, r, scale, fanout = 0.8, 0.9, 0.6, (4, 3, 3, 2, 6)
    config = SimConfig(
        Policy("ssd", K=4, fanout=fanout),
        ConstantTiming(10.0),
        IidAcceptance(alpha),
        PowerLawHit(r, scale),
        ClosedLoop(1, output_len=None),
        rounds=40_000,
    )
    expected = expected_hit_probability(np.array(fanout, dtype=float), alpha, r, scale)
    # a hit rate from 40,000 lookups has standard error below 0.0025: ±0.0125 is 5 of them
    assert simulate(config).hit_rate == pytest.approx(expected, abs=0.0125)


def test_power_law_with_no_guess_never_hits():
    assert PowerLawHit(1.0).hit_prob((0, 1, 4), True) == pytest.approx([0.0, 0.0, 0.75])


@pytest.mark.parametrize(
    "bad, message",
    [
        (lambda: IidAcceptance(1.2), "alpha is a per-token acceptance rate"),
        (lambda: ConstantHit(-0.1), "p_hit is a probability"),
        (lambda: PowerLawHit(0.0), "r must be > 0"),
        (lambda: PerPositionAcceptance(()), "one acceptance rate per draft position"),
    ],
)
def test_bad_models_are_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        bad()
