"""`saguaro simulate` and `saguaro plan`: exit 0 on good input, 2 on bad input, and no torch."""

import json
import subprocess
import sys

import pytest

from saguaro.cli import main
from tests.simulator.synthetic import engine_run, write_jsonl

FAST = ["--rounds", "300"]


def test_one_configuration_prints_a_report(capsys):
    assert main(["simulate", "--strategy", "ssd", "--K", "3", "--budget", "8", *FAST]) == 0
    out = capsys.readouterr().out
    assert "tokens/s:" in out and "hit rate:" in out and "cache_build" in out


def test_a_sweep_prints_a_table_and_json(tmp_path, capsys):
    path = tmp_path / "sweep.json"
    argv = ["simulate", "--strategy", "ar", "sd", "ssd", "--K", "2", "4", "--batch", "1", "2", "--hardware", "h100",
            "--pair", "llama", *FAST, "--json", str(path)]
    assert main(argv) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["strategy", "K", "budget"] and len(table) == 1 + 2 + 4 + 4
    assert len(json.loads(path.read_text())) == 10


def test_trace_and_constant_timing(tmp_path):
    path = tmp_path / "trace.json"
    argv = ["simulate", "--timing", "constant", "--t-verify-ms", "10", "--t-draft-ms", "1", "--trace", str(path),
            *FAST]
    assert main(argv) == 0
    assert any(e.get("name") == "verify" for e in json.loads(path.read_text())["traceEvents"])


@pytest.mark.parametrize("miss_policy", ["per-row", "whole-batch"])
def test_per_sequence_speed_does_not_rise_with_batch_under_either_miss_policy(miss_policy, tmp_path):
    # Issue 11's repro (fewer rounds): a build of 3 verifies and a random backup at p_hit 0.7. Crediting hits
    # from a dropped build once made b = 16 2.4x faster per sequence than b = 1.
    path = tmp_path / "out.json"
    argv = ["simulate", "--K", "4", "--batch", "1", "16", "--timing", "constant", "--t-verify-ms", "10",
            "--t-draft-ms", "1", "--t-build-ms", "30", "--hit-model", "constant", "--p-hit", "0.7", "--backup",
            "random", "--output-len", "inf", "--rounds", "4000", "--miss-policy", miss_policy, "--json", str(path)]
    assert main(argv) == 0
    results = json.loads(path.read_text())
    assert [r["settings"]["miss_policy"] for r in results] == [miss_policy] * 2
    b1, b16 = (r["tokens_per_s_per_seq"] for r in results)
    # Per-row: equal in expectation (T_b = 0); 5% is about 5 standard errors of b1 - b16 at 4,000 rounds.
    assert b16 <= b1 * 1.05


def test_fit_and_validate_from_records(tmp_path, capsys):
    calibration = write_jsonl(tmp_path / "cal.jsonl", engine_run("sd", 2, 1, 60), engine_run("sd", 4, 2, 60, seed=1),
                              engine_run("ar", 0, 2, 40, seed=2))
    runs = write_jsonl(tmp_path / "runs.jsonl", engine_run("sd", 3, 1, 80, seed=3), engine_run("ar", 0, 1, 80, seed=4))
    assert main(["simulate", "--fit", str(calibration), "--validate", str(runs)]) == 0
    assert "2/2 configurations within 10%" in capsys.readouterr().out


def test_plan_prints_the_best_configuration(capsys):
    argv = ["plan", "--rate", "2", "--target-ms", "60", "--timing", "constant", "--strategy", "ar", "sd",
            "--K", "4", "--batch", "1", "4", "--rounds", "400", "--check-requests", "60"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "best:" in out and "replicas" in out


@pytest.mark.parametrize("argv", [
    ["simulate", "--prompt-len", "abc"],
    ["simulate", "--hardware", "tpu"],
    ["simulate", "--validate", "runs.jsonl"],
    ["simulate", "--fit", "/nonexistent/records.jsonl"],
    ["simulate", "--C", "0.5"],
    ["simulate", "--strategy", "ar", "sd", "--trace", "t.json"],
    ["simulate", "--K", "0", "--strategy", "sd"],
    ["plan", "--rate", "0", "--target-ms", "50"],
])
def test_bad_input_exits_2(argv, capsys):
    assert main(argv) == 2
    assert "error:" in capsys.readouterr().err


def test_bad_choice_exits_2():
    with pytest.raises(SystemExit) as exit_info:
        main(["simulate", "--strategy", "tree"])
    assert exit_info.value.code == 2


def test_simulate_does_not_import_torch():
    code = ("import sys; from saguaro.cli import main; "
            "rc = main(['simulate', '--rounds', '50', '--json', '-']); "
            "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
