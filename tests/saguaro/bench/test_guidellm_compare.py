"""saguaro.bench.guidellm: guidellm's dataset from a saguaro bench run's prompts, and both clients' figures from
their per-request records with theory.latency's definitions."""

import json

import pytest

from saguaro.bench.guidellm import compare, guidellm_rows, main, saguaro_rows, write_data
from saguaro.bench.prompts import Prompt
from saguaro.bench.runfolder import RunDir


def request(start: float, first: float, last: float, tokens: int) -> dict:
    timings = {
        "request_start": start,
        "first_token_iteration": first,
        "last_token_iteration": last,
        "request_end": None if last is None else last + 0.01,
    }
    return {"info": {"timings": timings}, "output_metrics": {"text_tokens": tokens}}


def report(tmp_path, strategy: dict, successful: list[dict], errored: int = 0):
    bench = {
        "config": {"strategy": strategy},
        "requests": {"successful": successful, "errored": [request(0.0, None, None, 0)] * errored, "incomplete": []},
        "metrics": {"inter_token_latency_ms": {"successful": {"median": 99.0}}},
    }
    path = tmp_path / "guidellm.json"
    path.write_text(json.dumps({"benchmarks": [bench]}))
    return path


def test_guidellm_figures_are_computed_from_its_request_timings(tmp_path):
    path = report(
        tmp_path,
        {"type_": "concurrent", "streams": 2},
        [request(0.0, 0.5, 1.5, 11), request(1.0, 1.2, 2.2, 6)],
        errored=1,
    )
    [row] = guidellm_rows(path)
    assert (row["client"], row["point"], row["completed"], row["failed"]) == ("guidellm", "concurrency=2", 2, 1)
    assert row["p50_ttft_ms"] == pytest.approx(350.0)  # TTFTs of 500 and 200 ms
    assert row["p50_tpot_ms"] == pytest.approx(150.0)  # 1000 / 10 and 1000 / 5 ms a token after the first
    assert row["output_tokens_per_s"] == pytest.approx(17 / 2.21)  # first send to the last answer
    assert row["p50_itl_ms"] is None and row["guidellm_itl_ms"] == 99.0  # no chunk times; guidellm's own "ITL"


def test_a_poisson_point_is_named_by_its_rate(tmp_path):
    path = report(tmp_path, {"type_": "poisson", "rate": 0.25}, [request(0.0, 0.5, 1.5, 3)])
    assert guidellm_rows(path)[0]["point"] == "rate=0.25 (poisson)"


def run_folder(tmp_path, prompts: list[Prompt]) -> RunDir:
    run = RunDir.create(tmp_path, "client", {"kind": "client"}, {})
    run.write_prompts(prompts)
    return run


def test_the_dataset_is_the_runs_prompts_in_order_with_the_output_length(tmp_path):
    run = run_folder(tmp_path, [Prompt("a", "c", "t", "first prompt"), Prompt("b", "c", "t", "second")])
    assert write_data(run.path, 32, tmp_path / "data.jsonl") == 2
    lines = [json.loads(line) for line in (tmp_path / "data.jsonl").read_text().splitlines()]
    assert lines == [
        {"prompt": "first prompt", "output_tokens_count": 32},
        {"prompt": "second", "output_tokens_count": 32},
    ]


def test_token_id_prompts_are_refused_for_guidellm(tmp_path, capsys):
    run = run_folder(tmp_path, [Prompt("a", "c", "t", None, (1, 2, 3))])
    assert main(["data", str(run.path), "--max-new-tokens", "4", "--out", str(tmp_path / "d.jsonl")]) == 2
    assert "guidellm sends text prompts" in capsys.readouterr().err


def test_saguaro_rows_and_the_table_hold_both_clients(tmp_path):
    run = run_folder(tmp_path, [Prompt("a", "c", "t", "x")])
    line = {
        "point": "concurrency=2",
        "sent_s": 0.0,
        "done_s": 2.0,
        "ttft_s": 0.3,
        "tpot_s": 0.1,
        "itl_s": [0.2, 0.1],
        "new_tokens": 10,
        "error": None,
    }
    run.append_requests([line, {**line, "error": "HTTP 503: busy", "ttft_s": None, "tpot_s": None, "itl_s": []}])
    [row] = saguaro_rows(run.path)
    assert (row["completed"], row["failed"], row["p50_itl_ms"]) == (1, 1, pytest.approx(150.0))
    table = compare([run.path], [report(tmp_path, {"type_": "concurrent", "streams": 2}, [request(0, 1, 2, 3)])])
    assert "| saguaro bench | concurrency=2 |" in table and "| guidellm | concurrency=2 |" in table
