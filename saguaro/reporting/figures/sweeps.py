"""Speedup over AR along one sweep axis: K, fan-out budget, C, temperature, batch size.

Each point is the ratio of totals (Σ tokens / Σ wall time over AR's); its error bar spans the per-prompt
speedups' interquartile range, and the per-prompt speedups are drawn as small dots where there are few
(`POINTS_UP_TO` or fewer prompts). A point from a disturbed run is hollow.
"""

from __future__ import annotations

from itertools import pairwise

import numpy as np
from matplotlib.axes import Axes

from saguaro.reporting.figures.base import (
    AXIS_LABELS,
    NoData,
    ReportData,
    legend,
    mark_disturbed_legend,
    plain_log_ticks,
    series_of,
    speedup_axis,
)

Y = "speedup_vs_ar"
RELATIVE = "relative_to_best"  # throughput over the best K's, when no AR ran
POINTS_UP_TO = 20
NO_AR = "no AR baseline at the same temperature and batch size (add ar to --systems)"


def _offsets(n: int, x_values: list[float], log: bool) -> list[float]:
    """Small horizontal shifts ("dodge") so that the lines' per-prompt dots and error bars do not sit on each
    other; on a log axis, in powers of two."""
    if n <= 1:
        return [0.0]
    xs = sorted(set(x_values))
    step = min((b - a for a, b in pairwise(xs)), default=1.0) if not log else 0.0
    width = (0.1 if log else 0.12 * step) if len(xs) > 1 else 0.1
    return list(np.linspace(-width / 2, width / 2, n))


def _lines(ax: Axes, rows: list[dict], x: str, y: str, need: str, log_x: bool = False) -> tuple[list[dict], dict]:
    """One line per series with two or more x values; NoData if there is none. Returns the plotted
    rows and each series' rows and colour."""
    series = series_of([r for r in rows if r.get(y) is not None and r.get(x) is not None], x, min_points=2)
    if not series:
        raise NoData(f"needs {need}")
    plotted, drawn = [], {}
    offsets = _offsets(len(series), [r[x] for rs in series.values() for r in rs], log_x)
    for (label, rs), shift in zip(series.items(), offsets, strict=True):
        xs = np.array([r[x] for r in rs], dtype=float)
        at = xs * 2**shift if log_x else xs + shift
        line = ax.plot(at, [r[y] for r in rs], "-", label=label, lw=1.2)[0]  # dodged a little, like its dots
        color = line.get_color()
        for r, xi in zip(rs, at, strict=True):
            hollow = bool(r.get("disturbed"))
            ax.plot([xi], [r[y]], "o", ms=5, color=color, mfc="white" if hollow else color, zorder=3)
            per_prompt = r.get("prompt_speedups") if y == Y else None
            if per_prompt:
                q1, q3 = np.percentile(per_prompt, [25, 75])
                ax.errorbar(
                    [xi],
                    [r[y]],
                    yerr=[[max(0.0, r[y] - q1)], [max(0.0, q3 - r[y])]],
                    fmt="none",
                    ecolor=color,
                    elinewidth=0.8,
                    capsize=2,
                    alpha=0.7,
                )
                if len(per_prompt) <= POINTS_UP_TO:
                    ax.plot([xi] * len(per_prompt), per_prompt, ".", ms=2.5, color=color, alpha=0.45, zorder=2)
        drawn[label] = (rs, color)
        plotted += [
            {
                "series": label,
                x: r[x],
                y: r[y],
                "key": r["key"],
                "run": r["run"],
                "prompts": len(r.get("prompt_speedups") or []),
                "prompt_speedup_p25": _q(r, 25, y),
                "prompt_speedup_p75": _q(r, 75, y),
                "disturbed": r.get("disturbed", 0),
            }
            for r in rs
        ]
    any_prompts = any(r.get("prompt_speedups") for rs, _ in drawn.values() for r in rs) and y == Y
    if any_prompts:
        ax.errorbar(
            [],
            [],
            yerr=[],
            fmt=".",
            ms=2.5,
            color="grey",
            elinewidth=0.8,
            capsize=2,
            label="per prompt: dots, bar = interquartile range",
        )
    mark_disturbed_legend(ax, any(r.get("disturbed") for rs, _ in drawn.values() for r in rs))
    measured_at = sorted({r[x] for rs, _ in drawn.values() for r in rs})
    if not log_x and len(measured_at) <= 12:  # ticks where it was measured (the dodge moves the points a little)
        ax.set_xticks(measured_at, [f"{v:g}" for v in measured_at])
    return plotted, drawn


