"""`saguaro plan --placement` (simulator/placement.py, saguaro/commands/placement.py): SSD with hardware of its own
against AR and SD with everything for the target, from presets, a calibration, or measured bench runs."""

import json

from saguaro.cli import main
from saguaro.commands.placement import measured_rows
from simulator import Deployment, IidAcceptance, Lengths, RooflineTiming, Scenario
from simulator.placement import compare, largest_tp, preset_options, winner
from simulator.plan import LatencyTarget
from simulator.presets import hardware_preset, model_preset
from tests.simulator.synthetic import engine_run, write_jsonl
from theory import Strategy

LLAMA = Scenario(
    RooflineTiming(
        Deployment(model_preset("llama-3.1-70b"), hardware_preset("h100"), 4),
        Deployment(model_preset("llama-3.2-1b"), hardware_preset("h100")),
    ),
    acceptance=IidAcceptance(0.87),
    output_len=Lengths(256),
    rounds=800,
    target_devices=4,
)


def test_five_h100s_run_the_target_at_tp_4_either_way():
    options = {o.strategy: o for o in preset_options(LLAMA, 5)}
    assert options[Strategy.SSD].scenario.timing.target.tp == 4 and "draft on its own" in options[Strategy.SSD].where
    assert options[Strategy.AR].scenario.timing.target.tp == 4 and "1 idle" in options[Strategy.AR].where


def test_the_largest_tp_respects_the_heads_and_memory():
    target = LLAMA.timing.target
    assert largest_tp(target, 7) == 4 and largest_tp(target, 8) == 8
    assert largest_tp(target, 1) is None  # 141 GB of weights on one 80 GB device


def test_ssd_wins_the_papers_setting():
    outcomes = compare(preset_options(LLAMA, 5), batch=1)
    assert winner(outcomes).option.strategy is Strategy.SSD
    speeds = {o.option.strategy: o.tokens_per_s for o in outcomes}
    assert speeds[Strategy.SSD] > 1.2 * speeds[Strategy.SD] > 1.2 * speeds[Strategy.AR]


def test_an_slo_nobody_meets_has_no_winner():
    outcomes = compare(preset_options(LLAMA, 5), batch=1, targets=[LatencyTarget("tpot", 99, 0.1)])
    assert winner(outcomes) is None and all(o.missed for o in outcomes)


def test_one_device_is_refused_in_one_line(capsys):
    assert main(["plan", "--placement", "--hardware", "h100", "--pair", "llama", "--devices", "1"]) == 2
    assert "SSD's draft needs a device of its own" in capsys.readouterr().err


def test_the_command_labels_a_preset_answer_predicted(capsys):
    assert (
        main(["plan", "--placement", "--hardware", "h100", "--pair", "llama", "--rounds", "500", "--output-len", "128"])
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("predicted (h100 preset") and "on 5 × H100" in lines[0]
    assert lines[-1].startswith("  -> SSD wins:") and len(lines) == 5


def test_a_calibration_without_every_core_says_so(tmp_path, capsys):
    split = write_jsonl(
        tmp_path / "cal.jsonl",
        engine_run("sd", 2, 1, 60),
        engine_run("sd", 4, 2, 60, seed=1),
        engine_run("ar", 0, 2, 40, seed=2),
        engine_run("ssd", 3, 1, 60, seed=3, fanout=(1, 1, 1, 1)),
    )
    assert main(["plan", "--placement", "--fit", str(split), "--rounds", "300", "--output-len", "64"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("predicted (this machine, calibrated") and "no --fit-all-cores" in out


def _run_folder(path, variants):
    path.mkdir()
    (path / "summary.json").write_text(json.dumps({"variants": variants}))
    return path


def test_measured_runs_answer_with_the_best_of_each_side(tmp_path, capsys):
    one = _run_folder(
        tmp_path / "a-one-core-each",
        [
            {"system": "ar", "threads": 1, "batch": 1, "key": "ar T=0 b=1", "tokens_per_s": 6.0, "p99_tpot_ms": 170.0},
            {"system": "sd", "threads": 1, "batch": 1, "key": "sd K=auto T=0 b=1", "tokens_per_s": 7.0},
            {
                "system": "ssd",
                "threads": 1,
                "batch": 1,
                "key": "ssd K=auto",
                "tokens_per_s": 8.64,
                "p99_tpot_ms": 120.0,
            },
        ],
    )
    every = _run_folder(
        tmp_path / "b-every-core",
        [
            {"system": "ar", "threads": 2, "batch": 1, "key": "ar T=0 b=1", "tokens_per_s": 11.28},
            {"system": "sd", "threads": 2, "batch": 1, "key": "sd K=auto T=0 b=1", "tokens_per_s": 11.70},
        ],
    )
    rows = {r["strategy"]: r for r in measured_rows([one, every], 99, [])}
    assert rows["ar"]["tok/s"] == 11.28 and rows["sd"]["tok/s"] == 11.70 and rows["ssd"]["tok/s"] == 8.64
    assert main(["plan", "--placement", "--runs", str(one), str(every)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("measured (this machine") and "SD wins: 1.35× SSD, 1.04× AR tokens/s" in out


def test_a_capacity_plan_still_needs_a_rate(capsys):
    assert main(["plan", "--itl-ms", "50"]) == 2
    assert "needs --rate" in capsys.readouterr().err


def test_compare_forwards_answers_with_and_without_graphs_and_says_what_compiling_buys(tmp_path, capsys):
    out = tmp_path / "forwards.json"
    assert (
        main(
            [
                "plan",
                "--placement",
                "--compare-forwards",
                "--hardware",
                "h100",
                "--pair",
                "llama",
                "--rounds",
                "300",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "graph-captured forwards (--compile on)" in printed and "; eager forwards" in printed
    report = json.loads(out.read_text())
    graphs, eager = (max(r["tok/s"] for r in block["rows"]) for block in report["blocks"])
    assert graphs > 2 * eager  # launches dominate an eager batch-1 forward on a GPU
    assert f"compiling pays {graphs / eager:.2f}×" in report["verdict"]


def test_compare_forwards_refuses_an_engine_that_is_eager_by_definition(capsys):
    assert (
        main(
            [
                "plan",
                "--placement",
                "--compare-forwards",
                "--hardware",
                "h200",
                "--pair",
                "qwen-coder",
                "--engine",
                "saguaro-eager-h200",
            ]
        )
        == 2
    )
    assert "eager by definition" in capsys.readouterr().err
