"""Saguaro sampling σ_{F,C} (Def. 14), its exact acceptance and hit probability, and Thm 15."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from theory import acceptance_rate, all_accepted_hit_probability, saguaro_position, saguaro_q

FAST = settings(deadline=None, max_examples=80)
TOL = 1e-12  # float rounding allowance on sums over a small vocabulary


@st.composite
def distribution_pairs(draw, max_vocab: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """p and q over the same vocabulary; exact zeros and ties are likely (they are the edge cases)."""
    V = draw(st.integers(2, max_vocab))
    weights = st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0]) | st.floats(0.0, 1.0), min_size=V, max_size=V)
    p, q = np.array(draw(weights)), np.array(draw(weights))
    assume(p.sum() > 0 and q.sum() > 0)
    return p / p.sum(), q / q.sum()


def guesses(q: np.ndarray, x: int, F: int) -> list[int]:
    """G(x), spelled out: the F best-ranked tokens of q (ties to the lower id) other than x."""
    order = sorted(range(len(q)), key=lambda t: (-q[t], t))
    return [t for t in order if t != x][:F]


def hit_and_reject_by_definition(p: np.ndarray, q: np.ndarray, F: int, C: float) -> float:
    """Σ_x σ(x)·(1 − min(1, p(x)/σ(x)))·r(G(x)), one x at a time, for checking the closed form."""
    sigma = saguaro_q(q, F + 1, C)
    residual = np.maximum(0.0, p - sigma)
    if residual.sum() == 0:
        return 0.0
    residual /= residual.sum()
    total = 0.0
    for x in range(len(q)):
        if sigma[x] > p[x]:  # otherwise x is always accepted (and p/σ could overflow for a subnormal σ)
            total += sigma[x] * (1 - p[x] / sigma[x]) * residual[guesses(q, x, F)].sum()
    return total


@FAST
@given(pq=distribution_pairs(), n_top=st.integers(0, 9), C=st.floats(0.01, 1.0))
def test_saguaro_q_is_a_distribution_that_scales_the_top_set_by_C(pq, n_top, C) -> None:
    _, q = pq
    sigma = saguaro_q(q, n_top, C)
    assert (sigma >= 0).all() and sigma.sum() == pytest.approx(1.0, abs=TOL)
    top = np.isin(np.arange(len(q)), [t for t in sorted(range(len(q)), key=lambda t: (-q[t], t))[:n_top]])
    Z = (C * q[top]).sum() + q[~top].sum()  # every ratio between a top token and another shrinks by exactly C
    assert np.allclose(sigma, np.where(top, C * q, q) / Z, atol=TOL)
    assert (sigma[q == 0] == 0).all()


def test_saguaro_q_edge_cases() -> None:
    q = np.array([0.25, 0.25, 0.25, 0.25])
    assert np.allclose(saguaro_q(q, 1, 0.5), np.array([0.5, 1, 1, 1]) / 3.5)  # tie: lower id is "top"
    assert np.allclose(saguaro_q(q, 4, 0.5), q)  # whole vocabulary scaled: C cancels
    assert np.allclose(saguaro_q(q, 2, 1.0), q)  # C = 1 is plain sampling
    # σ does not keep q's ranking across the boundary of the top set for C < 1.
    assert np.argmax(saguaro_q([0.3, 0.3, 0.2, 0.2], 2, 0.5)) == 2
    assert saguaro_q(np.tile(q, (3, 1)), 2, np.array([0.2, 0.5, 1.0])).shape == (3, 4)


@FAST
@given(pq=distribution_pairs(), F=st.integers(0, 8), C=st.floats(0.01, 1.0))
def test_exact_hit_probability_matches_the_definition(pq, F, C) -> None:
    p, q = pq
    pos = saguaro_position(p, q, F, C)
    assert pos.hit_and_reject == pytest.approx(hit_and_reject_by_definition(p, q, F, C), abs=1e-9)
    assert pos.acceptance == pytest.approx(acceptance_rate(p, pos.sigma), abs=TOL)
    assert pos.acceptance + pos.reject == pytest.approx(1.0, abs=1e-9)
    if not np.isnan(pos.hit_given_reject):
        # The guesses always lie inside the scaled set T_{F+1}: a ceiling on the hit probability.
        assert 0 <= pos.hit_given_reject <= pos.bonus_in_saguaro_set + 1e-9


@FAST
@given(pq=distribution_pairs(), F=st.integers(0, 8), C1=st.floats(0.01, 1.0), C2=st.floats(0.01, 1.0))
def test_thm15_smaller_C_puts_more_bonus_mass_on_the_saguaro_set(pq, F, C1, C2) -> None:
    p, q = pq
    small, large = sorted((C1, C2))
    at_small = saguaro_position(p, q, F, small).bonus_in_saguaro_set
    at_large = saguaro_position(p, q, F, large).bonus_in_saguaro_set
    assume(not np.isnan(at_small) and not np.isnan(at_large))
    assert at_small >= at_large - 1e-9


def test_thm15_does_not_extend_to_the_projects_guess_sets() -> None:
    """With G(x) = top F of q minus x, a smaller C can lower the hit probability: the draft then picks
    token 0 (outside T_F) more often, and after rejecting it the cache guesses T_F = {1}, missing the
    residual's token 2. Checked by hand: at C = 0.5, σ = [2, 5, 4]/11, P(hit | reject) = 0.39/0.48.
    """
    p, q = np.array([0.1, 0.1, 0.8]), np.array([0.1, 0.5, 0.4])
    assert saguaro_position(p, q, 1, 1.0).hit_given_reject == pytest.approx(1.0)
    assert saguaro_position(p, q, 1, 0.5).hit_given_reject == pytest.approx(0.8125)
    assert saguaro_position(p, q, 1, 0.5).bonus_in_saguaro_set == pytest.approx(1.0)


def test_exact_hit_probability_matches_monte_carlo_of_the_sampling_process() -> None:
    """Run the real process 200k times: x ~ σ, accept with min(1, p(x)/σ(x)), else t* ~ residual, hit iff
    t* ∈ G(x) (spelled out by `guesses`). Each estimate must be within 5 standard errors of the exact value:
    a correct formula fails one of the two checks with probability about 1e-6. Negative control: the naive
    model that always guesses T_F (no exclusion of x) is more than 5 standard errors off.
    """
    rng = np.random.default_rng(1)
    z = rng.normal(0, 1.5, 8)
    p = np.exp(z) / np.exp(z).sum()
    zq = z + rng.normal(0, 0.7, 8)
    q = np.exp(zq) / np.exp(zq).sum()
    F, C, rounds = 2, 0.5, 200_000
    pos = saguaro_position(p, q, F, C)
    sigma = pos.sigma
    residual = np.maximum(0.0, p - sigma) / np.maximum(0.0, p - sigma).sum()
    guessed = np.zeros((8, 8), dtype=bool)  # [x, t]: is t a guess after rejecting x
    for x in range(8):
        guessed[x, guesses(q, x, F)] = True

    x = rng.choice(8, size=rounds, p=sigma)
    rejected = rng.random(rounds) >= np.minimum(1.0, p[x] / sigma[x])
    bonus = rng.choice(8, size=rounds, p=residual)  # only read where rejected
    hit = rejected & guessed[x, bonus]

    for observed, exact in [(rejected, pos.reject), (hit, pos.hit_and_reject)]:
        se = np.sqrt(exact * (1 - exact) / rounds)
        assert abs(observed.mean() - exact) < 5 * se
    top_F = np.isin(np.arange(8), [t for t in sorted(range(8), key=lambda t: (-q[t], t))[:F]])
    naive = pos.reject * residual[top_F].sum()
    assert abs(hit.mean() - naive) > 5 * np.sqrt(naive * (1 - naive) / rounds)


def test_hit_probability_extremes() -> None:
    p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
    assert saguaro_position(p, q, 0, 0.5).hit_and_reject == 0.0  # no guesses
    assert saguaro_position(p, q, 2, 0.5).hit_given_reject == pytest.approx(1.0)  # guesses = all but x
    same = saguaro_position(p, p, 1, 1.0)
    assert same.reject == 0.0 and np.isnan(same.hit_given_reject)


def test_saguaro_position_broadcasts() -> None:
    rng = np.random.default_rng(0)
    p, q = rng.dirichlet(np.ones(5), size=4), rng.dirichlet(np.ones(5))  # [4, 5] and [5]
    pos = saguaro_position(p, q, 2, np.array([[0.3], [1.0]]))  # C: [2, 1] -> result [2, 4]
    assert pos.sigma.shape == (2, 4, 5) and pos.hit_given_reject.shape == (2, 4)
    assert np.allclose(pos.hit_and_reject[1, 3], saguaro_position(p[3], q, 2, 1.0).hit_and_reject)


def test_all_accepted_hit_probability() -> None:
    p, q = np.array([0.1, 0.6, 0.3]), np.array([0.5, 0.2, 0.3])
    assert all_accepted_hit_probability(p, q, 1) == pytest.approx(0.1)
    assert all_accepted_hit_probability(p, q, 2) == pytest.approx(0.4)
    assert all_accepted_hit_probability(p, q, 3) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("call", "fragment"),
    [
        (lambda: saguaro_q([0.5, 0.5], 1, 0.0), "C is the Saguaro down-weighting constant and must lie in (0, 1]"),
        (lambda: saguaro_q([0.5, 0.5], 1, 1.5), "C is the Saguaro down-weighting constant"),
        (lambda: saguaro_q([0.5, 0.6], 1, 0.5), "q must sum to 1"),
        (lambda: saguaro_q([0.5, 0.5], -1, 0.5), "n_top (F + 1 in this project) must be an integer >= 0"),
        (lambda: saguaro_position([0.5, 0.5], [1.0], 1, 0.5), "share the vocabulary"),
        (lambda: saguaro_position([1.5, -0.5], [0.5, 0.5], 1, 0.5), "p must be non-negative"),
    ],
)
def test_bad_saguaro_input_raises_value_error(call, fragment: str) -> None:
    with pytest.raises(ValueError, match=re.escape(fragment)):
        call()
