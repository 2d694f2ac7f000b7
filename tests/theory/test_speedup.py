"""E(α, K), α from two distributions, SD and SSD speedups (Thm 7), the Cor. 8 / 9 / 16 bounds, and the two
miss policies at batch > 1."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from theory import (
    MissPolicy,
    acceptance_rate,
    ar_tokens_per_second,
    expected_tokens,
    sd_speedup,
    sd_tokens_per_second,
    ssd_over_sd_ceiling,
    ssd_over_sd_neural,
    ssd_speedup,
)

FAST = settings(deadline=None, max_examples=60)
POLICIES = list(MissPolicy)
alphas = st.floats(0.0, 1.0)
Ks = st.integers(0, 64)
# The closed forms are exact up to a few ulp; monotonicity and identities are checked to this relative slack.
REL = 1e-12


@FAST
@given(K=Ks)
def test_expected_tokens_limits(K: int) -> None:
    assert expected_tokens(0.0, K) == 1.0
    assert expected_tokens(1.0, K) == K + 1
    assert expected_tokens(1.0 - 1e-13, K) == pytest.approx(K + 1, rel=1e-9)


@FAST
@given(alpha=alphas)
def test_zero_lookahead_emits_only_the_bonus(alpha: float) -> None:
    assert expected_tokens(alpha, 0) == pytest.approx(1.0, rel=REL)


@FAST
@given(alpha=alphas, K=Ks)
def test_expected_tokens_is_the_geometric_sum(alpha: float, K: int) -> None:
    assert expected_tokens(alpha, K) == pytest.approx(sum(alpha**i for i in range(K + 1)), rel=1e-10)


@FAST
@given(a=alphas, b=alphas, K=Ks)
def test_expected_tokens_increases_with_alpha(a: float, b: float, K: int) -> None:
    lo, hi = sorted((a, b))
    assert expected_tokens(lo, K) <= expected_tokens(hi, K) * (1 + REL)


@FAST
@given(alpha=alphas, K=st.integers(0, 63))
def test_expected_tokens_increases_with_K(alpha: float, K: int) -> None:
    assert expected_tokens(alpha, K) <= expected_tokens(alpha, K + 1) * (1 + REL)


def test_expected_tokens_broadcasts() -> None:
    E = expected_tokens(np.array([[0.0], [0.5], [1.0]]), np.array([0, 1, 4, 7]))  # [3, 1] x [4]
    assert E.shape == (3, 4)
    assert np.allclose(E[2], [1, 2, 5, 8]) and np.allclose(E[0], 1.0)
    assert isinstance(expected_tokens(0.5, 3), float)


def test_expected_tokens_matches_monte_carlo_rejection_sampling() -> None:
    """Simulate real SD rounds: x ~ q, accept with min(1, p(x)/q(x)), stop at the first rejection.

    200k rounds; the tolerance is 5 standard errors of the mean, so a correct E fails with probability
    about 6e-7 (two-sided normal tail); the run is seeded, so it is deterministic anyway. Negative control:
    the same sample rejects E at α − 0.02.
    """
    rng = np.random.default_rng(20260303)
    p, q = rng.dirichlet(np.ones(6)), rng.dirichlet(np.ones(6))
    alpha, K, rounds = float(acceptance_rate(p, q)), 4, 200_000
    x = rng.choice(6, size=(rounds, K), p=q)  # [rounds, K] draft tokens
    accepted = rng.random((rounds, K)) < np.minimum(1.0, p[x] / q[x])  # [rounds, K]
    tokens = np.cumprod(accepted, axis=1).sum(axis=1) + 1  # accepted prefix + bonus, [rounds]
    se = tokens.std(ddof=1) / np.sqrt(rounds)
    assert abs(tokens.mean() - expected_tokens(alpha, K)) < 5 * se
    assert abs(tokens.mean() - expected_tokens(alpha - 0.02, K)) > 5 * se  # the test can fail


def test_acceptance_rate_is_one_minus_total_variation() -> None:
    p, q = np.array([0.5, 0.3, 0.2, 0.0]), np.array([0.1, 0.3, 0.3, 0.3])
    assert acceptance_rate(p, q) == pytest.approx(1 - 0.5 * np.abs(p - q).sum())
    assert acceptance_rate(p, p) == pytest.approx(1.0)
    assert acceptance_rate([1.0, 0.0], [0.0, 1.0]) == 0.0
    assert acceptance_rate(np.stack([p, q]), q).shape == (2,)


def test_sd_and_ar_throughput_from_timings() -> None:
    # K = 4 draft tokens of 5 ms, a 20 ms verify, a 20 ms AR step.
    E = expected_tokens(0.8, 4)
    assert sd_tokens_per_second(0.8, 4, 0.005, 0.020) == pytest.approx(E / 0.040)
    assert ar_tokens_per_second(0.020) == pytest.approx(50.0)
    assert sd_speedup(0.8, 4, 0.005, 0.020) == pytest.approx(E / 2.0)
    # In verify units the speedup is E_SD / (1 + T_SD), T_SD = K·T_d.
    assert sd_speedup(0.8, 4, 0.3 / 4) == pytest.approx(E / 1.3)


def test_ssd_speedup_thm7_and_its_extremes() -> None:
    assert ssd_speedup(0.9, 3.0, 2.0, 1.0, 0.3) == pytest.approx((0.9 * 3 + 0.1 * 2) / (0.9 + 0.1 * 1.3))
    assert ssd_speedup(1.0, 3.0, 2.0, 0.5, 0.3) == pytest.approx(3.0)  # always hit, cache built in time
    assert ssd_speedup(1.0, 3.0, 2.0, 1.5, 0.3) == pytest.approx(2.0)  # cache build stretches the round
    assert ssd_speedup(0.0, 3.0, 2.0, 1.0, 0.3) == pytest.approx(2.0 / 1.3)  # always miss


def test_ssd_batch_form_cor16() -> None:
    b = np.array([1, 2, 8])
    got = ssd_speedup(0.9, 3.0, 2.0, 1.0, 0.3, b=b)  # per-row, the default; T_p ≤ 1: the paper's denominator
    want = (0.9 * 3 + 0.1 * 2) / (0.9**b + (1 - 0.9**b) * 1.3)
    assert got.shape == (3,) and np.allclose(got, want)


def test_per_row_pays_the_whole_build_every_round_and_keeps_each_rows_tokens() -> None:
    b = np.array([1, 2, 8])
    got = ssd_speedup(0.9, 3.0, 2.0, 1.5, 0.3, b=b, miss_policy=MissPolicy.PER_ROW)
    assert np.allclose(got, (0.9 * 3 + 0.1 * 2) / (1.5 + (1 - 0.9**b) * 0.3))


def test_whole_batch_hands_every_row_the_backup_when_one_misses() -> None:
    b = np.array([1, 2, 8])
    s = 0.9**b
    got = ssd_speedup(0.9, 3.0, 2.0, 1.5, 0.3, b=b, miss_policy="whole-batch")
    assert np.allclose(got, (s * 3 + (1 - s) * 2) / (s * 1.5 + (1 - s) * 1.3))


@FAST
@given(p_hit=st.floats(0, 1), E_hit=st.floats(1, 9), E_miss=st.floats(1, 9), T_p=st.floats(0, 1), T_b=st.floats(0, 3))
def test_both_policies_are_the_papers_form_at_batch_one_when_the_build_fits(p_hit, E_hit, E_miss, T_p, T_b) -> None:
    paper = (p_hit * E_hit + (1 - p_hit) * E_miss) / (p_hit * 1.0 + (1 - p_hit) * (1 + T_b))
    for policy in POLICIES:
        assert ssd_speedup(p_hit, E_hit, E_miss, T_p, T_b, 1, miss_policy=policy) == pytest.approx(paper, rel=REL)


@FAST
@given(
    p_hit=st.floats(0, 1),
    E_hit=st.floats(1, 9),
    miss_fraction=st.floats(0, 1),
    T_p=st.floats(0, 4),
    T_b=st.floats(0, 3),
    b=st.integers(1, 63),
)
def test_per_sequence_speed_never_rises_with_batch(p_hit, E_hit, miss_fraction, T_p, T_b, b) -> None:
    """A bigger batch only adds misses. Per-row: any T_p. Whole-batch: as long as a hit round is at least as
    fast as a miss round, E_hit / max(1, T_p) ≥ E_miss / (1 + T_b) (else abandoning the build pays)."""
    E_miss = 1 + miss_fraction * (E_hit - 1)  # E_miss ≤ E_hit
    bs = np.array([b, b + 1])
    per_row = ssd_speedup(p_hit, E_hit, E_miss, T_p, T_b, bs, miss_policy=MissPolicy.PER_ROW)
    assert per_row[1] <= per_row[0] * (1 + REL)
    if E_hit * (1 + T_b) >= E_miss * max(1.0, T_p):
        whole = ssd_speedup(p_hit, E_hit, E_miss, T_p, T_b, bs, miss_policy=MissPolicy.WHOLE_BATCH)
        assert whole[1] <= whole[0] * (1 + REL)


def test_negative_control_the_papers_batch_form_rises_with_batch_when_the_build_outlasts_the_verify() -> None:
    # Random backup (E_miss 1, T_b 0), T_p = 3, p_hit 0.7. The paper's form credits the hit rows' tokens and
    # charges the abandoned build: 2.4x faster per sequence at b = 16 than at b = 1.
    E_hit, b = expected_tokens(0.8, 4), np.array([1, 16])
    s = 0.7**b
    paper = (0.7 * E_hit + 0.3 * 1.0) / (s * 3 + (1 - s) * 1.0)
    assert paper[1] > 2 * paper[0]
    for policy in POLICIES:
        ours = ssd_speedup(0.7, E_hit, 1.0, 3.0, 0.0, b, miss_policy=policy)
        assert ours[1] <= ours[0]
    assert ssd_speedup(0.7, E_hit, 1.0, 3.0, 0.0, 1, miss_policy=MissPolicy.WHOLE_BATCH) == pytest.approx(paper[0])


def test_whole_batch_can_gain_with_batch_when_a_miss_round_is_faster_than_a_hit_round() -> None:
    # A real effect, not an artefact: the build takes 3 verifies, a neural backup 0.3 with as many tokens, so a
    # round that drops the build is faster, and a bigger batch drops it more often.
    got = ssd_speedup(0.9, 3.0, 3.0, 3.0, 0.3, np.array([1, 16]), miss_policy=MissPolicy.WHOLE_BATCH)
    assert got[1] > got[0]


@FAST
@given(
    p_hit=st.floats(0, 1),
    E_sd=st.floats(1, 9),
    extra=st.floats(0, 3),
    T_sd=st.floats(0, 3),
    T_p=st.floats(0, 1),
    b=st.integers(1, 64),
)
def test_cor8_ssd_never_slower_than_sd_with_neural_backup(p_hit, E_sd, extra, T_sd, T_p, b) -> None:
    for policy in POLICIES:
        ratio = ssd_over_sd_neural(p_hit, E_sd + extra, E_sd, T_sd, T_p, b, miss_policy=policy)
        assert ratio >= 1 - REL
        if p_hit**b * T_sd >= 1e-9:  # strictly faster once p_hit > 0 (visibly so above float resolution)
            assert ratio > 1


@FAST
@given(
    p_hit=st.floats(0, 1),
    E_hit=st.floats(1, 9),
    miss_fraction=st.floats(0.1, 1),
    E_sd=st.floats(1, 9),
    T_sd=st.floats(0, 3),
    T_p=st.floats(0, 3),
    T_b=st.floats(0, 3),
    b=st.integers(1, 64),
)
def test_cor9_ceiling_bounds_every_backup(p_hit, E_hit, miss_fraction, E_sd, T_sd, T_p, T_b, b) -> None:
    sd = E_sd / (1 + T_sd)
    for policy in POLICIES:
        ssd = ssd_speedup(p_hit, E_hit, E_hit * miss_fraction, T_p, T_b, b, miss_policy=policy)
        assert ssd / sd <= ssd_over_sd_ceiling(E_hit, E_sd, T_sd) * (1 + REL)


def test_cor8_fails_when_the_hit_rounds_accept_less() -> None:
    # Negative control: the guarantee needs E_hit >= E_SD (e.g. Saguaro's lower acceptance can break it).
    assert ssd_over_sd_neural(0.5, 1.5, 3.0, 0.3) < 1


@pytest.mark.parametrize(
    ("call", "fragment"),
    [
        (lambda: expected_tokens(1.5, 4), "alpha is a probability"),
        (lambda: expected_tokens(0.5, -1), "K must be an integer >= 0"),
        (lambda: expected_tokens(0.5, 2.5), "K must be a whole number"),
        (lambda: expected_tokens(float("nan"), 2), "alpha must be finite"),
        (lambda: sd_tokens_per_second(0.5, 4, 0.01, 0.0), "T_v must be > 0"),
        (lambda: ssd_speedup(0.9, 3, 2, 1, 0.3, b=0), "b (batch size) must be an integer >= 1"),
        (lambda: ssd_speedup(0.9, 3, 2, 1, 0.3, miss_policy="abandon"), "miss_policy must be one of 'per-row'"),
        (lambda: acceptance_rate([0.5, 0.6], [0.5, 0.5]), "p must sum to 1"),
        (lambda: acceptance_rate([0.5, 0.5], [1.0]), "share the vocabulary"),
    ],
)
def test_bad_input_raises_value_error_that_says_what_to_do(call, fragment: str) -> None:
    with pytest.raises(ValueError, match=re.escape(fragment)):
        call()
