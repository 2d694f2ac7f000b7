"""Every figure renders from the fixture runs, with labelled axes, a title, and its data beside it."""

from __future__ import annotations

import csv

import matplotlib.pyplot as plt
import pytest

from saguaro.reporting.figures import FIGURES, NoData, render
from saguaro.reporting.figures.sweeps import _crossovers
from saguaro.reporting.report import load_data
from tests.saguaro.conftest import FIXTURES


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
        return {
            "system": "ssd",
            "backup": backup,
            "batch": b,
            "speedup_vs_ar": speedup,
            "run": "r",
            "K": 4,
            "budget": 12,
            "schedule": "uniform",
            "C": 1.0,
            "temperature": 0.0,
        }

    rows = [
        row("neural", 1, 2.0),
        row("neural", 2, 1.6),
        row("neural", 4, 1.2),
        row("random", 1, 1.5),
        row("random", 2, 1.6),
        row("random", 4, 1.4),
    ]
    assert [c["crossover_batch"] for c in _crossovers(rows)] == [2]
    assert _crossovers(rows[:3] + [row("random", b, 1.0) for b in (1, 2, 4)]) == []


# -- reading at a glance: nothing cut or covered, honest axes, spread, unsupported figures skipped --------
from matplotlib.collections import LineCollection  # noqa: E402
from matplotlib.container import ErrorbarContainer  # noqa: E402

from saguaro.reporting.analysis.load import describe  # noqa: E402
from saguaro.reporting.figures.base import DISTURBED_LABEL, ReportData, draw  # noqa: E402

RATIO_FIGURES = ("speedup_vs_k", "speedup_vs_budget", "speedup_vs_c", "speedup_vs_temperature", "speedup_vs_batch")


def _figure(name):
    return next(f for f in FIGURES if f.name == name)


def _texts(fig):
    """Every visible, non-empty text of the figure with its extent in display pixels."""
    renderer = fig.canvas.get_renderer()
    out = [
        (t, t.get_window_extent(renderer))
        for t in fig.findobj(plt.Text)
        if t.get_visible() and t.get_text().strip() and t.get_figure() is not None
    ]
    return out, renderer


def _overlap(a, b, slack=1.0) -> bool:
    return (min(a.x1, b.x1) - max(a.x0, b.x0) > slack) and (min(a.y1, b.y1) - max(a.y0, b.y0) > slack)


@pytest.mark.parametrize("figure", FIGURES, ids=lambda f: f.name)
def test_legend_sits_outside_every_data_area(figure, report_data):
    fig, _ = draw(figure, report_data)
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
        assert legends, "every figure explains its lines"
        for lg in legends:
            box = lg.get_window_extent(renderer)
            for ax in fig.axes:
                assert not _overlap(box, ax.get_window_extent(renderer)), f"legend covers the data of {figure.name}"
    finally:
        plt.close(fig)


@pytest.mark.parametrize("figure", FIGURES, ids=lambda f: f.name)
def test_no_label_overlaps_another_or_leaves_the_saved_image(figure, report_data):
    fig, _ = draw(figure, report_data)
    try:
        fig.canvas.draw()
        texts, renderer = _texts(fig)
        labels = [
            (t, box)
            for t, box in texts
            if t in (fig._suptitle, *(a.xaxis.label for a in fig.axes), *(a.yaxis.label for a in fig.axes))
        ]
        ticks = [
            (t, box)
            for t, box in texts
            if any(t in a.get_xticklabels(which="both") + a.get_yticklabels(which="both") for a in fig.axes)
        ]
        legend_texts = [
            (t, box)
            for t, box in texts
            if any(a.get_legend() is not None and t in a.get_legend().get_texts() for a in fig.axes)
        ]
        for t, box in labels:
            for u, other in labels + ticks + legend_texts:
                if u is not t:
                    assert not _overlap(box, other), f"{t.get_text()!r} overlaps {u.get_text()!r}"
        page = fig.bbox  # the layout fits every text in the figure itself (the tight save then cuts nothing)
        tick_texts = {id(t) for t, _ in ticks}  # (matplotlib keeps labels of ticks outside the view, undrawn)
        for t, box in texts:
            if id(t) in tick_texts:
                continue
            assert box.x0 >= page.x0 - 1 and box.x1 <= page.x1 + 1, f"{t.get_text()!r} leaves the figure sideways"
            assert box.y0 >= page.y0 - 1 and box.y1 <= page.y1 + 1, f"{t.get_text()!r} leaves the figure"
    finally:
        plt.close(fig)


@pytest.mark.parametrize("name", RATIO_FIGURES)
def test_ratio_axes_start_at_zero_with_the_reference_drawn(name, report_data):
    fig, _ = draw(_figure(name), report_data)
    try:
        ax = fig.axes[0]
        assert ax.get_ylim()[0] == 0
        assert any(list(line.get_ydata()) == [1.0, 1.0] for line in ax.get_lines()), "1.0 reference line"
    finally:
        plt.close(fig)


def test_bars_start_at_zero(report_data):
    for name in ("measured_vs_predicted", "phase_breakdown"):
        fig, _ = draw(_figure(name), report_data)
        try:
            assert fig.axes[0].get_xlim()[0] == 0, name
        finally:
            plt.close(fig)
    fig, _ = draw(_figure("acceptance_histogram"), report_data)
    try:
        assert fig.axes[0].get_ylim()[0] == 0
    finally:
        plt.close(fig)


