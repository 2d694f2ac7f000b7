"""Outcome probabilities, Thm 12's optimal fan-out (real and integer) and the modelled hit probability."""

from __future__ import annotations

import itertools
from fractions import Fraction

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
from theory.fanout import integer_fanout_dp, round_largest_remainder
from theory.powerlaw import miss_rate

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


small_problems = st.fixed_dictionaries(
    {
        "alpha": st.floats(0.0, 1.0),
        "r": st.floats(0.1, 3.0, exclude_min=True),
        "K": st.integers(0, 7),
        "B": st.integers(0, 60),
        "scale": st.floats(0.3, 2.0),
    }
)


def best_two_hits(alpha: float, r: float, K: int, B: int, scale: float) -> tuple[float, float]:
    """Hit probability of the best schedule and of the second best (another schedule): the dynamic programme
    keeping the two best suffixes per budget, since the runner-up is the best with one choice changed."""
    P = outcome_probabilities(alpha, K)
    gain = P[:, None] * (1.0 - miss_rate(np.arange(B + 1), r, scale))  # [K+1, B+1]
    top = np.stack([gain[K], np.full(B + 1, -np.inf)])  # [2, B+1]: outcome K alone has one schedule per budget
    for k in range(K - 1, -1, -1):
        here = np.empty((2, B + 1))
        for c in range(B + 1):
            totals = np.sort((gain[k, : c + 1] + top[:, c::-1]).ravel())  # F_k = 0..c times the two suffixes
            here[:, c] = totals[-1], totals[-2]
        top = here
    return top[0, B], top[1, B]


def exact_optimum(alpha: float, r: int, K: int, B: int, scale: float) -> list[int]:
    """The tie rule's optimum in exact arithmetic (Fractions; integer r keeps a·F^(−r) rational): of all
    schedules with the largest hit probability, the lexicographically largest."""
    a, s = Fraction(alpha), Fraction(scale)
    P = [a**k * (1 - a) for k in range(K)] + [a**K]
    hit = [Fraction(0)] + [max(Fraction(0), 1 - s / Fraction(F) ** r) for F in range(1, B + 1)]
    best_next = [P[K] * h for h in hit]  # best over outcomes k+1..K with budget exactly c
    choice = [list(range(B + 1)) for _ in range(K + 1)]  # the last outcome takes what is left
    for k in range(K - 1, -1, -1):
        totals = [[P[k] * hit[f] + best_next[c - f] for f in range(c + 1)] for c in range(B + 1)]
        choice[k] = [max(range(c + 1), key=lambda f: (t[f], f)) for c, t in enumerate(totals)]
        best_next = [t[f] for t, f in zip(totals, choice[k], strict=True)]
    F, left = [], B
    for k in range(K + 1):
        F.append(choice[k][left])
        left -= F[-1]
    return F


@settings(deadline=None, max_examples=100)
@given(small_problems)
def test_integer_fanout_matches_the_dynamic_programme(s) -> None:
    """Same hit probability as the exact DP to 1e-12 relative; the same schedule wherever no other schedule
    comes within 1e-13 relative (+1e-14 for the DP's own rounding) of the best."""
    alpha, r, K, B, scale = s["alpha"], s["r"], s["K"], s["B"], s["scale"]
    F = integer_fanout(alpha, r, K, B, scale)
    reference = integer_fanout_dp(alpha, r, K, B, scale)
    assert F.dtype.kind == "i" and F.shape == (K + 1,) and F.sum() == B and (F >= 0).all()
    hit = expected_hit_probability(F, alpha, r, scale)
    reference_hit = expected_hit_probability(reference, alpha, r, scale)
    assert abs(hit - reference_hit) <= 1e-12 * reference_hit
    best, runner_up = best_two_hits(alpha, r, K, B, scale)
    if best - runner_up > 1e-13 * best + 1e-14:
        assert F.tolist() == reference.tolist()


