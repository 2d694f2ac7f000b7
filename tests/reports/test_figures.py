"""Every figure renders from the fixture runs, with labelled axes, a title, and its data beside it."""

from __future__ import annotations

import csv

import matplotlib.pyplot as plt
import pytest

from saguaro.figures import FIGURES, NoData, render
from saguaro.figures.sweeps import _crossovers
from saguaro.report import load_data
from tests.reports.conftest import FIXTURES


@pytest.mark.parametrize("figure", FIGURES, ids=lambda f: f.name)
def test_figure_renders_png_and_csv(figure, report_data, tmp_path):
    done = render(figure, report_data, tmp_path)
    assert done.png.stat().st_size > 10_000 and done.png.read_bytes()[:4] == b"\x89PNG"
    with done.data.open() as f:
        rows = list(csv.DictReader(f))
    assert rows and len(rows) == len(done.rows)


@pytest.mark.parametrize("figure", FIGURES, ids=lambda f: f.name)
def test_figure_labels_its_axes_and_says_what_was_measured(figure, report_data):
    fig, ax = plt.subplots()
    try:
        rows = figure.draw(ax, report_data)
        assert rows
        assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title()
    finally:
        plt.close(fig)


def test_title_names_the_models_and_the_machine(report_data, tmp_path):
    done = render(FIGURES[0], report_data, tmp_path)
    assert "synthetic fixture" in report_data.where and "synthetic-1.5b" in report_data.where
    assert done.png.exists()


def test_a_sweep_missing_from_the_runs_is_no_data_with_the_flags_to_add():
    data, _ = load_data([FIXTURES / "runs" / "fanout"])  # one K, one temperature, batch 1
    speedup_vs_k = next(f for f in FIGURES if f.name == "speedup_vs_k")
    fig, ax = plt.subplots()
    try:
        with pytest.raises(NoData, match="--K"):
            speedup_vs_k.draw(ax, data)
    finally:
        plt.close(fig)


def test_crossover_is_the_first_batch_where_the_fast_backup_is_at_least_as_fast():
    def row(backup, b, speedup):
        return {"system": "ssd", "backup": backup, "batch": b, "speedup_vs_ar": speedup, "run": "r", "K": 4,
                "budget": 12, "schedule": "uniform", "C": 1.0, "temperature": 0.0}

    rows = [row("neural", 1, 2.0), row("neural", 2, 1.6), row("neural", 4, 1.2),
            row("random", 1, 1.5), row("random", 2, 1.6), row("random", 4, 1.4)]
    assert [c["crossover_batch"] for c in _crossovers(rows)] == [2]
    assert _crossovers(rows[:3] + [row("random", b, 1.0) for b in (1, 2, 4)]) == []
