"""`saguaro simulate` and `saguaro plan`: exit 0 on good input, 2 on bad input, and no torch."""

import json
import re
import subprocess
import sys

import pytest

from saguaro.cli import main
from tests.simulator.synthetic import engine_run, write_jsonl

FAST = ["--rounds", "300"]


def test_one_configuration_prints_a_report(capsys):
    assert main(["simulate", "--strategy", "ssd", "--K", "3", "--budget", "8", *FAST]) == 0
    out = capsys.readouterr().out
    assert "tokens/s:" in out and "cache_build" in out
    # one hit rate, with its definition; not two figures that differ by how first rounds count
    hit_lines = [line for line in out.splitlines() if "hit rate" in line]
    assert len(hit_lines) == 1 and "first round" in hit_lines[0] and "whole batch" not in out


def test_every_latency_has_a_unit_and_one_number_format(capsys):
    assert main(["simulate", *FAST]) == 0  # the CPU preset: ITL near 1 s, E2EL over a minute
    out = capsys.readouterr().out
    assert "e+" not in out  # no scientific notation next to fixed decimals
    latency = out.split("\n\n")[1].splitlines()
    assert latency[0].split() == ["latency", "unit", "mean", "p50", "p90", "p99"]
    units = {line.split()[0]: line.split()[1] for line in latency[1:]}
    assert units["e2el"] == "s" and units["tpot"] == "ms"
    e2el = [line for line in latency if line.split()[0] == "e2el"][0].split()[2:]
    assert all(re.fullmatch(r"\d+\.\d\d", v) for v in e2el)  # seconds to two decimals
    assert "time_s" in out and "share_%" in out


def test_sweep_latency_columns_name_their_unit(capsys):
    argv = ["simulate", "--strategy", "ar", "sd", "--K", "2", "--batch", "1", "4", *FAST]
    assert main(argv) == 0
    header = capsys.readouterr().out.splitlines()[0].split()
    latency = [c for c in header if c.startswith(("ttft", "itl", "tpot"))]
    assert latency and all(c.endswith(("_ms", "_s")) for c in latency)


def test_a_sweep_prints_a_table_and_json(tmp_path, capsys):
    path = tmp_path / "sweep.json"
    argv = [
        "simulate",
        "--strategy",
        "ar",
        "sd",
        "ssd",
        "--K",
        "2",
        "4",
        "--batch",
        "1",
        "2",
        "--hardware",
        "h100",
        "--pair",
        "llama",
        *FAST,
        "--json",
        str(path),
    ]
    assert main(argv) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["strategy", "K", "budget"] and len(table) == 1 + 2 + 4 + 4
    assert "e+" not in "\n".join(table)
    data = json.loads(path.read_text())
    assert len(data["results"]) == 10
    ssd = [r for r in data["results"] if r["strategy"] == "ssd"]
    assert all("hit_rate" in r and "all_rows_hit_round_rate" in r and "batch_hit_rate" not in r for r in ssd)


def test_json_echoes_the_inputs_it_used(tmp_path):
    path = tmp_path / "one.json"
    argv = [
        "simulate",
        "-K",
        "3",
        "--budget",
        "8",
        "--batch",
        "2",
        "--hardware",
        "h100",
        "--pair",
        "llama",
        "--alpha",
        "0.7",
        "--seed",
        "5",
        "--output-len",
        "64",
        *FAST,
        "--json",
        str(path),
    ]
    assert main(argv) == 0
    inputs = json.loads(path.read_text())["inputs"]
    assert inputs["pair"] == {"preset": "llama", "target": "Llama-3.1-70B", "draft": "Llama-3.2-1B", "target_tp": 4}
    assert inputs["hardware"]["target"] == "H100-SXM5-80GB"
    assert inputs["timing"]["source"].startswith("roofline")
    assert inputs["acceptance"]["alpha"] == 0.7 and inputs["seed"] == 5
    # no rank table was measured on Llama: the α-model at the given α, not the default pair's table
    assert inputs["hit_model"]["model"] == "alpha" and inputs["hit_model"]["alpha"] == 0.7
    assert inputs["hit_model"]["source"].startswith("α-model fitted to")
    assert inputs["grid"]["K"] == [3] and inputs["grid"]["budget"] == [8] and inputs["grid"]["batch"] == [2]
    assert inputs["workload"]["output_len"] == "64" and inputs["workload"]["rounds"] == 300
    assert inputs["flags"]["alpha"] == 0.7


def test_the_default_pair_takes_its_measured_table_and_alpha(tmp_path):
    path = tmp_path / "default.json"
    assert main(["simulate", "-K", "3", *FAST, "--json", str(path)]) == 0  # --pair qwen-coder on the CPU preset
    inputs = json.loads(path.read_text())["inputs"]
    assert inputs["hit_model"]["model"] == "measured" and "spec_bench" in inputs["hit_model"]["source"]
    assert inputs["acceptance"]["alpha"] == pytest.approx(0.724, abs=0.001)  # the table's mean α, measured


