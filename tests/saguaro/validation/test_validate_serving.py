"""`saguaro validate serving`: each load point of a `saguaro bench --url` run replayed in the simulator; a
closed-loop point is simulated as one, and several calibrations are fitted as one (the served runs of
2026-12-02 10:50 in reports/2026-12-cpu-prediction-accuracy)."""

import json
from pathlib import Path

import pytest

from saguaro.cli import main
from saguaro.validation import serving
from tests.saguaro.validation.test_validate_engine import pooled_calibration

SESSION = "2026-12-02-avx512-1050"  # served SSD, its SD reference and two calibrations


def test_a_concurrency_1_point_is_simulated_one_request_at_a_time():
    """A closed-loop point's requests were sent as the previous one finished: replayed at the measured send
    times, a simulation slower than the run overlapped them (a concurrency-1 point of 2026-12-01 came out with
    TTFT +43% that way)."""
    from simulator import ConstantTiming, IidAcceptance, Policy

    timing = ConstantTiming(t_verify_ms=100.0, t_draft_ms=10.0, t_prefill_ms=300.0)
    policy, acceptance = Policy("sd", K=2), IidAcceptance(0.0)  # 1 token a round of 120 ms: 20 tokens 2.6 s
    # the run was faster than this timing: each request sent 1 s after the previous one
    closed = [
        {
            "point": "concurrency=1",
            "concurrency": 1,
            "scheduled_s": None,
            "arrival_s": float(i),
            "prompt_tokens": 50,
            "new_tokens": 20,
        }
        for i in range(4)
    ]
    got = serving.predict(timing, policy, acceptance, None, closed, max_num_seqs=8, seeds=2)
    assert got["ttft_p50"] == pytest.approx(300.0) and got["ttft_p99"] == pytest.approx(300.0)
    assert got["tpot_p50"] == pytest.approx(120.0)
    # the same requests on a schedule (an open-loop point) do overlap: they queue behind each other's rounds
    scheduled = [{**r, "point": "rate=1", "concurrency": None, "scheduled_s": r["arrival_s"]} for r in closed]
    opened = serving.predict(timing, policy, acceptance, None, scheduled, max_num_seqs=8, seeds=2)
    assert opened["ttft_p99"] > 300.0 and opened["tpot_p99"] > 120.0
    assert serving.closed_loop_concurrency(closed) == 1 and serving.closed_loop_concurrency(scheduled) is None


def _predicted(runs: Path, tmp_path: Path, *calibrations: Path, extra: tuple[str, ...] = ()) -> list[dict]:
    out = tmp_path / "served.json"
    code = main(
        [
            "validate",
            "serving",
            str(next((runs / "serving").glob("*-serve-ssd-c1"))),
            "--calibration",
            *map(str, calibrations),
            "--sd-run",
            str(next(runs.glob("*-sd-reference-served"))),
            "--server-rounds",
            str(runs / "serving" / "serve-ssd-8-rounds.jsonl"),
            "--max-num-seqs",
            "8",
            "--seeds",
            "2",
            "--json",
            str(out),
            *extra,
        ]
    )
    assert code == 0
    return json.loads(out.read_text())["rows"]


def test_served_validation_fits_several_calibrations_as_one(held_out_runs, tmp_path):
    """--calibration A B: one fit over both calibrations' records (the table their records in a single file
    give), and neither's alone."""
    session = held_out_runs / SESSION
    runs = session / "runs"
    calibrations = [runs / "calibration.jsonl", session / "calibration-b1248.jsonl"]
    pooled = pooled_calibration(tmp_path, *calibrations)

    def predicted(*paths: Path) -> list[dict]:
        return [row["predicted"] for row in _predicted(runs, tmp_path, *paths)]

    both = predicted(*calibrations)
    assert both == predicted(pooled)
    assert all(predicted(path) != both for path in calibrations)


def test_the_table_names_each_point_and_terms_add_the_servers_rounds(held_out_runs, tmp_path, capsys):
    runs = held_out_runs / SESSION / "runs"
    rows = _predicted(runs, tmp_path, runs / "calibration.jsonl", extra=("--terms",))
    out = capsys.readouterr().out
    assert [row["point"] for row in rows] == ["concurrency=1"]
    assert "| concurrency=1 | " in out and "figures within 15%" in out and "policy ssd K=4" in out
    assert "The server's rounds against the fit" in out and "| prefill: batch × tokens" in out


def test_a_client_folder_without_requests_is_one_line_and_exit_2(held_out_runs, tmp_path, capsys):
    runs = held_out_runs / SESSION / "runs"
    code = main(
        [
            "validate",
            "serving",
            str(tmp_path),
            "--calibration",
            str(runs / "calibration.jsonl"),
            "--sd-run",
            str(next(runs.glob("*-sd-reference-served"))),
            "--server-rounds",
            str(runs / "serving" / "serve-ssd-8-rounds.jsonl"),
            "--max-num-seqs",
            "8",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "has no requests.jsonl" in err and len(err.strip().splitlines()) == 1
