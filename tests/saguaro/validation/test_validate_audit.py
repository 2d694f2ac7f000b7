"""`saguaro validate audit`: every committed held-out set (reports/*/manifest.json) predicted again with today's
simulator, its runs unpacked from the study's archives."""

import json
import re
import shutil
from pathlib import Path

import pytest

from saguaro.cli import main
from saguaro.validation import studies
from saguaro.validation.audit import choose

SETS = studies.held_out_sets()
AVX2_SET = "2026-12-03-avx2-1404"  # five held-out rows: the quickest set


@pytest.mark.parametrize("held_out", SETS, ids=lambda s: s.name)
def test_every_set_names_runs_and_calibrations_in_its_studys_archives(held_out, held_out_runs):
    root = studies.unpack(studies.REPORTS, held_out.study, held_out_runs.parent)  # unpacked once a session
    runs = studies.paths(root, held_out.runs)
    assert all((run / "rounds.jsonl").is_file() and (run / "results.jsonl").is_file() for run in runs)
    served = held_out.served
    calibrations = held_out.calibrations + (served.calibrations if served else ())
    assert all(
        path.is_file() and path.with_suffix(".summary.json").is_file() for path in studies.paths(root, calibrations)
    )
    if served is not None:
        assert all((run / "requests.jsonl").is_file() for run in studies.paths(root, served.client_runs))
        assert len(studies.paths(root, (served.sd_run,))) == 1
        assert len(studies.paths(root, (served.server_rounds,))) == 1


def test_each_study_has_a_readme_and_its_archives_are_small():
    for study in studies.manifests():
        assert (studies.REPORTS / study / "README.md").is_file(), study
        assert all(a.stat().st_size < 1_000_000 for a in studies.archives(studies.REPORTS, study)), study


def test_a_missing_run_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no run matches 2026-01-01/runs/"):
        studies.paths(tmp_path, ("2026-01-01/runs/*-b2",))


def test_the_summary_counts_what_the_validation_wrote(tmp_path, capsys):
    out = tmp_path / "audit"
    assert (
        main(
            [
                "validate",
                "audit",
                "--out",
                str(out),
                "--only",
                AVX2_SET,
                "--rounds",
                "300",
                "--markdown",
                str(tmp_path / "t.md"),
                "--figure",
                str(tmp_path / "t.png"),
            ]
        )
        == 0
    )
    table = json.loads((out / f"{AVX2_SET}-engine.json").read_text())
    held_out = [row for row in table["rows"] if not row["reference"]]
    within = sum(abs(row["error"]) <= 0.10 for row in held_out)
    text = capsys.readouterr().out
    assert re.search(
        rf"\| {AVX2_SET} \| AMD EPYC \(Zen 3\), 2 cores, AVX2 only \(float32 target\) \| "
        rf"×[0-9.]+-[0-9.]+ \| {within} of {len(held_out)} \(median",
        text,
    )
    assert text.count(f"| {AVX2_SET} | ") == 1 + len(held_out)  # the summary's line and one per held-out row
    assert f"| steady (1 sets) | {within} of {len(held_out)} " in text and "| all (1 sets) | " in text
    assert (tmp_path / "t.md").read_text() == text
    assert (tmp_path / "t.png").read_bytes().startswith(b"\x89PNG")


def test_an_unknown_set_exits_2_with_the_known_ones(tmp_path, capsys):
    assert main(["validate", "audit", "--out", str(tmp_path), "--only", "2026-01-01-nowhere"]) == 2
    err = capsys.readouterr().err
    assert f"unknown held-out set(s) 2026-01-01-nowhere; known: {SETS[0].name} {SETS[1].name}" in err
    assert len(err.strip().splitlines()) == 1


def test_a_set_whose_runs_are_missing_is_one_line_and_exit_2(tmp_path, capsys):
    """A study whose manifest names a run its archives lack: the set and the missing pattern, no traceback."""
    reports = tmp_path / "reports"
    study = reports / "2026-12-cpu-broken"
    (study / "data").mkdir(parents=True)
    source = next(s for s in SETS if s.name == AVX2_SET)
    shutil.copy(studies.REPORTS / source.study / "data" / f"{AVX2_SET}.tar.gz", study / "data")
    entry = {
        "name": "gone",
        "host": "AMD EPYC",
        "host_speed": "steady",
        "runs": [f"{AVX2_SET}/runs/*-b9"],
        "calibrations": [f"{AVX2_SET}/runs/calibration.jsonl"],
    }
    (study / "manifest.json").write_text(json.dumps({"title": "broken", "held_out": [entry]}))
    assert main(["validate", "audit", "--reports", str(reports), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "saguaro validate: error: gone: no run matches 2026-12-03-avx2-1404/runs/*-b9" in err
    assert len(err.strip().splitlines()) == 1


def test_choosing_nothing_from_no_sets_says_so():
    with pytest.raises(ValueError, match="no study under reports/ has held-out sets"):
        choose([], None)


def test_a_manifest_with_an_unknown_host_speed_is_refused(tmp_path):
    study = tmp_path / "2026-12-cpu-odd"
    study.mkdir()
    entry = {"name": "x", "host_speed": "wobbly", "runs": ["a/runs/*"], "calibrations": ["a/c.jsonl"]}
    (study / "manifest.json").write_text(json.dumps({"held_out": [entry]}))
    with pytest.raises(ValueError, match="host_speed must be one of steady, drifting"):
        studies.held_out_sets(Path(tmp_path))
