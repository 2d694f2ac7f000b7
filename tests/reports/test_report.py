"""`saguaro report` builds the whole Markdown report from the fixture run folders."""

from __future__ import annotations

import re

import pytest

from saguaro.cli import main
from saguaro.figures import FIGURES
from saguaro.report import build_report, load_data
from tests.reports.conftest import FIXTURE_RUNS, FIXTURES


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    return build_report(FIXTURE_RUNS, out).read_text(), out


def test_report_links_every_figure_and_its_data(report):
    text, out = report
    for figure in FIGURES:
        assert f"]({figure.name}.png)" in text and f"({figure.name}.csv)" in text
        assert (out / f"{figure.name}.png").is_file() and (out / f"{figure.name}.csv").is_file()
    assert "_Not drawn" not in text


def test_report_says_the_data_is_synthetic_and_where_it_came_from(report):
    text, _ = report
    assert "**Synthetic data.**" in text
    assert "synthetic fixture (no hardware)" in text
    assert "python -m tests.reports.fixtures.make_fixture k-sweep" in text


def test_report_tables_headline_predictions_and_fit(report):
    text, _ = report
    for heading in ("## Headline", "## Measured vs simulated vs closed form", "## Power-law fit of the miss rate",
                    "## Acceptance by task"):
        assert heading in text
    errors = re.search(r"Mean absolute error: simulated (\S+) over (\d+) variants, closed form (\S+)", text)
    assert errors and int(errors.group(2)) > 10


def test_closed_form_and_simulation_use_the_runs_own_measurements():
    data, notes = load_data(FIXTURE_RUNS)
    assert not notes
    sd = next(p for p in data.predictions if p["system"] == "sd")
    ssd = next(p for p in data.predictions if p["system"] == "ssd")
    assert 0 < sd["alpha"] < 1 and sd["T_d_over_T_v"] > 0
    assert 0 < ssd["p_hit"] <= 1 and ssd["T_p"] > 0
    for p in data.predictions:  # the fitted simulator replays each run: it should land near the measurement
        assert abs(p["simulated_error"]) < 0.6 and p["closed_form"] > 0


def test_cli_writes_the_report_beside_the_first_run_by_default(tmp_path, capsys):
    out = tmp_path / "rep"
    assert main(["report", str(FIXTURES / "runs" / "fanout"), "--out", str(out)]) == 0
    text = (out / "report.md").read_text()
    assert "speedup_vs_budget.png" in text and "_Not drawn: needs speculative runs at two or more K" in text


def test_cli_refuses_a_folder_that_is_not_a_run(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "not a bench run folder" in capsys.readouterr().err
