"""best_K against brute force, its monotonicity in α, the running α estimate and the heuristic schedule."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from theory import acceptance_estimate, best_K, expected_tokens, heuristic_K, round_rate, updated_counts

alphas = st.floats(0.0, 1.0)
costs = st.floats(0.0, 2.0)


@settings(max_examples=200, deadline=None)
@given(alpha=alphas, draft_ms=costs, K_max=st.integers(1, 12))
def test_best_K_maximises_tokens_per_time_by_brute_force(alpha, draft_ms, K_max):
    def rate(K):
        return float(expected_tokens(alpha, K)) / (K * draft_ms + 1.0)

    K = best_K(alpha, draft_ms, 1.0, K_max)
    assert 1 <= K <= K_max
    assert rate(K) >= max(rate(j) for j in range(1, K_max + 1)) * (1 - 1e-12)


@settings(max_examples=200, deadline=None)
@given(a=alphas, b=alphas, draft_ms=st.floats(0.001, 2.0), K_max=st.integers(1, 12))
def test_higher_alpha_never_gives_a_smaller_K(a, b, draft_ms, K_max):
    low, high = sorted((a, b))
    assert best_K(low, draft_ms, 1.0, K_max) <= best_K(high, draft_ms, 1.0, K_max)


def test_extremes_reach_the_bounds():
    assert best_K(1.0, 0.05, 1.0, K_max=8) == 8  # every draft token accepted, drafting cheap
    assert best_K(0.0, 0.05, 1.0, K_max=8, K_min=1) == 1  # nothing is ever accepted
    assert best_K(0.0, 0.05, 1.0, K_max=8, K_min=0) == 0


def test_a_batch_maximises_the_sum_over_its_rows():
    alphas, draft_ms = [0.95, 0.1], 0.1
    K = best_K(alphas, draft_ms, 1.0, K_max=10)
    rates = [sum(float(expected_tokens(a, j)) for a in alphas) / (j * draft_ms + 1) for j in range(1, 11)]
    assert K == 1 + int(np.argmax(rates))


def test_verify_time_may_depend_on_the_block_width():
    # A verify that costs 1 + 0.5 per extra position makes long blocks expensive: K falls.
    flat = best_K(0.8, 0.05, 1.0, K_max=10)
    growing = best_K(0.8, 0.05, lambda width: 1.0 + 0.5 * (width - 1), K_max=10)
    assert growing < flat
    assert round_rate(0.8, 2, 0.05, lambda width: 1.0 + 0.5 * (width - 1)) == pytest.approx(
        float(expected_tokens(0.8, 2)) / (2 * 0.05 + 2.0)
    )


def test_acceptance_estimate_starts_at_the_prior_and_follows_the_counts():
    assert acceptance_estimate(0, 0) == 0.5
    assert acceptance_estimate(98, 0) == pytest.approx(98.5 / 99)
    accepted, rejected = 0.0, 0.0
    for _ in range(50):  # α = 1: K of K every round
        accepted, rejected = updated_counts(accepted, rejected, 4, 4)
    assert acceptance_estimate(accepted, rejected) > 0.97
    for _ in range(250):  # then nothing is accepted (one observation a round): the forgotten past stops mattering
        accepted, rejected = updated_counts(accepted, rejected, 0, 4)
    assert acceptance_estimate(accepted, rejected) < 0.03  # (a₀ + ~0.3) / (a₀ + b₀ + ~0.3 + ~50 rejections)


def test_the_estimate_does_not_depend_on_K():
    """Forgotten per round, K = 1 kept a quarter of K = 4's observations and the prior held its α at most 11/12
    for a draft that is always right: short K looked best because it was short. Forgotten per observation,
    every K sees about the same memory."""

    def estimate(K, update, **prior):
        accepted, rejected = 0.0, 0.0
        for _ in range(400):  # a draft that is always right: K of K every round
            accepted, rejected = update(accepted, rejected, K)
        return float(acceptance_estimate(accepted, rejected, **prior))

    per_observation = [estimate(K, lambda a, r, K: updated_counts(a, r, K, K)) for K in (1, 2, 4, 8)]
    assert min(per_observation) > 0.985 and max(per_observation) - min(per_observation) < 0.005
    # negative control, forgetting per round (0.9) with prior (1, 1): K = 1 held at 11/12, far below K = 8
    per_round = [
        estimate(K, lambda a, r, K: (0.9 * a + K, 0.9 * r), prior_accepted=1, prior_rejected=1) for K in (1, 8)
    ]
    assert per_round[0] == pytest.approx(11 / 12) and per_round[1] - per_round[0] > 0.05


def test_updated_counts_per_row_and_bad_input():
    a, r = updated_counts([0.0, 0.0], [0.0, 0.0], [2, 1], 2, decay=1.0)
    assert a.tolist() == [2, 1] and r.tolist() == [0, 1]
    with pytest.raises(ValueError, match="0..K"):
        updated_counts(0, 0, 3, 2)
    with pytest.raises(ValueError, match="alpha"):
        best_K(1.5, 0.1, 1.0, 4)


def test_heuristic_schedule_grows_by_two_and_shrinks_by_one():
    assert heuristic_K(4, True) == 6
    assert heuristic_K(4, False) == 3
    assert heuristic_K(1, False) == 1