@settings(deadline=None, max_examples=100)
@given(
    alpha=st.integers(0, 8).map(lambda j: j / 8),
    r=st.sampled_from([1, 2]),
    K=st.integers(0, 4),
    B=st.integers(0, 24),
    scale=st.integers(1, 8).map(lambda j: j / 4),
)
def test_integer_fanout_is_the_exact_optimum_under_the_tie_rule(alpha, r, K, B, scale) -> None:
    """With dyadic α and a and integer r every hit probability is a rational with a small denominator, so
    exact ties are frequent (α = 1/2 makes P(K−1) = P(K)) and the exact optimum is computable: ties included,
    the schedule must be the one that gives more to the earlier outcomes."""
    assert integer_fanout(alpha, r, K, B, scale).tolist() == exact_optimum(alpha, r, K, B, scale)


def exact_hit(F: list[int], alpha: float, r: int, scale: float) -> Fraction:
    """Σ_k P(k)·(1 − min(1, a·F_k^(−r))) in exact arithmetic (integer r)."""
    a, s = Fraction(alpha), Fraction(scale)
    P = [a**k * (1 - a) for k in range(len(F) - 1)] + [a ** (len(F) - 1)]
    return sum(
        (p * max(Fraction(0), 1 - s / Fraction(f) ** r) for p, f in zip(P, F, strict=True) if f > 0), Fraction(0)
    )


def test_exact_ties_go_to_the_earlier_outcome_even_where_float_sums_split_them() -> None:
    # P = [1/2, 1/4, 1/8, 1/16, ...], a = 1/2, r = 1: the steps 15 → 16 of k = 0 and 5 → 6 of k = 3 both add
    # exactly 1/960, so both schedules are optimal (the DP's float sums happen to pick the later one).
    F = integer_fanout(0.5, 1.0, 6, 50, 0.5).tolist()
    assert F == [16, 11, 8, 5, 4, 3, 3] == exact_optimum(0.5, 1, 6, 50, 0.5)
    assert exact_hit(F, 0.5, 1, 0.5) == exact_hit([15, 11, 8, 6, 4, 3, 3], 0.5, 1, 0.5)


@FAST
@given(r=st.floats(0.1, 3.0, exclude_min=True), K=st.integers(1, 7), B=st.integers(0, 200), scale=st.floats(0.3, 2.0))
def test_equally_likely_outcomes_favour_the_earlier(r, K, B, scale) -> None:
    F = integer_fanout(0.5, r, K, B, scale)  # P(K−1) = P(K) = 2^−K
    assert F[K - 1] >= F[K]


@pytest.mark.parametrize(
    ("alpha", "r", "K", "B", "scale", "expected"),
    [
        (0.8, 1.0, 7, 0, 1.0, [0] * 8),  # no budget
        (0.8, 1.0, 0, 9, 1.0, [9]),  # one outcome takes everything
        (0.0, 1.0, 3, 9, 1.0, [9, 0, 0, 0]),  # α = 0: only k = 0 can happen
        (1.0, 1.0, 3, 9, 1.0, [0, 0, 0, 9]),  # α = 1: only k = K can happen
        (1.0, 1.0, 3, 1, 1.0, [1, 0, 0, 0]),  # one guess buys nothing (a = 1): all ties, all to k = 0
        (0.8, 0.1, 7, 60, 2.0, [60] + [0] * 7),  # a^(1/r) = 1024 > B: nothing can hit
        (0.8, 0.1, 7, 60, 1e300, [60] + [0] * 7),  # a^(1/r) overflows
        (0.8, 1.0, 3, 4, 0.3, [1, 1, 1, 1]),  # a < 1: the first guess already hits, so every outcome gets one
    ],
)
def test_integer_fanout_edge_cases(alpha, r, K, B, scale, expected) -> None:
    assert integer_fanout(alpha, r, K, B, scale).tolist() == expected
    if B <= 60 and scale < 1e3:
        assert integer_fanout_dp(alpha, r, K, B, scale).tolist() == expected


@pytest.mark.parametrize(("alpha", "r", "K", "scale"), [(0.8, 1.0, 7, 1.0), (0.9, 2.5, 7, 0.5), (0.6, 0.5, 4, 1.0)])
def test_a_large_budget_lands_within_one_guess_of_the_real_optimum(alpha, r, K, scale) -> None:
    # B = 10^6 (far beyond the DP): the steps are then nearly the derivative, so Thm 12's real optimum is close.
    F = integer_fanout(alpha, r, K, 10**6, scale)
    assert F.sum() == 10**6 and np.all(np.abs(F - optimal_fanout(alpha, r, K, 10**6)) < 1)


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
