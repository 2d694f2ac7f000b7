"""`saguaro theory ...`: tables, --json, exit status 2 on bad input, and no torch."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from saguaro.cli import main

REPO = Path(__file__).resolve().parents[2]
SPEEDUP = ["theory", "speedup", "--alpha", "0.8", "--K", "4", "--t-sd", "0.3", "--p-hit", "0.9"]
FANOUT = ["theory", "fanout", "--alpha", "0.8", "--r", "1", "--K", "7", "--B", "24"]
FIT = ["theory", "fit-r", "--fanout", "1", "2", "4", "8", "--miss", "0.5", "0.3", "0.17", "0.09"]
BACKUP = ["theory", "backup", "--alpha", "0.8", "--K", "4", "--t-sd", "0.3", "--p-hit", "0.9"]
SAGUARO = ["theory", "saguaro", "--p", "0.1", "0.1", "0.8", "--q", "0.1", "0.5", "0.4", "--F", "1", "--C", "1", "0.5"]


def run_json(argv: list[str], capsys) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_speedup_table(capsys) -> None:
    assert main([*SPEEDUP, "--batch", "1", "16"]) == 0
    out = capsys.readouterr().out
    for text in ("E_sd", "3.362", "sd_speedup", "2.586", "cor9_ceiling_ssd_over_sd", "ssd_speedup", "3.264"):
        assert text in out


def test_speedup_json(capsys) -> None:
    data = run_json([*SPEEDUP, "--batch", "1", "4"], capsys)
    assert data["E_sd"] == pytest.approx(3.3616) and data["cor8_never_slower_than_sd"] is True
    assert [row["b"] for row in data["by_batch"]] == [1, 4]
    assert data["by_batch"][0]["ssd_over_sd"] > data["by_batch"][1]["ssd_over_sd"] > 1


def test_speedup_per_sequence_does_not_rise_with_batch_under_either_miss_policy(capsys) -> None:
    # A random backup and a build of 3 verifies: the paper's batch form (Cor. 16) makes b = 16 2.4x faster than b = 1.
    argv = [*SPEEDUP, "--p-hit", "0.7", "--t-p", "3", "--e-miss", "1", "--t-b", "0", "--batch", "1", "16"]
    per_row = run_json(argv, capsys)
    whole = run_json([*argv, "--miss-policy", "whole-batch"], capsys)
    assert per_row["miss_policy"] == "per-row" and whole["miss_policy"] == "whole-batch"
    for data in (per_row, whole):
        assert data["by_batch"][1]["ssd_speedup"] <= data["by_batch"][0]["ssd_speedup"]
    tokens = 0.7 * 3.3616 + 0.3
    assert per_row["by_batch"][0]["ssd_speedup"] == pytest.approx(tokens / 3, rel=1e-4)  # the build, every round
    assert whole["by_batch"][0]["ssd_speedup"] == pytest.approx(tokens / (0.7 * 3 + 0.3), rel=1e-4)  # dropped


def test_miss_policy_choices_are_the_enums() -> None:
    from saguaro.commands.theory import MISS_POLICIES
    from theory import MissPolicy

    assert MISS_POLICIES == tuple(m.value for m in MissPolicy)


def test_fanout_table_and_json(capsys) -> None:
    assert main(FANOUT) == 0
    out = capsys.readouterr().out
    assert "optimal_integer" in out and "uniform" in out and "3.897" in out
    data = run_json(FANOUT, capsys)
    assert data["schedules"]["optimal_integer"] == [4, 3, 3, 3, 3, 2, 2, 4]
    assert sum(data["schedules"]["optimal_integer"]) == 24
    hit = data["hit_probability"]
    assert hit["optimal_integer"] >= hit["uniform"]


def test_fit_r_table_and_json(capsys) -> None:
    assert main(FIT) == 0
    out = capsys.readouterr().out
    assert "r_ci_0.95" in out and "linregress" in out
    data = run_json(FIT, capsys)
    assert data["r_ci"][0] < data["r"] < data["r_ci"][1] and data["dof"] == 2


def test_backup_table_and_json(capsys) -> None:
    assert main(BACKUP) == 0
    out = capsys.readouterr().out
    assert "b_star" in out and "neural" in out and "random" in out
    data = run_json(BACKUP, capsys)
    assert data["b_star"] == 3
    assert [row["choice"] for row in data["by_batch"]][:3] == ["neural", "neural", "random"]


def test_saguaro_table_and_json(capsys) -> None:
    assert main(SAGUARO) == 0
    out = capsys.readouterr().out
    assert "hit_given_reject" in out and "0.812" in out
    data = run_json(SAGUARO, capsys)
    assert [row["hit_given_reject"] for row in data["by_C"]] == pytest.approx([1.0, 0.8125])
    assert sum(data["by_C"][1]["sigma"]) == pytest.approx(1.0)


def test_saguaro_normalises_counts_on_request(capsys) -> None:
    data = run_json(
        ["theory", "saguaro", "--p", "1", "1", "8", "--q", "1", "5", "4", "--F", "1", "--normalise"], capsys
    )
    assert data["by_C"][0]["hit_given_reject"] == pytest.approx(1.0)


def test_no_nan_in_json_when_nothing_is_ever_rejected(capsys) -> None:
    data = run_json(["theory", "saguaro", "--p", "0.5", "0.5", "--q", "0.5", "0.5", "--F", "1"], capsys)
    assert data["by_C"][0]["hit_given_reject"] is None


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["theory", "speedup", "--alpha", "1.5", "--K", "4", "--t-sd", "0.3", "--p-hit", "0.9"], "alpha"),
        (["theory", "speedup", "--alpha", "0.8", "--K", "0", "--t-sd", "0.3", "--p-hit", "0.9"], "--K"),
        (["theory", "fanout", "--alpha", "0.8", "--r", "-1", "--K", "7", "--B", "24"], "r must be > 0"),
        (["theory", "fit-r", "--fanout", "1", "2", "4", "--miss", "0.5", "0.3"], "one miss rate per fan-out"),
        (["theory", "backup", "--alpha", "0.8", "--K", "4", "--t-sd", "0.3", "--p-hit", "2"], "p_hit"),
        (["theory", "saguaro", "--p", "0.5", "0.6", "--q", "0.5", "0.5", "--F", "1"], "--normalise"),
        (["theory", "saguaro", "--p", "0.5", "0.5", "--q", "0.5", "0.5", "--F", "1", "--C", "0"], "(0, 1]"),
    ],
)
def test_bad_input_exits_2_with_one_line(argv: list[str], fragment: str, capsys) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("saguaro theory: error:") and captured.err.count("\n") == 1
    assert fragment in captured.err and "Traceback" not in captured.err


def test_bad_input_in_a_real_process_has_no_traceback() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "saguaro.cli",
            "theory",
            "speedup",
            "--alpha",
            "1.5",
            "--K",
            "4",
            "--t-sd",
            "0.3",
            "--p-hit",
            "0.9",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1


def test_theory_command_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "from saguaro.cli import main\n"
        "for argv in ({}):\n"
        "    assert main(list(argv)) == 0\n"
        "heavy = [m for m in ('torch', 'transformers', 'simpy') if m in sys.modules]\n"
        "sys.exit(f'imported {{heavy}}' if heavy else 0)\n"
    ).format(", ".join(repr(tuple(a)) for a in (SPEEDUP, FANOUT, FIT, BACKUP, SAGUARO)))
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    "argv, echoed",
    [
        (
            ["speedup", "--alpha", "0.7", "-K", "5", "--t-sd", "0.3", "--p-hit", "0.8", "--batch", "1", "4"],
            {"alpha": 0.7, "K": 5, "t_sd": 0.3, "p_hit": 0.8, "batch": [1, 4], "miss_policy": "per-row"},
        ),
        (
            ["fanout", "--alpha", "0.8", "-K", "3", "--budget", "9", "--r", "0.5"],
            {"alpha": 0.8, "K": 3, "B": 9, "r": 0.5, "scale": 1.0},
        ),
        (
            ["fit-r", "--fanout", "1", "2", "4", "--miss", "0.5", "0.3", "0.2"],
            {"fanout": [1.0, 2.0, 4.0], "miss": [0.5, 0.3, 0.2], "confidence": 0.95},
        ),
        (
            ["backup", "--alpha", "0.8", "-K", "4", "--t-sd", "0.3", "--p-hit", "0.9", "--batch", "2", "8"],
            {"K": 4, "batch": [2, 8], "fast": "random"},
        ),
    ],
)
def test_json_echoes_every_input_and_minus_k_and_budget_are_accepted(argv, echoed, capsys) -> None:
    assert main(["theory", *argv, "--json"]) == 0
    inputs = json.loads(capsys.readouterr().out)["inputs"]
    assert {k: inputs[k] for k in echoed} == echoed


def test_tables_use_one_fixed_format_per_column(capsys) -> None:
    # p_hit^b spans 0.9 .. 1e-3: once printed as 0.9 next to 0.00118
    assert (
        main(
            [
                "theory",
                "speedup",
                "--alpha",
                "0.8",
                "-K",
                "4",
                "--t-sd",
                "0.3",
                "--p-hit",
                "0.9",
                "--batch",
                "1",
                "64",
                "512",
            ]
        )
        == 0
    )
    table = capsys.readouterr().out.split("\n\n")[1].splitlines()
    assert table[0].split() == ["b", "all_hit", "ssd_speedup", "ssd_over_sd"]
    cells = [v for line in table[1:] for v in line.split()[1:]]
    assert len(cells) == 9 and all(re.fullmatch(r"\d+\.\d{3}", v) for v in cells), cells
