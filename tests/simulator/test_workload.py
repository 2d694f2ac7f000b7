"""Workloads are seeded: the same seed gives the same run, another seed another one, and the workload
does not change when only the policy does (independent random streams)."""

import numpy as np
import pytest

from simulator import (
    ClosedLoop,
    ConstantHit,
    ConstantTiming,
    IidAcceptance,
    Lengths,
    OpenLoop,
    Policy,
    SimConfig,
    simulate,
    uniform_fanout,
)
from simulator.workload import RequestSource

TIMING = ConstantTiming(t_verify_ms=10.0, t_draft_ms=1.0, t_prefill_ms=20.0)


def _config(workload, seed=0, strategy="ssd", **kw):
    policy = Policy(strategy, K=3, fanout=uniform_fanout(3, 2) if strategy == "ssd" else None)
    return SimConfig(policy, TIMING, IidAcceptance(0.7), ConstantHit(0.8), workload, seed=seed, **kw)


def test_same_seed_same_run_other_seed_other_run():
    workload = OpenLoop(rate_per_s=20.0, max_batch=4, prompt_len=Lengths(50, 150), output_len=Lengths(20, 80))
    first, again = (
        simulate(_config(workload, requests=50, rounds=10**9)),
        simulate(_config(workload, requests=50, rounds=10**9)),
    )
    other = simulate(_config(workload, seed=1, requests=50, rounds=10**9))
    assert first.to_dict() == again.to_dict()
    assert first.to_dict() != other.to_dict()


def test_open_loop_arrivals_are_poisson_at_the_rate():
    source = RequestSource(OpenLoop(rate_per_s=50.0), np.random.default_rng(3))
    gaps = np.array([source.gap_ms() for _ in range(20_000)])
    # mean gap 20 ms; its standard error is 20/sqrt(20000) = 0.14 ms, so ±0.7 ms is 5 standard errors
    assert gaps.mean() == pytest.approx(20.0, abs=0.7)
    assert np.std(gaps) == pytest.approx(20.0, rel=0.05)  # exponential: sd = mean


def test_lengths_are_drawn_in_range_and_parse_from_text():
    rng = np.random.default_rng(0)
    draws = Lengths(10, 20).sample(rng, 5000)
    assert draws.min() == 10 and draws.max() == 20
    assert Lengths.parse("64") == Lengths(64) and Lengths.parse("8:16") == Lengths(8, 16)
    with pytest.raises(ValueError, match="LOW:HIGH"):
        Lengths.parse("8-16")
    with pytest.raises(ValueError, match="empty"):
        Lengths(20, 10)


def test_workload_is_the_same_for_different_policies():
    # batch 1 finishes requests in order, so 40 completions emit exactly the first 40 requests' tokens
    workload = ClosedLoop(1, prompt_len=Lengths(10, 90), output_len=Lengths(5, 30))
    tokens = [simulate(_config(workload, strategy=s, requests=40, rounds=10**9)).tokens for s in ("ar", "sd", "ssd")]
    assert tokens[0] == tokens[1] == tokens[2]
    assert simulate(_config(workload, seed=5, strategy="ar", requests=40, rounds=10**9)).tokens != tokens[0]


def test_closed_loop_keeps_concurrency_and_open_loop_caps_the_batch():
    closed = simulate(_config(ClosedLoop(3, output_len=None), rounds=500))
    assert closed.mean_batch == pytest.approx(3.0)
    busy = simulate(_config(OpenLoop(rate_per_s=500.0, max_batch=2, output_len=Lengths(50)), rounds=2000))
    assert busy.mean_batch <= 2.0
    assert busy.ttft_ms["p99"] > busy.ttft_ms["p50"] > 20.0  # queueing on top of the 20 ms prefill


@pytest.mark.parametrize(
    "bad, message",
    [
        (lambda: ClosedLoop(0), "concurrency"),
        (lambda: OpenLoop(rate_per_s=0.0), "rate_per_s"),
        (lambda: OpenLoop(rate_per_s=1.0, max_batch=0), "max_batch"),
        (lambda: Lengths(0), ">= 1 token"),
    ],
)
def test_bad_workloads_are_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        bad()


def _replay(arrivals, prompts, outputs, max_batch=4):
    from simulator import Replayed

    config = SimConfig(
        Policy("ar", K=0),
        TIMING,
        IidAcceptance(0.7),
        None,
        Replayed(tuple(arrivals), tuple(prompts), tuple(outputs), max_batch),
        rounds=10**9,
    )
    return simulate(config)


def test_a_replayed_log_runs_its_requests_at_their_times_exactly():
    # AR, prefill 20 ms, a decode round 10 ms. A arrives at 0 (3 tokens): first token at 20, then 30, 40.
    # B arrives at 100 (2 tokens), when nothing runs: prefill 100-120, its second token at 130.
    apart = _replay([0.0, 100.0], [5, 5], [3, 2])
    assert apart.completed_requests == 2 and apart.tokens == 5
    assert apart.ttft_ms["p50"] == pytest.approx(20.0) and apart.ttft_ms["p99"] == pytest.approx(20.0)
    assert apart.e2el_ms["mean"] == pytest.approx((40.0 + 30.0) / 2)
    assert apart.sim_ms == pytest.approx(130.0)
    # B arrives at 25, during A's round 20-30: it joins at the next round's start, whose prefill (30-50)
    # stalls A; the round 50-60 then ends both. B's TTFT 25, A's e2e 60 and TPOT (60 - 20) / 2 = 20.
    joined = _replay([0.0, 25.0], [5, 5], [3, 2])
    assert joined.sim_ms == pytest.approx(60.0)
    assert joined.ttft_ms["mean"] == pytest.approx((20.0 + 25.0) / 2)
    assert joined.tpot_ms["mean"] == pytest.approx((20.0 + 10.0) / 2)  # A 20 ms; B (60 - 50) / 1


def test_a_replayed_log_is_checked():
    from simulator import Replayed

    with pytest.raises(ValueError, match="in order"):
        Replayed((10.0, 5.0), (1, 1), (1, 1))
    with pytest.raises(ValueError, match="one arrival time"):
        Replayed((0.0,), (1, 1), (1,))