@pytest.mark.parametrize("name", RATIO_FIGURES)
def test_speedups_show_the_per_prompt_spread(name, report_data):
    fig, rows = draw(_figure(name), report_data)
    try:
        ax = fig.axes[0]
        spread_bars = [
            c
            for c in ax.containers
            if isinstance(c, ErrorbarContainer)
            and c.lines[2]
            and isinstance(c.lines[2][0], LineCollection)
            and len(c.lines[2][0].get_segments())
        ]
        assert spread_bars, "an interquartile bar per point"
        measured = [r for r in rows if r.get("prompts")]
        assert measured and all(r["prompt_speedup_p25"] <= r["prompt_speedup_p75"] for r in measured)
        dots = [line for line in ax.get_lines() if line.get_marker() == "." and len(line.get_xdata()) > 1]
        assert dots, "few prompts: each prompt's speedup drawn"
    finally:
        plt.close(fig)


def test_threads_and_cores_are_pluralised():
    assert describe({"machine": {"cpu_model": "X", "usable_cpus": 1, "torch_threads": 1}}) == "X, 1 core, 1 thread"
    assert describe({"machine": {"cpu_model": "X", "usable_cpus": 2, "torch_threads": 2}}) == "X, 2 cores, 2 threads"


def test_a_power_law_is_not_fitted_through_two_fanouts():
    points = [
        {"temperature": 0.0, "fanout": F, "lookups": 100, "misses": m, "miss_rate": m / 100}
        for F, m in ((1, 40), (3, 20))
    ]
    data = ReportData([], [], miss_points=points)
    with pytest.raises(NoData, match="3 or more fan-outs"):
        draw(_figure("miss_vs_fanout"), data)
    from saguaro.reporting.analysis.hits import power_law_fits

    assert power_law_fits(points) == [{"temperature": 0.0, "n_points": 2, "note": power_law_fits(points)[0]["note"]}]
    assert "not fitted" in power_law_fits(points)[0]["note"]


def _sweep_row(system, **kw):
    row = {
        "run": "r",
        "system": system,
        "key": f"{system} {kw}",
        "K": 4,
        "budget": 12,
        "schedule": "uniform",
        "C": 1.0,
        "backup": "neural" if system == "ssd" else None,
        "temperature": 0.0,
        "batch": 1,
        "tokens_per_s": 3.0,
        "speedup_vs_ar": None,
        "prompt_speedups": [],
        "disturbed": 0,
    }
    row.update(kw)
    return row


def test_speedup_vs_k_without_ar_is_relative_to_the_best_k_and_says_why():
    rows = [_sweep_row("sd", K=k, tokens_per_s=t) for k, t in ((2, 3.0), (4, 4.0), (6, 3.5))]
    data = ReportData([], rows)
    fig, plotted = draw(_figure("speedup_vs_k"), data)
    try:
        assert [p["relative_to_best"] for p in plotted] == [0.75, 1.0, 0.875]
        assert "relative to the best K" in fig.axes[0].get_ylabel()
        assert any("No AR run" in note for note in data.notes)
    finally:
        plt.close(fig)


def test_a_crossover_is_not_claimed_with_one_backup():
    rows = [_sweep_row("ssd", batch=b, speedup_vs_ar=s) for b, s in ((1, 2.0), (2, 1.5), (4, 1.2))]
    data = ReportData([], rows)
    fig, plotted = draw(_figure("speedup_vs_batch"), data)
    try:
        assert not [p for p in plotted if p.get("series") == "crossover"]
        assert "overtakes" not in fig._suptitle.get_text()
        assert any("No backup crossover drawn" in note and "neural" in note for note in data.notes)
    finally:
        plt.close(fig)


def test_a_disturbed_point_is_hollow_and_explained():
    rows = [_sweep_row("sd", K=k, speedup_vs_ar=s, disturbed=d) for k, s, d in ((2, 1.2, 0), (4, 1.5, 3))]
    fig, _ = draw(_figure("speedup_vs_k"), ReportData([], rows))
    try:
        ax = fig.axes[0]
        hollow = [
            line
            for line in ax.get_lines()
            if line.get_marker() == "o" and line.get_markerfacecolor() == "white" and len(line.get_xdata()) == 1
        ]
        assert len(hollow) == 1 and hollow[0].get_ydata()[0] == 1.5
        assert DISTURBED_LABEL in [t.get_text() for t in ax.get_legend().get_texts()]
    finally:
        plt.close(fig)


def test_a_serving_curve_needs_two_load_points():
    from saguaro.reporting.figures.serving import SERVING_FIGURES

    row = {
        "load": "rate",
        "rate": 0.5,
        "series": "ssd",
        "run": "r",
        "median_ttft_ms": 10.0,
        "p99_ttft_ms": 20.0,
        "completed": 8,
        "failed": 0,
    }
    ttft = SERVING_FIGURES["rate"][0]
    with pytest.raises(NoData, match="two or more load points"):
        draw(ttft, ReportData([], [], serving=[row]))
    fig, _ = draw(ttft, ReportData([], [], serving=[row, {**row, "rate": 1.0}]))
    try:
        assert fig.axes[0].get_ylim()[0] == 0 and "8 requests at a point" in fig._suptitle.get_text()
    finally:
        plt.close(fig)
