"""scripts/validation_audit.py: every committed held-out validation predicted again with today's simulator."""

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import validation_audit  # noqa: E402


@pytest.mark.parametrize("r", validation_audit.SETS, ids=lambda r: r.name)
def test_every_round_names_runs_and_calibrations_that_are_committed(r):
    runs = validation_audit.paths(r.runs)
    assert all((Path(run) / "rounds.jsonl").is_file() for run in runs)
    assert all(Path(c).is_file() for c in validation_audit.paths(r.calibrations + r.served_calibrations))
    if r.served is not None:
        base = validation_audit.REPORT / r.served
        assert list((base / "serving").glob("*-serve-ssd-rates")) and list(base.glob("*-sd-reference-served"))
        assert (base / "serving" / "serve-ssd-8-rounds.jsonl").is_file()


def test_a_missing_run_is_named():
    with pytest.raises(FileNotFoundError, match="stop99/runs/"):
        validation_audit.paths(("stop99/runs/*-b2",))


def test_the_summary_counts_what_the_validation_wrote(tmp_path, capsys):
    out = tmp_path / "audit"
    assert validation_audit.main(["--out", str(out), "--only", "stop35", "--rounds", "300",
                                  "--markdown", str(tmp_path / "t.md")]) == 0
    table = json.loads((out / "stop35-engine.json").read_text())
    held_out = [row for row in table["rows"] if not row["reference"]]
    within = sum(abs(row["error"]) <= 0.10 for row in held_out)
    text = capsys.readouterr().out
    assert re.search(rf"\| stop35 \| AMD EPYC, AVX2 \| ×[0-9.]+-[0-9.]+ \| {within} of {len(held_out)} \(median", text)
    assert text.count("| stop35 | ") == 1 + len(held_out)  # the summary's line and one per held-out row
    assert (tmp_path / "t.md").read_text() == text.rstrip("\n") + "\n"


def test_an_unknown_round_exits_2_with_the_known_ones(tmp_path, capsys):
    assert validation_audit.main(["--out", str(tmp_path), "--only", "stop99"]) == 2
    assert "unknown round(s) stop99; known: stop26 stop26b stop30" in capsys.readouterr().err


def test_a_round_whose_runs_are_missing_is_one_line_and_exit_1(tmp_path, capsys, monkeypatch):
    gone = validation_audit.Round("gone", ("stop99/runs/*-b2",), ("stop99/calibration.jsonl",))
    monkeypatch.setattr(validation_audit, "SETS", (gone,))
    assert validation_audit.main(["--out", str(tmp_path)]) == 1
    assert "validation_audit: gone: no run matches stop99/runs/*-b2" in capsys.readouterr().err
