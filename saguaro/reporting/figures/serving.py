"""Figures of client runs (saguaro bench --url): latency and throughput against the offered load.

One line per system (the runs' --label), p50 solid and p99 dashed in the same colour. The load is the
open-loop request rate (log axis; "all at once" drawn right of the highest finite rate) or the closed-loop
concurrency. Rows come from saguaro.reporting.analysis.serving.point_rows, in ReportData.serving.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from matplotlib.axes import Axes
from matplotlib.ticker import NullLocator

from saguaro.reporting.figures.base import Figure, NoData, ReportData, legend, mark_disturbed_legend

NAMES = {
    "ttft": "Time to first token (TTFT)",
    "tpot": "Time per output token (TPOT)",
    "itl": "Inter-token latency (ITL, per streamed chunk)",
    "e2el": "End-to-end latency (E2EL)",
}
X_LABELS = {
    "rate": "offered request rate (requests/s, Poisson arrivals)",
    "concurrency": "concurrency (requests in flight, closed loop)",
}
LOADS = {"rate": "request rate", "concurrency": "concurrency"}
INF_LABEL = "inf"


def _points(data: ReportData, load: str) -> dict[str, list[dict]]:
    rows = [r for r in data.serving if r["load"] == load]
    if not rows:
        raise NoData(f"needs client runs with --{load} (saguaro bench --url URL --{load} ...)")
    series: dict[str, list[dict]] = {}
    for r in rows:
        series.setdefault(r["series"], []).append(r)
    if all(len({r[load] for r in rs}) < 2 for rs in series.values()):
        raise NoData(
            f"a curve against the {LOADS[load]} needs two or more load points in one run; each run here "
            f"has one (e.g. --{load} {'0.1 0.4 inf' if load == 'rate' else '1 4 8'})"
        )
    return {label: sorted(rs, key=lambda r: r[load]) for label, rs in series.items()}


def _x_positions(rows: list[dict], load: str) -> dict[float, float]:
    """Where each load value sits on the x axis: itself, except an infinite rate (twice the largest finite)."""
    values = sorted({r[load] for r in rows})
    finite = [v for v in values if not math.isinf(v)]
    inf_at = 2 * max(finite) if finite else 1.0
    return {v: inf_at if math.isinf(v) else v for v in values}


def _x_axis(ax: Axes, positions: dict[float, float], load: str) -> None:
    ax.set_xscale("log")
    ax.xaxis.set_minor_locator(NullLocator())
    ticks = sorted(positions.items(), key=lambda item: item[1])
    ax.set_xticks([at for _, at in ticks], [INF_LABEL if math.isinf(v) else f"{v:g}" for v, _ in ticks])
    ax.set_xlabel(X_LABELS[load] + (" (inf: all at once)" if any(map(math.isinf, positions)) else ""))
    ax.grid(True, alpha=0.3)


def _value(v) -> float:
    return math.nan if v is None else v


def _hollow(ax: Axes, xs: list[float], rows: list[dict], field: str, marker: str, size: float, color) -> None:
    """Over the line's own marker, a hollow one where the run marked the point's requests as disturbed."""
    for x, r in zip(xs, rows, strict=True):
        if r.get("disturbed"):
            ax.plot([x], [_value(r[field])], marker, ms=size + 1, color=color, mfc="white", zorder=3)


def _against_load(
    ax: Axes,
    data: ReportData,
    load: str,
    ylabel: str,
    draw_series: Callable[[Axes, str, list[float], list[dict]], list[dict]],
) -> tuple[dict[str, list[dict]], list[dict]]:
    """What the serving figures share: `draw_series(ax, label, xs, rows)` once per system (it returns the rows
    it plotted), then the load axis, y from 0 and the legend. Returns the rows by system, and those plotted."""
    series = _points(data, load)
    positions = _x_positions([r for rs in series.values() for r in rs], load)
    plotted = []
    for label, rs in series.items():
        plotted += draw_series(ax, label, [positions[r[load]] for r in rs], rs)
    _x_axis(ax, positions, load)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    mark_disturbed_legend(ax, any(r.get("disturbed") for rs in series.values() for r in rs))
    legend(ax)
    return series, plotted


def _plotted(label: str, load: str, r: dict, values: dict) -> dict:
    """One plotted point as the figure's data file has it: system, run, load, `values`, then the request counts."""
    return {
        "series": label,
        "run": r["run"],
        load: r[load],
        **values,
        "completed": r["completed"],
        "failed": r["failed"],
        "disturbed": r.get("disturbed", 0),
    }