def test_a_paper_pair_takes_the_alpha_fitted_to_its_published_sd(tmp_path):
    from simulator.presets import PAIR_ALPHA

    path = tmp_path / "llama.json"
    assert main(["simulate", "--pair", "llama", "--hardware", "h100", *FAST, "--json", str(path)]) == 0
    inputs = json.loads(path.read_text())["inputs"]
    assert inputs["acceptance"]["alpha"] == PAIR_ALPHA["llama"] and "published SD" in inputs["acceptance"]["source"]
    assert inputs["hit_model"]["model"] == "alpha"


def test_json_echoes_constant_timing_and_hits(tmp_path):
    path = tmp_path / "constant.json"
    argv = [
        "simulate",
        "--timing",
        "constant",
        "--t-verify-ms",
        "12",
        "--hit-model",
        "constant",
        "--p-hit",
        "0.6",
        "--rate",
        "0.5",
        *FAST,
        "--json",
        str(path),
    ]
    assert main(argv) == 0
    inputs = json.loads(path.read_text())["inputs"]
    assert inputs["timing"]["source"] == "constant" and inputs["timing"]["t_verify_ms"] == 12
    assert inputs["hit_model"] == {"model": "constant", "p_hit": 0.6}
    assert inputs["workload"]["arrivals"] == "Poisson, 0.5 requests/s"


def test_lists_are_space_separated_and_the_comma_form_still_works(tmp_path):
    results = []
    for fanout in (["4", "2", "2", "1", "3"], ["4,2,2,1,3"]):
        path = tmp_path / "f.json"
        assert main(["simulate", "-K", "4", "--fanout", *fanout, *FAST, "--json", str(path)]) == 0
        results.append(json.loads(path.read_text())["results"][0]["settings"]["fanout"])
    assert results == ["4-2-2-1-3"] * 2


def test_overload_is_a_warning_line_on_stderr(capsys):
    argv = ["simulate", "--timing", "constant", "--strategy", "ar", "--output-len", "100", "--rate", "5", *FAST]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert captured.err.startswith("warning: overloaded: 5 requests/s") and len(captured.err.splitlines()) == 1
    assert "overloaded" not in captured.out.split("\n\n")[0].splitlines()[-1]


