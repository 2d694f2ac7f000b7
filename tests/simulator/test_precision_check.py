"""A calibration predicts the precision it timed: simulate --fit/--level and saguaro validate refuse a run or
another calibration that states another dtype or low-bit scheme (dtype auto resolves per machine, so a bfloat16
calibration beside a float32 run is easy to make), and compare older files on what they state."""

import json
from pathlib import Path

import pytest

from saguaro.calibration.files import check_same_precision, precision
from saguaro.cli import main
from tests.simulator.synthetic import engine_run, write_jsonl

CALIBRATED = {
    "target": "qwen-coder-1.5b",
    "draft": "qwen-coder-0.5b",
    "dtype": "bfloat16",
    "draft_int8": True,
    "target_quant": None,
    "target_head_quant": None,
    "draft_quant": "int8-dynamic",
    "draft_head_quant": None,
    "quant_group_size": 32,
    "threads": 1,
}
BENCH = {
    "target": "qwen-coder-1.5b",
    "draft": "qwen-coder-0.5b",
    "dtype": "bfloat16",
    "draft_dtype": None,
    "draft_int8": True,
    "target_quant": None,
    "draft_quant": None,
    "quant_group_size": 32,
    "target_head_quant": None,
    "draft_head_quant": None,
}


def calibration(folder: Path, **inputs) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = write_jsonl(
        folder / "cal.jsonl",
        engine_run("sd", 2, 1, 60),
        engine_run("sd", 4, 2, 60, seed=1),
        engine_run("ar", 0, 2, 40, seed=2),
    )
    (folder / "cal.summary.json").write_text(json.dumps({"inputs": {**CALIBRATED, **inputs}}))
    return path


def sd_run(folder: Path, **config) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**BENCH, **config}))
    return write_jsonl(folder / "rounds.jsonl", engine_run("sd", 3, 1, 80, seed=3))


def test_a_calibrations_inputs_and_a_bench_config_of_one_recipe_state_the_same_precision():
    # draft_int8 in the bench config is draft_quant int8-dynamic in calibrate's inputs, whose float parts are fp32
    assert (
        precision(CALIBRATED)
        == precision(BENCH)
        == {
            "dtype": "bfloat16",
            "draft_dtype": "float32",
            "target_quant": None,
            "draft_quant": "int8-dynamic",
            "target_head_quant": None,
            "draft_head_quant": None,
        }
    )
    assert precision({**BENCH, "target_quant": "int4"})["quant_group_size"] == 32  # int4 groups
    assert precision({"target": "t"}) == {}  # a file that does not state its dtype states nothing


def test_simulate_levels_a_run_of_the_calibrated_precision(tmp_path, capsys):
    cal, run = calibration(tmp_path / "c"), sd_run(tmp_path / "r")
    assert main(["simulate", "--fit", str(cal), "--level", str(run), "--strategy", "sd", "--rounds", "200"]) == 0


@pytest.mark.parametrize(
    "change, named",
    [
        ({"dtype": "float32"}, "dtype float32 (not bfloat16)"),
        ({"draft_int8": False}, "draft_quant None (not int8-dynamic)"),
        ({"target_quant": "int4"}, "target_quant int4 (not None)"),
    ],
)
def test_simulate_refuses_a_run_of_another_precision_in_one_line(change, named, tmp_path, capsys):
    cal, run = calibration(tmp_path / "c"), sd_run(tmp_path / "r", **change)
    assert main(["simulate", "--fit", str(cal), "--level", str(run), "--strategy", "sd", "--rounds", "200"]) == 2
    err = capsys.readouterr().err
    assert named in err and "calibrate again with the runs' --dtype" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_two_calibrations_of_different_dtypes_are_not_fitted_as_one(tmp_path):
    with pytest.raises(ValueError, match=r"dtype float32 \(not bfloat16\)"):
        check_same_precision([calibration(tmp_path / "a"), calibration(tmp_path / "b", dtype="float32")])
    check_same_precision([calibration(tmp_path / "c"), calibration(tmp_path / "d")])  # one precision: fine


def test_files_that_state_no_precision_are_not_refused(tmp_path):
    old = write_jsonl(tmp_path / "old.jsonl", engine_run("sd", 2, 1, 60))  # no summary, no config: nothing stated
    check_same_precision([old], [sd_run(tmp_path / "r", dtype="float32")])
    check_same_precision([calibration(tmp_path / "c")], [old])