def _q(r: dict, q: int, y: str) -> float | None:
    values = r.get("prompt_speedups") if y == Y else None
    return float(np.percentile(values, q)) if values else None


def _finish(ax: Axes, x: str, title: str, **axis) -> None:
    speedup_axis(ax, **axis)
    ax.set_xlabel(AXIS_LABELS[x])
    ax.set_title(title)
    legend(ax)


def _relative_to_best(rows: list[dict]) -> list[dict]:
    """Each row's throughput over the best K's of its series (same system and other settings)."""
    groups = series_of([r for r in rows if r.get("tokens_per_s") and r.get("K") is not None], "K", min_points=2)
    out = []
    for rs in groups.values():
        best = max(r["tokens_per_s"] for r in rs)
        out += [{**r, RELATIVE: r["tokens_per_s"] / best, "prompt_speedups": []} for r in rs]
    return out


def speedup_vs_k(ax: Axes, data: ReportData) -> list[dict]:
    rows = [r for r in data.rows if r["system"] in ("sd", "ssd", "hf-assisted")]
    with_ar = [r for r in rows if r.get(Y) is not None]
    if with_ar and series_of(with_ar, "K", min_points=2):
        plotted, _ = _lines(ax, rows, "K", Y, "")
        _finish(ax, "K", "Speedup over AR vs lookahead K (end-to-end tokens/s)")
        return plotted
    relative = _relative_to_best(rows)
    if not relative:
        raise NoData("needs speculative runs at two or more K (--K 2 4 6)")
    data.note(
        f"No AR run at the same temperature and batch size, so no speedup over AR: each K's throughput "
        f"is shown relative to the best K of its series ({NO_AR} for the speedup)."
    )
    plotted, _ = _lines(ax, relative, "K", RELATIVE, "")
    _finish(
        ax,
        "K",
        "Throughput vs lookahead K, relative to the best K (no AR baseline in these runs)",
        reference="best K (1×)",
        ylabel="tokens/s relative to the best K (×)",
    )
    return plotted


def _need(rows: list[dict], x: str, flags: str) -> str:
    """What is missing: the sweep itself, or the AR baseline that would make it a speedup."""
    if series_of([r for r in rows if r.get(x) is not None], x, min_points=2):
        return f"{flags}, and an AR baseline: {NO_AR}"
    return flags


def speedup_vs_budget(ax: Axes, data: ReportData) -> list[dict]:
    rows = [r for r in data.rows if r["system"] == "ssd" and isinstance(r.get("budget"), (int, float))]  # not "auto"
    plotted, drawn = _lines(
        ax,
        rows,
        "budget",
        Y,
        _need(rows, "budget", "SSD runs at two or more budgets (--budget 6 12 24 --schedule uniform geometric)"),
    )
    schedules = sorted({r["schedule"] for rs, _ in drawn.values() for r in rs if r.get("schedule")})
    what = " vs ".join(schedules) + (" schedule" if len(schedules) == 1 else " schedules")
    if len(schedules) < 2:
        data.note(f"Only the {what} ran: add --schedule uniform geometric to compare schedules (Thm 12).")
    _finish(ax, "budget", f"SSD speedup over AR vs fan-out budget ({what})")
    return plotted


def speedup_vs_c(ax: Axes, data: ReportData) -> list[dict]:
    rows = [r for r in data.rows if r["system"] in ("sd", "ssd") and r["temperature"] > 0]
    plotted, drawn = _lines(
        ax,
        rows,
        "C",
        Y,
        _need(rows, "C", "SD/SSD runs at temperature > 0 with two or more C values (--temperature 0.7 --C 1 0.5)"),
    )
    twin = ax.twinx()
    for label, (rs, color) in drawn.items():  # same colour as the series' speedup line
        for y, style in (("hit_rate", "s--"), ("alpha", "^:")):
            pts = [r for r in rs if r.get(y) is not None]
            if pts:
                twin.plot([r["C"] for r in pts], [r[y] for r in pts], style, ms=3, alpha=0.6, color=color)
                plotted += [{"series": label, "C": r["C"], y: r[y], "key": r["key"], "run": r["run"]} for r in pts]
    twin.set_ylabel("hit rate (■ dashed), α (▲ dotted)")
    twin.set_ylim(0, 1.05)
    speedup_axis(ax)
    ax.set_xlabel(AXIS_LABELS["C"])
    ax.set_title(
        "Speedup over AR (solid) vs Saguaro C at temperature > 0, with cache hit rate and "
        "acceptance rate α on the right axis"
    )
    handles, labels = ax.get_legend_handles_labels()
    legend(twin, handles=handles, labels=labels)  # on the twin, drawn on top, past its labels
    return plotted


