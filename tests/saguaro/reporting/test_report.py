"""`saguaro report` builds the whole Markdown report from the fixture run folders."""

from __future__ import annotations

import re

import pytest

from saguaro.cli import main
from saguaro.reporting.figures import FIGURES
from saguaro.reporting.report import build_report, load_data
from tests.saguaro.conftest import FIXTURE_RUNS, FIXTURES


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
    assert "python -m tests.saguaro.fixtures.make_fixture k-sweep" in text


def test_report_tables_headline_predictions_and_fit(report):
    text, _ = report
    for heading in (
        "## Headline",
        "## Measured vs simulated vs closed form",
        "## Power-law fit of the miss rate",
        "## Acceptance by task",
    ):
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


def test_an_unsupported_figure_is_skipped_with_the_reason_in_the_report(tmp_path):
    text = build_report([FIXTURES / "runs" / "batch"], tmp_path).read_text()  # misses at one fan-out only
    assert "_Not drawn: a power law a·F^(−r) has two parameters, so it needs misses at 3 or more fan-outs" in text
    assert not (tmp_path / "miss_vs_fanout.png").exists()


def test_a_disturbed_run_is_marked_in_the_table_and_the_figures(tmp_path):
    import shutil

    from saguaro.bench.runfolder import RunDir
    from saguaro.reporting.figures.base import HATCH, draw

    run = tmp_path / "k-sweep"
    shutil.copytree(FIXTURES / "runs" / "k-sweep", run)
    data, _ = load_data([run])
    key = next(r["key"] for r in data.rows if r["system"] == "ssd")
    RunDir(run).mark_disturbed("a debugging job ran on the worker's core", keys=[key])
    text = build_report([run], tmp_path / "out").read_text()
    assert f"| {key} † |" in text
    assert f"† `{key}`: " in text and "a debugging job ran on the worker's core" in text
    data, _ = load_data([run])
    assert [r["key"] for r in data.rows if r["disturbed"]] == [key]
    phases = next(f for f in FIGURES if f.name == "phase_breakdown")
    fig, _ = draw(phases, data)
    try:
        hatched = [p for p in fig.axes[0].patches if p.get_hatch() == HATCH and p.get_width() > 0]
        assert hatched and len(hatched) == 4  # the disturbed variant's four phase segments
        assert any(f"{key} †" == t.get_text() for t in fig.axes[0].get_yticklabels())
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def test_a_malformed_disturbance_file_says_how_to_write_it(tmp_path):
    import shutil

    run = tmp_path / "k-sweep"
    shutil.copytree(FIXTURES / "runs" / "k-sweep", run)
    (run / "disturbed.json").write_text('{"disturbed": [{"keys": null}]}')
    with pytest.raises(ValueError, match="malformed.*reason"):
        load_data([run])


def test_each_ssd_variant_is_set_against_cor9_ceiling_from_its_own_runs_sd_rounds(report):
    from saguaro.reporting.analysis import rounds as R
    from saguaro.reporting.analysis.predict import ceiling_rows

    data, _ = load_data(FIXTURE_RUNS)
    rows = ceiling_rows(data.runs, data.rows)
    assert rows and all(r["sd_key"].startswith("sd ") for r in rows)
    for r in rows:
        run = next(run for run in data.runs if run.name == r["run"])
        ssd, sd = (
            next(v for v in data.rows if v["run"] == r["run"] and v["key"] == k) for k in (r["key"], r["sd_key"])
        )
        assert ssd["K"] == sd["K"] and ssd["temperature"] == sd["temperature"] and ssd["batch"] == sd["batch"]
        T_sd = R.timings(run.rounds_of(sd["key"])).draft_ms / R.timings(run.rounds_of(ssd["key"])).verify_ms
        assert r["T_sd"] == pytest.approx(T_sd) and r["E_hit"] >= 1 and r["E_sd"] >= 1
        assert r["ceiling"] == pytest.approx((1 + T_sd) * r["E_hit"] / r["E_sd"])
        assert r["share"] == pytest.approx(ssd["decode_tokens_per_s"] / sd["decode_tokens_per_s"] / r["ceiling"])
    assert "## SSD against its Cor. 9 ceiling" in report[0]
