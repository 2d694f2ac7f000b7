"""The audit's figure: every held-out engine row's predicted decode tokens/s over its measured one, with the
±10% band, steady and drifting hosts apart (`saguaro validate audit --figure PATH`)."""

from __future__ import annotations

from pathlib import Path

from saguaro.validation.audit import SetResult
from saguaro.validation.engine import TOLERANCE

MARKERS = {"ar": "s", "sd": "^", "ssd": "o"}
COLOURS = {"steady": "tab:blue", "drifting": "tab:orange"}


def predicted_vs_measured(ax, results: list[SetResult]) -> int:
    """Plot one point per held-out row (each run's configuration once); returns how many."""
    seen, points = set(), 0
    low, high = float("inf"), 0.0
    for r in results:
        for row in r.engine_rows:
            if (row["run"], row["configuration"]) in seen:
                continue
            seen.add((row["run"], row["configuration"]))
            strategy = row["configuration"].split()[0]
            ax.scatter(
                row["measured"],
                row["predicted"],
                s=18,
                marker=MARKERS.get(strategy, "o"),
                color=COLOURS[r.held_out.host_speed],
                alpha=0.75,
                linewidths=0,
            )
            low, high = min(low, row["measured"], row["predicted"]), max(high, row["measured"], row["predicted"])
            points += 1
    if not points:
        return 0
    line = [low * 0.9, high * 1.1]
    ax.plot(line, line, color="black", linewidth=0.8)
    ax.fill_between(
        line,
        [v * (1 - TOLERANCE) for v in line],
        [v * (1 + TOLERANCE) for v in line],
        color="grey",
        alpha=0.15,
        linewidth=0,
        label=f"±{TOLERANCE:.0%}",
    )
    for speed, colour in COLOURS.items():
        ax.scatter([], [], color=colour, s=18, label=f"{speed} host")
    for strategy, marker in MARKERS.items():
        ax.scatter([], [], color="grey", marker=marker, s=18, label=strategy.upper())
    from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator, StrMethodFormatter

    ticks = [t for t in (0.5, 1, 2, 3, 5, 10, 20, 30, 50, 100, 200) if line[0] <= t <= line[1]]
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(FixedLocator(ticks))
        axis.set_major_formatter(StrMethodFormatter("{x:g}"))
        axis.set_minor_locator(NullLocator())
        axis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("measured decode tokens/s")
    ax.set_ylabel("predicted decode tokens/s")
    ax.legend(fontsize=8, loc="upper left")
    return points


def save(results: list[SetResult], path: Path) -> int:
    """The figure as a PNG at `path`; returns the number of points drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 5.0))
    try:
        points = predicted_vs_measured(ax, results)
        ax.set_title(f"Held-out configurations predicted from a calibration ({points})", fontsize=10)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
    return points
