"""`saguaro plan` and `saguaro simulate` say what they assumed, what cannot run, and when arrivals overwhelm."""

import json
import re

import pytest

from saguaro.cli import main

QWEN3 = [
    "--pair",
    "qwen3",
    "--hardware",
    "h100",
    "--strategy",
    "sd",
    "--K",
    "4",
    "--batch",
    "1",
    "--output-len",
    "64",
    "--rounds",
    "300",
    "--check-requests",
    "20",
]
# AR at a constant 10 ms per token: 100-token requests, about 1.01 requests/s at batch 1
CONSTANT_AR = [
    "--timing",
    "constant",
    "--t-verify-ms",
    "10",
    "--strategy",
    "ar",
    "--batch",
    "1",
    "--output-len",
    "100",
    "--rounds",
    "400",
]


def test_plan_prints_its_assumptions_and_every_slo_metric_in_ms(capsys):
    assert main(["plan", "--rate", "1", "--itl-ms", "100", *QWEN3]) == 0
    out = capsys.readouterr().out
    for expected in [
        "assumptions",
        "qwen3: target Qwen3-32B at TP 4, draft Qwen3-0.6B",
        "docs/ssd.md §7",
        "target 4× H100-SXM5-80GB",
        "i.i.d., α = 0.69",
        "fitted to qwen3's published SD figure",
        "α-model at α 0.690",
        "α-model fitted to 10 rank tables",
        "128 / 64 tokens",
        "Poisson, 1 requests/s",
        "0 / 300 rounds",
        "itl p99 <= 100 ms",
    ]:
        assert expected in out, expected
    assert main(["plan", "--rate", "1", "--itl-ms", "100", "--hit-model", "powerlaw", *QWEN3]) == 0
    out = capsys.readouterr().out
    assert "power law: misses 1·F^(-1)" in out and "--r, --scale defaults: assumed, not measured" in out
    for header in ["ttft_p99_ms", "tpot_p99_ms", "itl_p99_ms", "e2el_p99_ms", "limit_ms", "full_load_ms"]:
        assert header in out, header
    assert "{" not in out  # tables, not Python dicts


def test_plan_flags_the_targets_its_closest_configuration_violates(capsys):
    # ITL 10 ms meets 50 ms; E2EL about 990 ms misses 500 ms
    assert (
        main(["plan", "--rate", "0.2", "--itl-ms", "50", "--e2el-ms", "500", "--percentile", "50", *CONSTANT_AR]) == 0
    )
    out = capsys.readouterr().out
    assert "no configuration meets the SLO" in out
    assert re.search(r"e2el p50\s+500\.0\s+99\d\.\d!", out) and re.search(r"itl p50\s+50\.0\s+10\.0\s", out)


def test_plan_json_echoes_its_inputs(tmp_path):
    path = tmp_path / "plan.json"
    assert main(["plan", "--rate", "2", "--target-ms", "60", *CONSTANT_AR, "--json", str(path)]) == 0
    data = json.loads(path.read_text())
    inputs = data["inputs"]
    assert inputs["flags"]["rate"] == 2.0 and inputs["flags"]["target_ms"] == 60.0 and inputs["seed"] == 0
    assert inputs["rate_per_s"] == 2.0 and inputs["slo"] == ["itl p99 <= 60 ms"]
    assert inputs["timing"]["source"] == "constant" and inputs["acceptance"]["alpha"] == 0.8
    assert inputs["hit_model"]["model"] == "alpha" and inputs["grid"]["batch"] == [1]  # constant timing: no pair
    assert inputs["workload"]["output_len"] == "100"
    assert data["slo"] == ["itl p99 <= 60 ms"] and data["best"]["strategy"] == "ar"
    assert {row["assumption"] for row in data["assumptions"]} >= {"acceptance", "cache hits", "arrivals", "SLO"}