def speedup_vs_temperature(ax: Axes, data: ReportData) -> list[dict]:
    rows = [r for r in data.rows if r["system"] != "ar" and (r["C"] or 1.0) == 1.0]
    plotted, _ = _lines(
        ax,
        rows,
        "temperature",
        Y,
        _need(rows, "temperature", "runs at two or more temperatures (--temperature 0 0.7 1)"),
    )
    _finish(ax, "temperature", "Speedup over AR vs sampling temperature (C = 1)")
    return plotted


SETTING = ("run", "K", "budget", "schedule", "C", "temperature")


def _crossovers(rows: list[dict]) -> list[dict]:
    """Smallest batch at which a fast SSD backup's speedup reaches the neural backup's after being below it
    at a smaller batch, per other setting. Needs both backups at two or more common batch sizes."""
    out = []
    neural = {
        (*(r[s] for s in SETTING), r["batch"]): r
        for r in rows
        if r["system"] == "ssd" and r["backup"] == "neural" and r[Y] is not None
    }
    fast: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["system"] == "ssd" and r["backup"] in ("random", "lookup") and r[Y] is not None:
            fast.setdefault((r["backup"], *(r[s] for s in SETTING)), []).append(r)
    for (backup, *setting), rs in fast.items():
        below = False
        for r in sorted(rs, key=lambda r: r["batch"]):
            n = neural.get((*setting, r["batch"]))
            if n is None:
                continue
            if r[Y] < n[Y]:
                below = True
            elif below:
                out.append(
                    {
                        "crossover_batch": r["batch"],
                        "fast_backup": backup,
                        "run": r["run"],
                        "K": r["K"],
                        "temperature": r["temperature"],
                    }
                )
                break
    return out


def _backup_pairs(rows: list[dict]) -> int:
    """Batch sizes at which a fast backup and the neural one both ran with the same other settings."""
    neural = {(*(r[s] for s in SETTING), r["batch"]) for r in rows if r["system"] == "ssd" and r["backup"] == "neural"}
    return len(
        {
            (*(r[s] for s in SETTING), r["batch"])
            for r in rows
            if r["system"] == "ssd" and r["backup"] in ("random", "lookup")
        }
        & neural
    )


def speedup_vs_batch(ax: Axes, data: ReportData) -> list[dict]:
    rows = [r for r in data.rows if r["system"] != "ar" and (r["C"] or 1.0) == 1.0]
    plotted, _ = _lines(
        ax, rows, "batch", Y, _need(rows, "batch", "runs at two or more batch sizes (--batch-size 1 2 4)"), log_x=True
    )
    title = "Speedup over AR (at the same batch size) vs batch size"
    if _backup_pairs(rows) < 2:
        backups = sorted({r["backup"] for r in rows if r["system"] == "ssd" and r.get("backup")})
        data.note(
            "No backup crossover drawn: it needs SSD with the neural backup and a fast one (--backup neural "
            f"random) at two or more common batch sizes; these runs have {', '.join(backups) or 'no SSD'}."
        )
    else:
        title += "; where a fast SSD backup overtakes the neural one"
        crossings = _crossovers(rows)
        if not crossings:
            data.note("No crossover: the fast backup never overtakes the neural one after trailing it.")
        for c in crossings:
            ax.axvline(c["crossover_batch"], color="black", ls="--", lw=0.8)
            b = c["crossover_batch"]
            ax.text(
                b,
                0.97,
                f"{c['fast_backup']} backup ≥ neural\nfrom b = {b} ",
                transform=ax.get_xaxis_transform(),
                fontsize=7,
                ha="right",
                va="top",
            )
            plotted.append({"series": "crossover", **c})
    ax.set_xscale("log", base=2)
    _finish(ax, "batch", title)
    plain_log_ticks(ax.xaxis, [p["batch"] for p in plotted if "batch" in p])
    return plotted
