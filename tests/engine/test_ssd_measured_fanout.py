"""SSD's geometric schedule from the ranks this run measured (engine.ssd.policy, theory.fanout.separable_fanout):
Thm 12's power law until both kinds of outcome have ranks, then the exact integer optimum with the measured hit
curves; one guess goes to the outcome where it hits (all accepted, at a high α) instead of k = 0, where the power
law with scale 1 put it; budget "auto" may go down to one guess; greedy outputs stay the AR outputs."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import LLM, SamplingParams, SpeculativeConfig
from engine.config import DraftPlacement
from engine.ssd.policy import ACCEPTED, MIN_RANKS, REJECTED, DraftPolicy, least_budget
from theory.fanout import optimal_fanout, round_largest_remainder, separable_fanout

PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12, 13, 14, 15, 16]]


def policy(**spec) -> DraftPolicy:
    return DraftPolicy(SpeculativeConfig(schedule="geometric", **spec))


def observe(p: DraftPolicy, k: int, rank: int, times: int, K: int) -> None:
    for _ in range(times):
        p.observe_round("hit", k, 1, None, K, rank=rank)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 3), st.integers(1, 4), st.data())
def test_separable_fanout_is_the_brute_force_optimum(K, cap, data):
    B = data.draw(st.integers(0, (K + 1) * cap))
    gain = np.array(
        data.draw(
            st.lists(st.lists(st.floats(0, 1), min_size=cap + 1, max_size=cap + 1), min_size=K + 1, max_size=K + 1)
        )
    )
    F = separable_fanout(gain, B)
    assert F.sum() == B and (F <= cap).all() and (F >= 0).all()
    best = max(
        sum(gain[k, f] for k, f in enumerate(c)) for c in itertools.product(range(cap + 1), repeat=K + 1) if sum(c) == B
    )
    assert sum(gain[k, f] for k, f in enumerate(F)) == pytest.approx(best, abs=1e-12)


def test_separable_fanout_refuses_a_budget_no_schedule_spends():
    with pytest.raises(ValueError, match="spends B = 7"):
        separable_fanout(np.zeros((2, 4)), 7)


def test_thm12_until_ranks_are_measured():
    p = policy(K=3, budget=6)
    alpha = p.acceptance["hit"].alpha()
    thm12 = tuple(int(f) for f in round_largest_remainder(optimal_fanout(alpha, p.r, 3, 6), 6))
    assert p.schedule(True) == thm12
    observe(p, 2, 0, MIN_RANKS - 1, K=3)  # rejections, one short of a curve
    assert p.hit_curve(REJECTED, 6) is None and p.hit_curve(ACCEPTED, 6) is None
    alpha = p.acceptance["hit"].alpha()
    assert p.schedule(True) == tuple(int(f) for f in round_largest_remainder(optimal_fanout(alpha, p.r, 3, 6), 6))


def test_the_guesses_go_where_the_measured_ranks_say_they_hit():
    """α ≈ 1, and every bonus was the draft's first choice, after all accepted and after a rejection alike: the
    first guess goes to k = K and the second to k = 0, each a sure hit. Thm 12's power law (negative control:
    the same α without ranks) gives both to k = K, where the second guess adds nothing (its h(2) is 0.5, h(1) 0)."""
    measured, law = policy(K=2, budget=2), policy(K=2, budget=2)
    for p in (measured, law):
        for _ in range(60):
            p.acceptance["hit"].add(2, 2)
    observe(measured, 2, 0, MIN_RANKS, K=2)
    observe(measured, 0, 0, MIN_RANKS, K=2)
    for _ in range(2 * MIN_RANKS):  # the observations above counted as rounds too: α back near 1
        measured.acceptance["hit"].add(2, 2)
    assert np.allclose(measured.hit_curve(ACCEPTED, 3), [0, 1, 1, 1])
    assert measured.schedule(True) == (1, 0, 1)
    assert law.schedule(True) == (0, 0, 2)


def test_the_curves_weigh_each_outcome_by_its_probability():
    """At a low α rejections at k = 0 dominate: with rejections' bonuses mostly the draft's second choice
    (rank 0 with the rejected token excluded) and the accepted ones' far down, the guesses go to k = 0."""
    p = policy(K=2, budget=2)
    for _ in range(60):
        p.acceptance["hit"].add(0, 2)
    observe(p, 0, 0, 30, K=2)
    observe(p, 0, 1, 10, K=2)
    observe(p, 2, 40, MIN_RANKS, K=2)
    assert p.schedule(True) == (2, 0, 0)
    rejected = p.hit_curve(REJECTED, 3)
    assert rejected[0] == 0 and 0.7 < rejected[1] < 0.8 and rejected[2] == pytest.approx(1.0)