def test_plan_drops_what_cannot_run_and_says_why(capsys):
    argv = [
        "plan",
        "--rate",
        "0.5",
        "--itl-ms",
        "100",
        "--pair",
        "llama",
        "--hardware",
        "h100",
        "--strategy",
        "ar",
        "--batch",
        "1",
        "256",
        "--prompt-len",
        "4000",
        "--output-len",
        "50",
        "--rounds",
        "300",
        "--check-requests",
        "20",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "1 cannot run" in out and "1 configuration(s) cannot run (dropped):" in out
    assert "strategy=ar K=0 batch=256 C=1.0: Llama-3.1-70B (TP 4, batch 256 × 4,050 tokens) needs" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["plan", "--rate", "1", "--target-ms", "50", "--prompt-len", "40000"], "exceeds the context window"),
        (
            [
                "plan",
                "--rate",
                "1",
                "--target-ms",
                "50",
                "--pair",
                "llama",
                "--hardware",
                "h100",
                "--batch",
                "512",
                "--prompt-len",
                "8000",
            ],
            "none of the 22 configurations can run; the first, strategy=ar K=0 batch=512",
        ),
        (["plan", "--rate", "1"], "give a latency target"),
        (["plan", "--rate", "1", "--target-ms", "50", "--itl-ms", "40"], "two limits on itl"),
        (["simulate", "--pair", "qwen3", "--hardware", "h100", "--tp", "3"], "does not divide Qwen3-32B's 64"),
        (["simulate", "--prompt-len", "30000", "--output-len", "4000"], "exceeds the context window"),
        (
            [
                "simulate",
                "--pair",
                "llama",
                "--hardware",
                "h100",
                "--batch",
                "64",
                "--prompt-len",
                "8000",
                "--output-len",
                "4000",
            ],
            "needs 98.2 GB per device",
        ),
    ],
)
def test_what_cannot_run_exits_2_with_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_simulate_reports_an_overloaded_open_loop_with_its_capacity(capsys):
    assert main(["simulate", "--rate", "5", *CONSTANT_AR]) == 0
    captured = capsys.readouterr()
    assert captured.err.startswith(
        "warning: overloaded: 5 requests/s arrive but this configuration serves at most 1.01 requests/s"
    )  # a plain warning line
    assert re.search(r"ttft\s+ms\s+none\s+none\s+none\s+none", captured.out)  # no latency quoted


def test_simulate_json_marks_the_overload(capsys):
    assert main(["simulate", "--rate", "5", *CONSTANT_AR, "--json", "-"]) == 0
    (result,) = json.loads(capsys.readouterr().out)["results"]
    assert result["settings"]["overloaded"] is True and result["settings"]["capacity_rps"] == pytest.approx(
        1.01, rel=0.02
    )
    assert result["ttft_ms"]["p99"] is None and result["e2el_ms"]["mean"] is None


def test_a_sweep_marks_its_overloaded_rows(capsys):
    argv = [
        "simulate",
        "--rate",
        "0.5",
        *CONSTANT_AR[:4],
        "--strategy",
        "ar",
        "--batch",
        "1",
        "4",
        "--output-len",
        "100",
        "--rounds",
        "400",
    ]
    assert main(argv) == 0
    captured = capsys.readouterr()
    # batch 1 serves about 1.01 requests/s: not overloaded at 0.5; the warning and column appear only when needed
    assert "overloaded" not in captured.out + captured.err
    assert main([*argv[:2], "2", *argv[3:]]) == 0  # 2 requests/s: batch 1 overloaded, batch 4 (4 /s) not
    captured = capsys.readouterr()
    table = captured.out.splitlines()
    assert "overloaded" in table[0] and "capacity_rps" in table[0]
    assert "True" in table[1] and "True" not in table[2]
    assert captured.err.startswith("warning: 1 of 2 configurations are overloaded") and captured.err.count("\n") == 1


def test_the_commands_metrics_are_theorys():
    from saguaro.commands import plan as plan_command
    from theory.latency import METRICS

    assert plan_command.METRICS == METRICS


def test_plan_shows_progress_on_stderr_and_tables_on_stdout(monkeypatch, capsys):
    from saguaro.formatting import Progress

    monkeypatch.setattr(Progress, "DELAY_S", 0.0)
    monkeypatch.setattr(Progress, "EVERY_S", 0.0)
    argv = [
        "plan",
        "-v",
        "--rate",
        "0.5",
        "--target-ms",
        "50",
        *CONSTANT_AR[:4],
        "--strategy",
        "ar",
        "sd",
        "-K",
        "2",
        "--batch",
        "1",
        "--output-len",
        "50",
        "--rounds",
        "200",
        "--check-requests",
        "20",
        "--check-top",
        "1",
    ]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "plan: 3/3 configurations" in captured.err  # two screened, one checked
    assert "configurations," not in captured.out and "e+" not in captured.out
    assert main([*argv[:1], "-q", *argv[2:]]) == 0
    assert "configurations," not in capsys.readouterr().err
