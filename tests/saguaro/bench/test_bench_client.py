"""`saguaro bench --url`: streamed requests to a fake OpenAI-compatible server on 127.0.0.1, timed per chunk.

The fake server (tests/saguaro/bench/fake_openai.py) streams chunks of 1, 3 and 2 tokens after 50, 30 and 30 ms.
Wall-clock checks allow 150 ms of scheduling slack (a busy 2-core machine); everything derived from the
recorded times is checked exactly.
"""

from __future__ import annotations

import json
import math
import socket
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest

from saguaro.bench.client import Call, Streamed, note_event, payload
from saguaro.bench.load import poisson_offsets_s
from saguaro.cli import main
from saguaro.reporting.figures.serving import SERVING_FIGURES
from saguaro.reporting.report import build_report
from tests.saguaro.bench.fake_openai import MODEL, FakeOpenAI, Running, Script
from tests.saguaro.conftest import FIXTURES, TOKEN_PROMPTS

SLACK_S = 0.15


@pytest.fixture
def server():
    running = Running(FakeOpenAI()).start()
    yield running
    running.stop()


def bench(url: str, out: Path, *flags: str) -> Path:
    """Run `saguaro bench --url` with token-id prompts; return the run folder it made."""
    argv = [
        "bench",
        "--url",
        url,
        "--prompts",
        str(TOKEN_PROMPTS),
        "--max-new-tokens",
        "8",
        "--out",
        str(out),
        "--no-progress",
        *flags,
    ]
    assert main(argv) == 0
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    return run


def lines(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "requests.jsonl").read_text().splitlines()]


# -- the stream, without a server ------------------------------------------------------------------------
def test_a_chunk_counts_the_tokens_the_server_names():
    record = Streamed(sent_s=10.0)
    note_event(record, {"choices": [{"text": "ab", "token_ids": [5, 6], "finish_reason": None}]}, 10.5)
    note_event(record, {"choices": [{"text": "", "finish_reason": "stop"}]}, 10.6)  # no output: no chunk
    note_event(record, {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}, 10.7)
    assert (record.chunk_times_s, record.chunk_tokens, record.token_counts) == ([10.5], [2], "server")
    assert (record.text, record.finish_reason, record.prompt_tokens, record.output_tokens) == ("ab", "stop", 3, 2)
    lat = record.latency()
    assert (lat.ttft_s, lat.tpot_s, lat.itl_s, lat.e2el_s) == (0.5, 0.0, (), 0.5)


def test_without_token_ids_a_chunk_is_one_token_and_usage_gives_the_total():
    record = Streamed(sent_s=0.0)
    for t, text in ((0.25, "a"), (0.5, "bcd"), (1.0, "e")):
        note_event(record, {"choices": [{"index": 0, "delta": {"content": text}}]}, t)
    assert record.chunk_tokens == [1, 1, 1] and record.token_counts == "chunks"
    assert record.latency().tpot_s == pytest.approx(0.75 / 2)
    note_event(record, {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 7}}, 1.1)
    lat = record.latency()
    assert lat.tpot_s == pytest.approx(0.75 / 6) and lat.itl_s == (0.25, 0.5) and lat.output_tokens == 7


def test_an_error_event_fails_the_request():
    record = Streamed(sent_s=0.0)
    note_event(record, {"error": {"message": "engine died"}}, 0.1)
    assert record.error == "stream error: engine died" and record.latency() is None


def test_payload_streams_with_usage_and_chat_needs_text():
    body = payload("completions", "m", Call([1, 2], 8, 0.5, seed=3))
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert (body["prompt"], body["max_tokens"], body["temperature"], body["seed"]) == ([1, 2], 8, 0.5, 3)
    assert payload("chat", "m", Call("hi", 8, 0.0))["messages"] == [{"role": "user", "content": "hi"}]
    with pytest.raises(ValueError, match="--endpoint completions"):
        payload("chat", "m", Call([1, 2], 8, 0.0))