def test_old_ranks_fade():
    p = policy(K=1, budget=2)
    observe(p, 1, 3, 200, K=1)
    assert p.hit_curve(ACCEPTED, 1)[1] == 0.0
    observe(p, 1, 0, 400, K=1)
    assert p.hit_curve(ACCEPTED, 1)[1] > 0.8  # the last 400 outweigh the 200 before them


def test_a_schedule_is_not_kept_past_a_refit_of_r():
    """The schedules are cached between observations; a refit of r (in observe_times) must not leave a stale one."""
    p = policy(K=3, budget=12)
    before = p.schedule(True)
    for F, hits in ((2, 20), (4, 80), (8, 95)):  # misses 0.8, 0.2, 0.05 at F = 2, 4, 8: r = 2
        p.trials[F] = [hits, 100]
    p.observe_times(verify_ms=10.0, build_ms=5.0, backup=None, backup_ms=0.0)
    assert p.r == pytest.approx(2.0)
    alpha = p.acceptance["hit"].alpha()
    assert p.schedule(True) == tuple(int(f) for f in round_largest_remainder(optimal_fanout(alpha, p.r, 3, 12), 12))
    assert p.schedule(True) != before


def test_no_rank_without_a_cache_is_counted():
    p = policy(K=1, budget=2)
    observe(p, 1, -1, 50, K=1)
    p.observe_round("hit", 1, 1, None, 1)
    assert p.ranks_seen[ACCEPTED] == 0 and p.hit_curve(ACCEPTED, 2) is None


def test_budget_auto_may_go_down_to_one_guess_with_the_geometric_schedule():
    assert least_budget(SpeculativeConfig(K=3, schedule="geometric", budget="auto"), 3) == 1
    assert least_budget(SpeculativeConfig(K=3, budget="auto"), 3) == 4  # uniform: one per outcome
    p = policy(K=3, budget="auto")
    for _ in range(30):  # a build far longer than the verify drives the budget to its floor
        p.observe_times(verify_ms=10.0, build_ms=1000.0, backup=None, backup_ms=0.0)
    assert p.budget_for(3, 3) == 1.0 and sum(p.schedule(True)) == 1


def test_greedy_ssd_with_one_measured_guess_hits_after_all_accepted_and_equals_ar(target):
    """The target as its own draft (every token accepted), one guess per round: once the ranks are measured the
    guess is the draft's first choice after all accepted, and every round hits. The uniform schedule's one guess
    (k = 0) is the negative control: it never hits. Both emit greedy AR's tokens."""
    greedy = SamplingParams(temperature=0, max_new_tokens=80, stop_on_eos=False)
    ar = [o.token_ids for o in LLM(target).generate(PROMPTS, greedy)]
    runs = {}
    for schedule in ("geometric", "uniform"):
        spec = SpeculativeConfig(K=3, budget=1, schedule=schedule, placement=DraftPlacement(in_process=True))
        out = LLM(target, target, strategy="ssd", speculative=spec).generate(PROMPTS, greedy)
        assert [o.token_ids for o in out] == ar
        runs[schedule] = [r for r in out.metrics.rounds if r.phase == "decode"]
    late = runs["geometric"][len(runs["geometric"]) // 2 :]
    assert late and all(all(r.hit) for r in late)
    assert all(r.fanout == [0, 0, 0, 1] for r in late)
    assert not any(any(r.hit) for r in runs["uniform"][1:])