def latency_vs(load: str, metric: str) -> Callable[[Axes, ReportData], list[dict]]:
    """A figure function: the metric's p50 and p99 against the load, one colour per system."""
    p50, p99 = f"median_{metric}_ms", f"p99_{metric}_ms"

    def draw_series(ax: Axes, label: str, xs: list[float], rs: list[dict]) -> list[dict]:
        line = ax.plot(xs, [_value(r[p50]) for r in rs], "-o", ms=4, label=f"{label} p50")
        color = line[0].get_color()
        ax.plot(xs, [_value(r[p99]) for r in rs], "--s", ms=3, color=color, label=f"{label} p99")
        _hollow(ax, xs, rs, p50, "o", 4, color)
        _hollow(ax, xs, rs, p99, "s", 3, color)
        return [_plotted(label, load, r, {f"p50_{metric}_ms": r[p50], p99: r[p99]}) for r in rs]

    def draw(ax: Axes, data: ReportData) -> list[dict]:
        series, plotted = _against_load(ax, data, load, f"{metric.upper()} (ms)", draw_series)
        fewest = min((r["completed"] for rs in series.values() for r in rs), default=0)
        few = 0 < fewest < 100 and metric != "itl"  # ITL pools every chunk gap: many samples
        small = f"; {fewest} requests at a point: its p99 is about the slowest" if few else ""
        ax.set_title(f"{NAMES[metric]}: p50 (solid) and p99 (dashed) against the {LOADS[load]}{small}")
        return plotted

    return draw


def throughput_vs(load: str) -> Callable[[Axes, ReportData], list[dict]]:
    """A figure function: output tokens/s achieved against the load, one line per system."""

    def draw_series(ax: Axes, label: str, xs: list[float], rs: list[dict]) -> list[dict]:
        line = ax.plot(xs, [_value(r["output_tokens_per_s"]) for r in rs], "-o", ms=4, label=label)
        _hollow(ax, xs, rs, "output_tokens_per_s", "o", 4, line[0].get_color())
        return [
            _plotted(
                label, load, r, {"output_tokens_per_s": r["output_tokens_per_s"], "requests_per_s": r["requests_per_s"]}
            )
            for r in rs
        ]

    def draw(ax: Axes, data: ReportData) -> list[dict]:
        _, plotted = _against_load(ax, data, load, "output throughput (generated tokens/s)", draw_series)
        ax.set_title(f"Output throughput against the {LOADS[load]}")
        return plotted

    return draw


def serving_figures(load: str) -> tuple[Figure, ...]:
    """TTFT, TPOT and ITL (p50 and p99) and throughput against one kind of load."""
    what = LOADS[load]
    return (
        Figure(f"ttft_vs_{load}", f"Time to first token, p50 and p99, against the {what}.", latency_vs(load, "ttft")),
        Figure(f"tpot_vs_{load}", f"Time per output token, p50 and p99, against the {what}.", latency_vs(load, "tpot")),
        Figure(
            f"itl_vs_{load}",
            f"Inter-token latency (gap between streamed chunks), p50 and p99, against the {what}.",
            latency_vs(load, "itl"),
        ),
        Figure(f"throughput_vs_{load}", f"Output tokens/s against the {what}.", throughput_vs(load)),
    )


SERVING_FIGURES: dict[str, tuple[Figure, ...]] = {load: serving_figures(load) for load in ("rate", "concurrency")}
