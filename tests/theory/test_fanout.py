"""Outcome probabilities, Thm 12's optimal fan-out (real and integer) and the modelled hit probability."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from theory import (
    expected_hit_probability,
    integer_fanout,
    optimal_fanout,
    outcome_probabilities,
    uniform_fanout,
)
from theory.fanout import round_largest_remainder

FAST = settings(deadline=None, max_examples=40)
# Hit probabilities are sums of ≤ 17 terms; comparisons allow this much rounding.
TOL = 1e-12

schedules = st.fixed_dictionaries(
    {
        "alpha": st.floats(0.0, 1.0),
        "r": st.floats(0.2, 3.0),
        "K": st.integers(0, 8),
        "B": st.integers(0, 48),
        "scale": st.sampled_from([1.0, 0.8, 0.5, 0.2]),
    }
)


def test_outcome_probabilities() -> None:
    P = outcome_probabilities(0.8, 3)
    assert np.allclose(P, [0.2, 0.16, 0.128, 0.512]) and P.sum() == pytest.approx(1.0)
    assert np.array_equal(outcome_probabilities(0.0, 3), [1, 0, 0, 0])
    assert np.array_equal(outcome_probabilities(1.0, 3), [0, 0, 0, 1])
    assert outcome_probabilities(np.array([0.2, 0.5]), 4).shape == (2, 5)


def test_optimal_fanout_matches_the_worked_example() -> None:
    # docs/ssd.md §4: α = 0.8, r = 1, K = 7, B = 24.
    F = optimal_fanout(0.8, 1.0, 7, 24)
    assert np.allclose(F, [3.9, 3.5, 3.1, 2.8, 2.5, 2.2, 2.0, 4.0], atol=0.05)
    assert F.sum() == pytest.approx(24)


@FAST
@given(alpha=st.floats(0.01, 0.99), r=st.floats(0.2, 3.0), K=st.integers(1, 10), B=st.floats(1, 100))
def test_optimal_fanout_is_the_capped_geometric_series(alpha, r, K, B) -> None:
    F = optimal_fanout(alpha, r, K, B)
    assert F.sum() == pytest.approx(B)
    k = np.arange(K)
    assert np.allclose(F[:K], F[0] * alpha ** (k / (1 + r)))
    assert F[K] == pytest.approx(F[0] * alpha ** (K / (1 + r)) * (1 - alpha) ** (-1 / (1 + r)))


@FAST
@given(alpha=st.floats(0.05, 0.95), r=st.floats(0.2, 3.0), K=st.integers(1, 8), seed=st.integers(0, 2**32 - 1))
def test_optimal_fanout_minimises_the_relaxed_objective(alpha, r, K, seed) -> None:
    """Thm 12 without the cap: no other real schedule with the same budget has a lower Σ P(k)·F_k^(−r)."""
    B = 10.0 * (K + 1)
    P = outcome_probabilities(alpha, K)
    best = (P * optimal_fanout(alpha, r, K, B) ** -r).sum()
    other = B * np.random.default_rng(seed).dirichlet(np.ones(K + 1))
    assert best <= (P * other**-r).sum() * (1 + TOL)


def test_optimal_fanout_broadcasts_over_alpha_and_r() -> None:
    F = optimal_fanout(np.array([[0.5], [0.8]]), np.array([0.5, 1.0, 2.0]), 4, 20)  # [2, 1] x [3]
    assert F.shape == (2, 3, 5) and np.allclose(F.sum(axis=-1), 20)


@FAST
@given(schedules)
def test_integer_fanout_spends_exactly_the_budget(s) -> None:
    F = integer_fanout(s["alpha"], s["r"], s["K"], s["B"], s["scale"])
    assert F.dtype.kind == "i" and F.shape == (s["K"] + 1,)
    assert F.sum() == s["B"] and (F >= 0).all()


@FAST
@given(schedules)
def test_integer_optimum_never_misses_more_than_uniform_or_rounding(s) -> None:
    alpha, r, K, B, scale = s["alpha"], s["r"], s["K"], s["B"], s["scale"]
    best = expected_hit_probability(integer_fanout(alpha, r, K, B, scale), alpha, r, scale)
    uniform = expected_hit_probability(uniform_fanout(K, B), alpha, r, scale)
    assert best >= uniform - TOL
    if B > 0:
        rounded = round_largest_remainder(optimal_fanout(alpha, r, K, B), B)
        assert rounded.sum() == B and (rounded >= 0).all()
        assert best >= expected_hit_probability(rounded, alpha, r, scale) - TOL


@pytest.mark.parametrize(("alpha", "r", "K", "B", "scale"), [(0.8, 1.0, 3, 9, 1.0), (0.6, 0.7, 2, 12, 0.5)])
def test_integer_fanout_is_the_brute_force_optimum(alpha, r, K, B, scale) -> None:
    compositions = [c for c in itertools.product(range(B + 1), repeat=K + 1) if sum(c) == B]
    hits = expected_hit_probability(np.array(compositions), alpha, r, scale)
    best = expected_hit_probability(integer_fanout(alpha, r, K, B, scale), alpha, r, scale)
    assert best == pytest.approx(hits.max(), abs=TOL)


def test_integer_fanout_of_the_worked_example_beats_uniform() -> None:
    F = integer_fanout(0.8, 1.0, 7, 24)
    assert F.tolist() == [4, 3, 3, 3, 3, 2, 2, 4]
    assert expected_hit_probability(F, 0.8, 1.0) > expected_hit_probability(uniform_fanout(7, 24), 0.8, 1.0)


def test_greedy_would_fail_where_one_guess_buys_nothing() -> None:
    # With miss = F^(−r), F = 1 never hits, so the uniform [1]*8 gets nothing; the optimum pairs guesses up.
    F = integer_fanout(0.8, 1.0, 7, 8)
    assert expected_hit_probability(uniform_fanout(7, 8), 0.8, 1.0) == 0.0
    assert expected_hit_probability(F, 0.8, 1.0) > 0.2 and F.sum() == 8


def test_expected_hit_probability_of_a_schedule() -> None:
    P = outcome_probabilities(0.5, 2)  # [0.5, 0.25, 0.25]
    assert expected_hit_probability([0, 2, 4], 0.5, 1.0) == pytest.approx(0.25 * 0.5 + 0.25 * 0.75)
    assert expected_hit_probability([0, 0, 0], 0.5, 1.0) == 0.0
    assert expected_hit_probability(np.array([[2, 2, 2], [4, 4, 4]]), 0.5, 1.0).shape == (2,)
    assert P.sum() == pytest.approx(1.0)


def test_uniform_and_rounding() -> None:
    assert uniform_fanout(7, 24).tolist() == [3] * 8
    assert uniform_fanout(3, 10).tolist() == [3, 3, 2, 2]
    assert round_largest_remainder([1.5, 1.5, 1.0], 4).tolist() == [2, 1, 1]


@pytest.mark.parametrize(
    ("call", "fragment"),
    [
        (lambda: optimal_fanout(0.8, 0.0, 7, 24), "r must be > 0"),
        (lambda: optimal_fanout(0.8, 1.0, 7, 0), "B must be > 0"),
        (lambda: integer_fanout(0.8, 1.0, 7, -1), "B must be an integer >= 0"),
        (lambda: integer_fanout(1.2, 1.0, 7, 24), "alpha is a probability"),
        (lambda: expected_hit_probability(3.0, 0.8, 1.0), "F must be a schedule"),
        (lambda: round_largest_remainder([1.0, 1.0], 3), "summing to B"),
    ],
)
def test_bad_fanout_input_raises_value_error(call, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        call()
