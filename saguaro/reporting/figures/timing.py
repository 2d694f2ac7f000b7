"""Where the time goes and what it buys: per-phase breakdown, latency/throughput frontier, and measured vs
simulated vs closed-form speedup."""

from __future__ import annotations

import numpy as np
from matplotlib.axes import Axes

from saguaro.reporting.analysis import rounds as R
from saguaro.reporting.figures.base import (
    DAGGER,
    DISTURBED_LABEL,
    HATCH,
    NoData,
    ReportData,
    legend,
    mark_disturbed_legend,
    series_of,
)

PHASE_LABELS = {
    "prefill": "prefill",
    "verify": "target forward (verify / decode)",
    "draft": "draft on the critical path (SD drafting, SSD wait)",
    "other": "other (sampling, bookkeeping)",
}


def _label(r: dict, runs: int) -> str:
    return (r["key"] if runs == 1 else f"{r['key']} [{r['run']}]") + (f" {DAGGER}" if r.get("disturbed") else "")


def _hatch_legend(ax: Axes, any_disturbed: bool) -> None:
    if any_disturbed:
        ax.bar([0], [0], width=0, color="white", edgecolor="black", hatch=HATCH, label=DISTURBED_LABEL)


def breakdown_size(data: ReportData) -> tuple[float, float]:
    n = sum(1 for r in data.rows if r["system"] in ("ar", "sd", "ssd"))
    return 10.0, max(3.5, 1.5 + 0.28 * n)


def phase_breakdown(ax: Axes, data: ReportData) -> list[dict]:
    """Critical-path ms per generated token, split by phase, for every variant with round records."""
    by_name = {run.name: run for run in data.runs}
    plotted = []
    for r in data.rows:
        calls = by_name[r["run"]].rounds_of(r["key"])
        if not calls:
            continue
        ms = R.phase_ms(calls)
        per_token = {p: ms[p] / ms["tokens"] for p in R.PHASES} if ms["tokens"] else None
        if per_token:
            plotted.append(
                {
                    "key": _label(r, len(data.runs)),
                    "run": r["run"],
                    **{f"{p}_ms_per_token": v for p, v in per_token.items()},
                    "hidden_cache_build_ms_per_token": ms["hidden_cache_build"] / ms["tokens"],
                    "tokens": ms["tokens"],
                    "disturbed": r.get("disturbed", 0),
                }
            )
    if not plotted:
        raise NoData("needs runs of this engine (ar, sd or ssd) with per-round records")
    y = np.arange(len(plotted))
    left = np.zeros(len(plotted))
    for p in R.PHASES:
        values = np.array([row[f"{p}_ms_per_token"] for row in plotted])
        bars = ax.barh(y, values, left=left, label=PHASE_LABELS[p])
        for bar, row in zip(bars, plotted, strict=True):
            if row["disturbed"]:
                bar.set_hatch(HATCH)
        left += values
    ax.set_yticks(y, [row["key"] for row in plotted], fontsize=7)
    ax.set_ylabel("variant (system and settings)")
    ax.invert_yaxis()
    ax.set_xlim(left=0)
    ax.set_xlabel("time per generated token (ms), summed over the batch's rounds")
    _hatch_legend(ax, any(row["disturbed"] for row in plotted))
    legend(ax)
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_title("Per-phase time breakdown (critical path; SSD's cache build is hidden, in the CSV)")
    return plotted


