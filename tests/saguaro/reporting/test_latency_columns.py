"""Latency columns of the report in theory.latency's terms, from new result lines and from old run folders."""

from __future__ import annotations

import pytest

from saguaro.reporting.analysis.latency import e2el_s, latency_columns, tpot_s
from saguaro.reporting.analysis.load import load_run
from saguaro.reporting.analysis.variants import variant_rows
from tests.saguaro.conftest import FIXTURES

NEW = [  # as the engine and the bench client write them: chunk gaps kept
    {"new_tokens": 5, "ttft_s": 0.1, "tpot_s": 0.05, "e2el_s": 0.3, "itl_s": [0.1, 0.1]},
    {"new_tokens": 1, "ttft_s": 0.3, "tpot_s": None, "e2el_s": 0.3, "itl_s": []},
]
OLD = [  # before the serving rewrite: e2e_s, and mean_itl_s that was really TPOT
    {"new_tokens": 5, "ttft_s": 0.1, "e2e_s": 0.5, "mean_itl_s": 0.1, "itl_p50_s": 0.1, "itl_p99_s": 0.1},
    {"new_tokens": 1, "ttft_s": 0.2, "e2e_s": 0.2, "mean_itl_s": 0.0, "itl_p50_s": 0.0, "itl_p99_s": 0.0},
]


def test_new_lines_pool_chunk_gaps_and_leave_one_token_requests_out_of_tpot():
    cols = latency_columns(NEW)
    assert cols["mean_ttft_ms"] == pytest.approx(200.0) and cols["p50_ttft_ms"] == pytest.approx(200.0)
    assert cols["mean_tpot_ms"] == pytest.approx(50.0) and cols["p99_tpot_ms"] == pytest.approx(50.0)
    assert cols["p50_itl_ms"] == pytest.approx(100.0) and cols["mean_e2el_ms"] == pytest.approx(300.0)


def test_old_lines_read_e2e_as_e2el_and_mean_itl_as_tpot_and_have_no_itl():
    assert [e2el_s(r) for r in OLD] == [0.5, 0.2]
    assert [tpot_s(r) for r in OLD] == [0.1, None]  # the old 0 of a one-token request is no sample
    cols = latency_columns(OLD)
    assert cols["mean_tpot_ms"] == pytest.approx(100.0) and cols["mean_e2el_ms"] == pytest.approx(350.0)
    assert cols["mean_itl_ms"] is None and cols["p99_itl_ms"] is None


def test_failed_requests_and_missing_ttft_give_no_sample():
    cols = latency_columns([{"error": "HTTP 503", "new_tokens": 0}, {"new_tokens": 3, "e2el_s": 1.0}])
    assert cols["mean_ttft_ms"] is None and cols["mean_e2el_ms"] == pytest.approx(1000.0)


def test_committed_old_run_folders_report_tpot_from_their_mean_itl():
    run = load_run(FIXTURES / "runs" / "batch")
    row = next(r for r in variant_rows([run]) if r["key"] == "ar T=0 b=1")
    lines = [r for r in run.results if r["key"] == "ar T=0 b=1" and not r.get("error")]
    expected = sum(r["mean_itl_s"] for r in lines) / len(lines) * 1e3
    assert row["mean_tpot_ms"] == pytest.approx(expected) and row["p99_itl_ms"] is None
    assert row["mean_e2el_ms"] == pytest.approx(sum(r["e2e_s"] for r in lines) / len(lines) * 1e3)
