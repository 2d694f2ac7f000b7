"""Round-record statistics: acceptance, hit rate by position, miss rate by fan-out, phase times."""

from __future__ import annotations

import pytest

from saguaro.reporting.analysis import rounds as R


def ssd_round(n: int, accepted, hit, fanout=(3, 2, 1), **times):
    return {
        "strategy": "ssd",
        "round": n,
        "batch_size": len(accepted),
        "K": 2,
        "context_len": 10 + n,
        "accepted": list(accepted),
        "emitted": [k + 1 for k in accepted],
        "draft_ms": times.get("draft", 0.0),
        "verify_ms": times.get("verify", 10.0),
        "round_ms": times.get("round", 12.0),
        "draft_forwards": 2,
        "phase": "decode",
        "hit": list(hit),
        "cache_build_ms": 8.0,
        "branches": 6,
        "backup": "neural",
        "wait_ms": times.get("wait", 1.0),
        "fanout": list(fanout),
    }


def test_alpha_is_accepted_draws_over_draws_that_ended_a_round():
    # 3 rounds: k = 2 (all accepted, K = 2), k = 1 (1 accepted, 1 rejected), k = 0 (1 rejected)
    assert R.alpha_mle({2: 1, 1: 1, 0: 1}, 2) == pytest.approx(3 / 5)
    assert R.alpha_mle({}, 2) is None and R.alpha_mle({1: 3}, None) is None


def test_alpha_from_rounds_truncates_each_round_at_its_own_K():
    short = {**ssd_round(1, [2, 0], [True, False]), "K": 2}  # k = 2 of K = 2: no rejection
    long = {**ssd_round(2, [2, 5], [True, True]), "K": 5}  # k = 2 of K = 5: rejected
    # accepted 2 + 0 + 2 + 5 = 9; rejections: k=0 of 2, k=2 of 5 -> 2
    assert R.alpha_rounds([[short, long]]) == pytest.approx(9 / 11)
    assert R.alpha_mle({2: 2, 0: 1, 5: 1}, 5) == pytest.approx(9 / 12)  # one K for all rounds: biased here
    assert R.alpha_rounds([[short, long]], hit=False) == pytest.approx(0.0)  # the miss row: k = 0, rejected
    assert R.alpha_rounds([]) is None


def test_a_lookup_pairs_an_outcome_with_the_next_rounds_hit():
    call = [
        ssd_round(1, [0, 2], [False, False]),
        ssd_round(2, [1, 1], [True, False], fanout=(5, 4, 2)),
        ssd_round(3, [1], [True]),
    ]
    lookups = R.lookups([call])
    # round 1's outcomes k = 0 and k = 2 are answered by round 2's hits, from the cache round 2 describes
    # (F_0 = 5, F_2 = 2);
    # round 3 has one sequence fewer, so its rows cannot be matched and are skipped
    assert lookups == [R.Lookup(0, 5, True), R.Lookup(2, 2, False)]
    # the hit rate is over these lookups: the first round (no cache yet) is not a miss (its flags would give 2/5)
    assert R.hit_rate([call]) == pytest.approx(1 / 2)


def test_the_engines_own_outcome_pairing_is_used_when_recorded():
    first = {**ssd_round(1, [0, 2], [False, False]), "outcome_hit": [True, None]}  # row 2 finished
    call = [first, ssd_round(2, [1], [True], fanout=(5, 4, 2))]
    assert R.lookups([call]) == [R.Lookup(0, 5, True)]
    assert R.hit_rate([call]) == pytest.approx(1.0)
    assert R.hit_rate([[ssd_round(1, [0], [False])]]) is None  # one round: nothing looked up yet


def test_accepted_counts_split_by_where_the_speculation_came_from():
    call = [ssd_round(1, [0, 2], [True, False]), ssd_round(2, [1, 1], [True, True])]
    assert R.accepted_hist([call], hit=True) == {0: 1, 1: 2}
    assert R.accepted_hist([call], hit=False) == {2: 1}


def test_phases_add_up_to_the_round_times():
    prefill = {**ssd_round(0, [0], [False]), "phase": "prefill", "round_ms": 50.0}
    calls = [
        [
            prefill,
            ssd_round(1, [1], [True], verify=10.0, wait=1.0, round=12.0),
            ssd_round(2, [2], [False], verify=10.0, wait=6.0, round=17.0),
        ]
    ]
    ms = R.phase_ms(calls)
    assert (ms["prefill"], ms["verify"], ms["draft"], ms["other"]) == (50.0, 20.0, 7.0, 2.0)
    assert ms["tokens"] == 1 + 2 + 3 and ms["hidden_cache_build"] == 16.0
    assert R.decode_tokens_per_s(calls) == pytest.approx(5 / 29 * 1e3)