@pytest.mark.parametrize("command", [["simulate"], ["plan"], ["theory", "speedup"], ["theory", "fanout"]])
def test_help_shows_the_defaults_and_minus_k(command, capsys):
    with pytest.raises(SystemExit):
        main([*command, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "-K K" in out or "-K K [K ...]" in out
    if command[0] != "theory":
        assert "else 0.8, assumed" in out and "default: qwen-coder" in out  # --alpha, --pair
        assert "--batch BATCH [BATCH ...]" in out and "--batch-size" not in out


def test_progress_on_stderr_for_a_long_sweep(monkeypatch, capsys):
    from saguaro.formatting import Progress

    monkeypatch.setattr(Progress, "DELAY_S", 0.0)
    monkeypatch.setattr(Progress, "EVERY_S", 0.0)
    assert main(["simulate", "-v", "--strategy", "ar", "sd", "--K", "2", *FAST]) == 0
    err = capsys.readouterr().err
    assert "simulate: 2/2 configurations" in err
    assert main(["simulate", "-q", "--strategy", "ar", "sd", "--K", "2", *FAST]) == 0
    assert "configurations" not in capsys.readouterr().err


def test_trace_and_constant_timing(tmp_path):
    path = tmp_path / "trace.json"
    argv = ["simulate", "--timing", "constant", "--t-verify-ms", "10", "--t-draft-ms", "1", "--trace", str(path), *FAST]
    assert main(argv) == 0
    assert any(e.get("name") == "verify" for e in json.loads(path.read_text())["traceEvents"])


@pytest.mark.parametrize("miss_policy", ["per-row", "whole-batch"])
def test_per_sequence_speed_does_not_rise_with_batch_under_either_miss_policy(miss_policy, tmp_path):
    # A build of 3 verifies and a random backup at p_hit 0.7 (fewer rounds than the theory test): crediting hits
    # from a dropped build once made b = 16 2.4x faster per sequence than b = 1.
    path = tmp_path / "out.json"
    argv = [
        "simulate",
        "--K",
        "4",
        "--batch",
        "1",
        "16",
        "--timing",
        "constant",
        "--t-verify-ms",
        "10",
        "--t-draft-ms",
        "1",
        "--t-build-ms",
        "30",
        "--hit-model",
        "constant",
        "--p-hit",
        "0.7",
        "--backup",
        "random",
        "--output-len",
        "inf",
        "--rounds",
        "4000",
        "--miss-policy",
        miss_policy,
        "--json",
        str(path),
    ]
    assert main(argv) == 0
    results = json.loads(path.read_text())["results"]
    assert [r["settings"]["miss_policy"] for r in results] == [miss_policy] * 2
    b1, b16 = (r["tokens_per_s_per_seq"] for r in results)
    # Per-row: equal in expectation (T_b = 0); 5% is about 5 standard errors of b1 - b16 at 4,000 rounds.
    assert b16 <= b1 * 1.05


def test_fit_and_validate_from_records(tmp_path, capsys):
    calibration = write_jsonl(
        tmp_path / "cal.jsonl",
        engine_run("sd", 2, 1, 60),
        engine_run("sd", 4, 2, 60, seed=1),
        engine_run("ar", 0, 2, 40, seed=2),
    )
    runs = write_jsonl(tmp_path / "runs.jsonl", engine_run("sd", 3, 1, 80, seed=3), engine_run("ar", 0, 1, 80, seed=4))
    assert main(["simulate", "--fit", str(calibration), "--validate", str(runs)]) == 0
    assert "2/2 configurations within 10%" in capsys.readouterr().out


def _slower(run: list[dict], factor: float) -> list[dict]:
    """The same rounds with every forward `factor` times dearer (a machine running slower than its calibration)."""
    return [
        dict(
            r,
            verify_ms=r["verify_ms"] * factor,
            draft_ms=r["draft_ms"] * factor,
            round_ms=r["round_ms"] + (factor - 1) * (r["verify_ms"] + r["draft_ms"]),
        )
        for r in run
    ]


def test_level_sets_the_fit_to_an_sd_runs_level(tmp_path, capsys):
    """A run 25% slower than its calibration: predicted ~25% fast as it is, within 10% once --level takes the
    level from an SD run of that machine (the negative control is the same call without --level)."""
    calibration = write_jsonl(
        tmp_path / "cal.jsonl",
        engine_run("sd", 2, 1, 60),
        engine_run("sd", 4, 2, 60, seed=1),
        engine_run("ar", 0, 2, 40, seed=2),
    )
    sd_run = write_jsonl(tmp_path / "sd.jsonl", _slower(engine_run("sd", 3, 1, 80, seed=3), 1.25))
    runs = write_jsonl(tmp_path / "runs.jsonl", _slower(engine_run("sd", 4, 1, 80, seed=5), 1.25))
    out = tmp_path / "out.json"
    assert main(["simulate", "--fit", str(calibration), "--validate", str(runs), "--json", str(out)]) == 0
    assert json.loads(out.read_text())["validation"][0]["error_%"] > 15
    capsys.readouterr()
    assert (
        main(
            ["simulate", "--fit", str(calibration), "--level", str(sd_run), "--validate", str(runs), "--json", str(out)]
        )
        == 0
    )
    result = json.loads(out.read_text())
    assert abs(result["validation"][0]["error_%"]) < 10
    assert result["fit"]["levels"]["target"] == pytest.approx(1.25, rel=0.02)
    assert result["fit"]["levels"]["draft"] == pytest.approx(1.25, rel=0.02)


def test_plan_prints_the_best_configuration(capsys):
    argv = [
        "plan",
        "--rate",
        "2",
        "--target-ms",
        "60",
        "--timing",
        "constant",
        "--strategy",
        "ar",
        "sd",
        "--K",
        "4",
        "--batch",
        "1",
        "4",
        "--rounds",
        "400",
        "--check-requests",
        "60",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "best:" in out and "replicas" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["simulate", "--prompt-len", "abc"],
        ["simulate", "--hardware", "tpu"],
        ["simulate", "--validate", "runs.jsonl"],
        ["simulate", "--fit", "/nonexistent/records.jsonl"],
        ["simulate", "--level", "sd-run.jsonl"],
        ["simulate", "--C", "0.5"],
        ["simulate", "--strategy", "ar", "sd", "--trace", "t.json"],
        ["simulate", "--K", "0", "--strategy", "sd"],
        ["simulate", "-K", "2", "--fanout", "1", "2.5", "1"],
        ["plan", "--rate", "0", "--target-ms", "50"],
    ],
)
def test_bad_input_exits_2(argv, capsys):
    assert main(argv) == 2
    assert "error:" in capsys.readouterr().err


def test_bad_choice_exits_2():
    with pytest.raises(SystemExit) as exit_info:
        main(["simulate", "--strategy", "tree"])
    assert exit_info.value.code == 2


@pytest.mark.parametrize(
    "argv",
    [
        "['simulate', '--rounds', '50', '--json', '-']",
        "['plan', '--rate', '1', '--target-ms', '50', '--timing', 'constant', '--strategy', 'ar', '--batch', '1', "
        "'--rounds', '100', '--check-requests', '10', '--json', '-']",
        "['theory', 'speedup', '--alpha', '0.8', '-K', '4', '--t-sd', '0.3', '--p-hit', '0.9', '--json']",
    ],
)
def test_simulate_plan_and_theory_do_not_import_torch(argv):
    code = (
        "import sys; from saguaro.cli import main; "
        f"rc = main({argv}); "
        "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