# -- arrivals --------------------------------------------------------------------------------------------
def test_poisson_arrivals_are_seeded_and_scale_with_the_rate():
    a = poisson_offsets_s(50, 2.0, np.random.default_rng(7))
    assert np.array_equal(a, poisson_offsets_s(50, 2.0, np.random.default_rng(7)))
    assert not np.array_equal(a, poisson_offsets_s(50, 2.0, np.random.default_rng(8)))
    assert np.allclose(poisson_offsets_s(50, 4.0, np.random.default_rng(7)), a / 2)  # same draws, half the gaps
    assert a[0] == 0.0 and np.all(np.diff(a) > 0)
    assert np.array_equal(poisson_offsets_s(5, math.inf, np.random.default_rng(7)), np.zeros(5))


def test_poisson_gaps_have_mean_one_over_the_rate():
    # 10,000 exponential gaps: the mean's sd is 1 / (rate · 100); 5 sd either side is a false alarm below 1e-6
    # for any seed. Negative control: the same check rejects the gaps of twice the rate.
    n, rate = 10_001, 4.0
    gaps = np.diff(poisson_offsets_s(n, rate, np.random.default_rng(0)))
    assert abs(gaps.mean() - 1 / rate) < 5 / (rate * 100)
    faster = np.diff(poisson_offsets_s(n, 2 * rate, np.random.default_rng(0)))
    assert abs(faster.mean() - 1 / rate) > 5 / (rate * 100)


# -- against the fake server ---------------------------------------------------------------------------
def test_a_client_config_round_trips_through_json_and_refuses_unknown_fields():
    from saguaro.bench.client_config import ClientConfig

    config = ClientConfig(url="http://127.0.0.1:8000/v1/", rates=(0.5, math.inf), label="ssd")
    as_json = json.loads(json.dumps(config.to_dict()))
    assert as_json["rates"] == [0.5, "inf"] and ClientConfig.from_dict(as_json) == config
    with pytest.raises(ValueError, match=r"unknown fields \['speed'\]"):
        ClientConfig.from_dict({**as_json, "speed": 3})


def test_run_folder_holds_requests_with_chunk_times_and_a_summary_per_point(server, tmp_path):
    run = bench(server.url, tmp_path, "--rate", "inf", "-n", "3", "--label", "sd", "--seed", "5")
    names = {p.name for p in run.iterdir()}
    assert {
        "config.json",
        "environment.json",
        "prompts.jsonl",
        "requests.jsonl",
        "point-rate-inf.json",
        "summary.json",
        "summary.md",
    } <= names
    config = json.loads((run / "config.json").read_text())
    assert (config["kind"], config["model"], config["rates"], config["label"]) == ("client", MODEL, ["inf"], "sd")
    for r in lines(run):
        assert r["error"] is None and r["chunk_tokens"] == [1, 3, 2] and r["token_counts"] == "server"
        assert r["new_tokens"] == 6 and r["prompt_tokens"] == 4 and r["finish_reason"] == "length"
        times = r["chunk_times_s"]
        assert r["ttft_s"] == pytest.approx(times[0] - r["sent_s"]) and 0.05 <= r["ttft_s"] < 0.05 + SLACK_S
        assert r["itl_s"] == pytest.approx(np.diff(times).tolist()) and len(r["itl_s"]) == 2
        assert sum(r["itl_s"]) >= 0.06 - 0.01 and max(r["itl_s"]) < 0.03 + SLACK_S
        assert r["e2el_s"] == pytest.approx(times[-1] - r["sent_s"])
        assert r["tpot_s"] == pytest.approx((r["e2el_s"] - r["ttft_s"]) / 5)
    # request i carries seed + i (they arrive in any order at rate inf, so pair seeds with prompts)
    seeds = {tuple(b["prompt"]): b["seed"] for b in server.app.seen.bodies}
    sent = [json.loads(line)["ids"] for line in (run / "prompts.jsonl").read_text().splitlines()[:3]]
    assert [seeds[tuple(ids)] for ids in sent] == [5, 6, 7]
    point = json.loads((run / "point-rate-inf.json").read_text())
    assert (point["completed"], point["failed"], point["rate"], point["url"]) == (3, 0, "inf", server.url)
    assert point["total_output_tokens"] == 18 and point["peak_in_flight"] == 3
    assert point["output_tokens_per_s"] == pytest.approx(18 / point["duration_s"])
    assert point["mean_ttft_ms"] == pytest.approx(np.mean([r["ttft_s"] for r in lines(run)]) * 1e3)


