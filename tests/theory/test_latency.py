"""TTFT, ITL (per chunk), TPOT and E2EL of one request, and their summary in ms, on hand-made timelines."""

from __future__ import annotations

import math

import pytest

from theory.latency import METRICS, RequestLatency, request_latency, statistics, summarize, time_per_output_token


def test_a_speculative_round_is_one_chunk_one_gap():
    # arrival 1.0 s; chunks: 1 token at 1.5, 3 tokens at 2.0 (one round), 1 token at 2.25
    r = request_latency(1.0, [1.5, 2.0, 2.25], [1, 3, 1])
    assert r.ttft_s == 0.5
    assert r.itl_s == (0.5, 0.25)  # two gaps, never one per token
    assert r.e2el_s == 1.25
    assert r.output_tokens == 5
    assert r.tpot_s == (1.25 - 0.5) / 4


def test_one_token_request_has_no_tpot_and_no_itl():
    r = request_latency(0.0, [0.25], [1])
    assert r == RequestLatency(ttft_s=0.25, tpot_s=None, itl_s=(), e2el_s=0.25, output_tokens=1)


def test_one_chunk_of_several_tokens_has_zero_tpot_and_no_itl():
    r = request_latency(0.0, [0.5], [4])
    assert r.tpot_s == 0.0 and r.itl_s == () and r.output_tokens == 4


@pytest.mark.parametrize(
    "times, tokens, match",
    [
        ([1.0, 2.0], [1], "2 chunk times for 1 chunk sizes"),
        ([], [], "no streamed chunk"),
        ([1.0], [0], "at least one token"),
        ([0.5], [1], "not before the arrival"),
        ([1.0, 0.9], [1, 1], "non-decreasing"),
    ],
)
def test_bad_timelines_raise_with_what_is_wrong(times, tokens, match):
    with pytest.raises(ValueError, match=match):
        request_latency(0.75, times, tokens)


def test_summary_pools_itl_over_requests_and_leaves_one_token_requests_out_of_tpot():
    a = request_latency(0.0, [0.1, 0.3, 0.6], [1, 2, 1])  # TTFT 100, ITL 200 300, E2EL 600, TPOT 500/3
    b = request_latency(0.0, [0.2], [1])  # TTFT 200, no ITL, no TPOT, E2EL 200
    s = summarize([a, b], percentiles=(50, 99))
    assert s["mean_ttft_ms"] == pytest.approx(150.0)
    assert s["median_ttft_ms"] == pytest.approx(150.0)
    assert s["std_ttft_ms"] == pytest.approx(50.0)
    assert s["mean_itl_ms"] == pytest.approx(250.0) and s["p50_itl_ms"] == pytest.approx(250.0)
    assert s["p99_itl_ms"] == pytest.approx(200.0 + 0.99 * 100.0)  # linear interpolation, as numpy
    assert s["mean_tpot_ms"] == pytest.approx(500.0 / 3) and s["std_tpot_ms"] == 0.0
    assert s["mean_e2el_ms"] == pytest.approx(400.0) and s["p99_e2el_ms"] == pytest.approx(200.0 + 0.99 * 400.0)


def test_summary_names_every_statistic_of_every_metric():
    s = summarize([request_latency(0.0, [0.1, 0.2], [1, 1])])
    expected = {f"{stat}_{m}_ms" for m in METRICS for stat in ("mean", "median", "std", "p50", "p90", "p99")}
    assert set(s) == expected


def test_metrics_without_a_sample_are_nan_not_zero():
    empty = summarize([])
    assert len(empty) == 4 * 6 and all(math.isnan(v) for v in empty.values())
    one_token = summarize([request_latency(0.0, [0.05], [1])])
    assert one_token["mean_ttft_ms"] == pytest.approx(50.0)
    for name in ("mean_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "median_itl_ms"):
        assert math.isnan(one_token[name])


def test_tpot_is_the_time_after_the_first_token_per_further_token():
    assert time_per_output_token(ttft=20.0, e2el=80.0, output_tokens=7) == 10.0
    assert time_per_output_token(ttft=20.0, e2el=20.0, output_tokens=1) is None
    with pytest.raises(ValueError, match="at least one output token"):
        time_per_output_token(1.0, 2.0, 0)


def test_statistics_of_one_metric_keep_their_unit():
    s = statistics([1.0, 2.0, 3.0, 4.0], percentiles=(50, 90))
    assert s == {
        "mean": 2.5,
        "median": 2.5,
        "std": pytest.approx(1.118033988749895),
        "p50": 2.5,
        "p90": pytest.approx(3.7),
    }
    assert all(math.isnan(v) for v in statistics([]).values())