def _pareto(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points no other point beats on both throughput (higher) and latency (lower), by throughput."""
    best, front = float("inf"), []
    for x, y in sorted(points, key=lambda p: (-p[0], p[1])):
        if y < best:
            front.append((x, y))
            best = y
    return sorted(front)


def latency_throughput(ax: Axes, data: ReportData) -> list[dict]:
    rows = [r for r in data.rows if r["tokens_per_s"] and r["ms_per_token"]]
    series = series_of(rows, "batch", min_points=2)
    if not series:
        raise NoData("needs runs at two or more batch sizes (--batch-size 1 2 4)")
    plotted = []
    for label, rs in series.items():
        line = ax.plot([r["tokens_per_s"] for r in rs], [r["ms_per_token"] for r in rs], "-", label=label)
        for r in rs:
            ax.plot(
                [r["tokens_per_s"]],
                [r["ms_per_token"]],
                "o",
                ms=4,
                color=line[0].get_color(),
                mfc="white" if r.get("disturbed") else line[0].get_color(),
            )
            ax.annotate(
                f"b={r['batch']}",
                (r["tokens_per_s"], r["ms_per_token"]),
                fontsize=6,
                color=line[0].get_color(),
                xytext=(3, 3),
                textcoords="offset points",
            )
            plotted.append(
                {
                    "series": label,
                    "key": r["key"],
                    "run": r["run"],
                    "batch": r["batch"],
                    "tokens_per_s": r["tokens_per_s"],
                    "ms_per_token": r["ms_per_token"],
                    "disturbed": r.get("disturbed", 0),
                }
            )
    front = _pareto([(r["tokens_per_s"], r["ms_per_token"]) for rs in series.values() for r in rs])
    ax.plot(*zip(*front, strict=True), "k--", lw=1, label="frontier (no point is faster and lower-latency)")
    for x, y in front:
        plotted.append({"series": "frontier", "tokens_per_s": x, "ms_per_token": y})
    ax.set_xlabel("throughput (generated tokens/s, whole batch)")
    ax.set_ylabel("latency (ms per generated token, per sequence)")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    mark_disturbed_legend(ax, any(r.get("disturbed") for rs in series.values() for r in rs))
    legend(ax)
    ax.set_title("Latency vs throughput across batch sizes (lower right is better)")
    return plotted


def compare_size(data: ReportData) -> tuple[float, float]:
    return 10.0, max(3.5, 1.5 + 0.32 * len(data.predictions))


def measured_vs_predicted(ax: Axes, data: ReportData) -> list[dict]:
    rows = [p for p in data.predictions if p["measured"] is not None]
    if not rows:
        raise NoData("needs sd or ssd runs with an AR baseline at the same temperature and batch size")
    y = np.arange(len(rows))
    height = 0.27
    for i, (field, label) in enumerate(
        (
            ("measured", "measured"),
            ("simulated", "simulated (fitted SimPy model)"),
            ("closed_form", "closed form (theory)"),
        )
    ):
        values = np.array([np.nan if r[field] is None else r[field] for r in rows])
        bars = ax.barh(y + (i - 1) * height, values, height, label=label)
        for bar, r in zip(bars, rows, strict=True):
            if r.get("disturbed"):
                bar.set_hatch(HATCH)
        if field != "measured":
            for bar, r in zip(bars, rows, strict=True):
                if r[f"{field}_error"] is not None:
                    ax.annotate(
                        f"{r[f'{field}_error']:+.0%}",
                        (bar.get_width(), bar.get_y() + bar.get_height() / 2),
                        fontsize=5,
                        va="center",
                        xytext=(2, 0),
                        textcoords="offset points",
                    )
    ax.axvline(1.0, color="grey", lw=0.8, ls=":")
    several = len({r["run"] for r in rows}) > 1
    ax.set_yticks(y, [_label(r, 2 if several else 1) for r in rows], fontsize=6)
    ax.set_ylabel("variant (system and settings)")
    ax.invert_yaxis()
    ax.set_xlim(left=0)
    ax.set_xlabel("decode speedup over AR (×), same temperature and batch size; dotted: 1×")
    ax.grid(True, axis="x", alpha=0.3)
    _hatch_legend(ax, any(r.get("disturbed") for r in rows))
    legend(ax)
    ax.set_title("Measured vs simulated vs closed-form speedup (labels: relative error of each prediction)")
    return [dict(r) for r in rows]