def test_open_loop_sends_at_the_seeded_poisson_times(server, tmp_path):
    server.app.seen.peak_in_flight = 0
    run = bench(server.url, tmp_path, "--rate", "10", "-n", "5", "--seed", "3")
    sent = lines(run)
    planned = poisson_offsets_s(5, 10.0, np.random.default_rng(3))
    assert planned[2] < 0.1  # three arrivals inside the first request's 0.11 s of streaming
    assert [r["scheduled_s"] for r in sent] == pytest.approx(planned.tolist())
    # An open loop does not wait for answers: the three overlapped at the server (a closed loop: one at a time).
    assert server.app.seen.peak_in_flight >= 2
    # Never early; how late depends on the machine (on this shared 2-core VM under the full suite, a request now
    # and then more than 0.15 s late), so only a schedule gone wrong fails: the median within half a second.
    late = sorted(r["sent_s"] - r["scheduled_s"] for r in sent)
    assert late[0] >= 0 and late[len(late) // 2] < 0.5 and late[-1] < 2.0, late


def test_concurrency_is_never_exceeded(server, tmp_path):
    run = bench(server.url, tmp_path, "--concurrency", "2", "-n", "6")
    assert server.app.seen.peak_in_flight == 2
    point = json.loads((run / "point-concurrency-2.json").read_text())
    assert (point["completed"], point["peak_in_flight"], point["concurrency"]) == (6, 2, 2)


def test_http_errors_are_recorded_and_the_run_goes_on(tmp_path):
    running = Running(FakeOpenAI(Script(fail_every=2))).start()
    try:
        run = bench(running.url, tmp_path, "--concurrency", "1", "-n", "4")
    finally:
        running.stop()
    errors = [r["error"] for r in lines(run)]
    assert errors == [None, "HTTP 503: overloaded, try later", None, "HTTP 503: overloaded, try later"]
    point = json.loads((run / "summary.json").read_text())["points"][0]
    assert (point["completed"], point["failed"]) == (2, 2)


def test_a_refused_connection_is_recorded_not_fatal(tmp_path):
    with socket.socket() as s:  # a port that was free a moment ago, and nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = bench(f"http://127.0.0.1:{port}/v1", tmp_path, "--model", "m", "--rate", "inf", "-n", "2")
    assert all(r["error"].startswith("ConnectError") and r["status"] is None for r in lines(run))


def test_a_slow_answer_times_out_and_the_deadline_stops_the_run(tmp_path):
    running = Running(FakeOpenAI(Script(delays_s=(0.05, 0.4, 0.03)))).start()
    try:
        slow = bench(running.url, tmp_path / "slow", "--concurrency", "1", "-n", "1", "--timeout", "0.2")
        late = bench(running.url, tmp_path / "late", "--rate", "4", "8", "-n", "10", "--deadline", "0.3")
    finally:
        running.stop()
    (line,) = lines(slow)
    assert line["error"] == "timeout: no complete answer within 0.2 s" and len(line["chunk_times_s"]) == 1
    summary = json.loads((late / "summary.json").read_text())
    (point,) = summary["points"]
    assert point["not_sent"] > 0 and point["sent"] + point["not_sent"] == 10 and summary["not_run"] == ["rate=8"]
    assert all(r["error"] is None or r["error"].startswith("deadline") for r in lines(late))


def test_chat_endpoint_reads_deltas_without_token_ids(tmp_path):
    running = Running(FakeOpenAI(Script(token_ids=False))).start()
    prompts = tmp_path / "text.jsonl"
    prompts.write_text('{"id": "q", "prompt": "Say hello."}\n')
    try:
        run = bench(
            running.url,
            tmp_path / "runs",
            "--endpoint",
            "chat",
            "--prompts",
            str(prompts),
            "--concurrency",
            "1",
            "-n",
            "1",
        )
        body = running.app.seen.bodies[0]
    finally:
        running.stop()
    assert body["messages"] == [{"role": "user", "content": "Say hello."}]
    (line,) = lines(run)
    assert (line["chunk_tokens"], line["token_counts"], line["new_tokens"]) == ([1, 1, 1], "chunks", 6)
    assert line["text"] == " t0.0 t1.0 t1.1 t1.2 t2.0 t2.1"


def test_a_system_prompt_is_the_chat_system_message_and_text_before_a_completion():
    chat = payload("chat", "m", Call("hi", 8, 0.0, system="Be brief."))
    assert chat["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert payload("completions", "m", Call("hi", 8, 0.0, system="Be brief."))["prompt"] == "Be brief.\n\nhi"
    with pytest.raises(ValueError, match="token ids"):
        payload("completions", "m", Call([1, 2], 8, 0.0, system="Be brief."))


def test_every_request_carries_the_system_prompt_file(tmp_path):
    running = Running(FakeOpenAI(Script(token_ids=False))).start()
    prompts, system = tmp_path / "text.jsonl", tmp_path / "system.txt"
    prompts.write_text('{"id": "a", "prompt": "One?"}\n{"id": "b", "prompt": "Two?"}\n')
    system.write_text("You answer questions about the attached report.")
    try:
        bench(
            running.url,
            tmp_path / "runs",
            "--endpoint",
            "chat",
            "--prompts",
            str(prompts),
            "--system-prompt",
            str(system),
            "--concurrency",
            "1",
            "-n",
            "2",
        )
        bodies = running.app.seen.bodies
    finally:
        running.stop()
    assert [b["messages"][0] for b in bodies] == [{"role": "system", "content": system.read_text()}] * 2
    assert [b["messages"][1]["content"] for b in bodies] == ["One?", "Two?"]


def test_warmup_requests_go_first_with_their_own_prompts_and_are_not_recorded(server, tmp_path):
    run = bench(server.url, tmp_path, "--warmup-requests", "1", "--concurrency", "1", "-n", "3")
    listed = [json.loads(line) for line in (run / "prompts.jsonl").read_text().splitlines()]
    sent = [b["prompt"] for b in server.app.seen.bodies]
    assert len(listed) == 4 and sent == [p["ids"] for p in listed]  # the warm-up's, then the point's three in turn
    assert [r["prompt_id"] for r in lines(run)] == [p["id"] for p in listed[1:]]
    assert json.loads((run / "summary.json").read_text())["points"][0]["completed"] == 3


def test_the_api_key_is_sent_but_never_written(server, tmp_path):
    run = bench(server.url, tmp_path, "--api-key", "sk-secret-123", "--rate", "inf", "-n", "1")
    assert server.app.seen.headers[0]["authorization"] == "Bearer sk-secret-123"
    assert not any("sk-secret-123" in p.read_text() for p in run.iterdir() if p.is_file())


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--url", "http://127.0.0.1:9/v1", "--rate", "1", "--systems", "ar"], "drop --systems"),
        (["--rate", "1"], "add --url"),
        (["--url", "http://127.0.0.1:9/v1"], "either --rate"),
        (["--url", "http://127.0.0.1:9/v1", "--rate", "1", "--concurrency", "2"], "not both"),
        (["--url", "127.0.0.1:9", "--rate", "1"], "http://"),
        (["--url", "http://127.0.0.1:9/v1", "--rate", "0"], "> 0"),
        (["--url", "http://127.0.0.1:9/v1", "--concurrency", "0"], ">= 1"),
        (["--url", "http://127.0.0.1:9/v1", "--rate", "1", "--temperature", "0", "0.7"], "one --temperature"),
        (
            ["--url", "http://127.0.0.1:9/v1", "--rate", "1", "--warmup-requests", "-1"],
            "--warmup-requests must be >= 0",
        ),
        (
            ["--url", "http://127.0.0.1:9/v1", "--rate", "1", "--system-prompt", "/nonexistent/system.txt"],
            "--system-prompt /nonexistent/system.txt",
        ),
        (["--rate", "1", "--warmup-requests", "1"], "add --url"),
    ],
)
def test_bad_flag_combinations_exit_2_with_what_to_do(flags, message, capsys, tmp_path):
    assert main(["bench", *flags, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and message in err and len(err.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir())  # refused before anything was written


def test_saguaro_serve_streams_what_the_client_reads(tmp_path):
    from tests.server.conftest import running
    from tests.server.fake import TOKENS_PER_CHUNK, FakeEngine, FakeModel

    with running(FakeModel(), FakeEngine(delay_s=0.01)) as served:
        run = bench(f"{served.url}/v1", tmp_path, "--concurrency", "2", "-n", "3", "--max-new-tokens", "7")
    for line in lines(run):
        assert line["error"] is None and line["token_counts"] == "server" and line["new_tokens"] == 7
        assert line["chunk_tokens"] == [TOKENS_PER_CHUNK] * 3 + [1] and line["finish_reason"] == "length"


# -- the report --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def labelled_runs(tmp_path_factory):
    """Two client runs, "sd" and "ssd", each at two rates."""
    out = tmp_path_factory.mktemp("client-runs")
    running = Running(FakeOpenAI()).start()
    try:
        return [
            bench(running.url, out / label, "--rate", "20", "inf", "-n", "3", "--label", label)
            for label in ("sd", "ssd")
        ]
    finally:
        running.stop()


def test_report_draws_latency_and_throughput_against_rate_one_line_per_system(labelled_runs, tmp_path):
    text = build_report(labelled_runs, tmp_path).read_text()
    assert "## Serving load (client runs)" in text and "_Not drawn" not in text
    for figure in SERVING_FIGURES["rate"]:
        assert f"]({figure.name}.png)" in text and (tmp_path / f"{figure.name}.png").stat().st_size > 10_000
    ttft = (tmp_path / "ttft_vs_rate.csv").read_text().splitlines()
    assert len(ttft) == 1 + 4 and {row.split(",")[0] for row in ttft[1:]} == {"sd", "ssd"}
    assert "## Headline" not in text  # no engine runs given


@pytest.mark.parametrize("figure", SERVING_FIGURES["rate"], ids=lambda f: f.name)
def test_serving_figures_label_their_axes_and_draw_p50_and_p99(figure, labelled_runs):
    from saguaro.reporting.analysis.load import load_run
    from saguaro.reporting.analysis.serving import point_rows
    from saguaro.reporting.figures import ReportData

    runs = [load_run(p) for p in labelled_runs]
    fig, ax = plt.subplots()
    try:
        rows = figure.draw(ax, ReportData(runs, [], serving=point_rows(runs)))
        assert rows and ax.get_xlabel() and ax.get_ylabel() and ax.get_title()
        assert len(ax.lines) == (2 if figure.name.startswith("throughput") else 4)
        assert [t.get_text() for t in ax.get_xticklabels()] == ["20", "inf"]
    finally:
        plt.close(fig)


def test_report_draws_closed_loop_runs_against_concurrency(server, tmp_path):
    run = bench(server.url, tmp_path / "runs", "--concurrency", "1", "2", "-n", "2", "--label", "ar")
    text = build_report([run], tmp_path / "report").read_text()
    for figure in SERVING_FIGURES["concurrency"]:
        assert f"]({figure.name}.png)" in text
    assert "_Not drawn" not in text and "vs rate" not in text


def test_one_report_holds_engine_runs_and_client_runs(labelled_runs, tmp_path):
    text = build_report([FIXTURES / "runs" / "fanout", labelled_runs[0]], tmp_path).read_text()
    assert "## Headline" in text and "## Serving load (client runs)" in text
    assert (tmp_path / "speedup_vs_budget.png").is_file() and (tmp_path / "ttft_vs_rate.png").is_file()
