"""Speedup over AR along one sweep axis: K, fan-out budget, C, temperature, batch size."""

from __future__ import annotations

from matplotlib.axes import Axes

from saguaro.figures.base import AXIS_LABELS, NoData, ReportData, legend, plain_log_ticks, series_of, speedup_axis

Y = "speedup_vs_ar"


def _lines(ax: Axes, rows: list[dict], x: str, y: str, need: str) -> tuple[list[dict], dict]:
    """One line per series with two or more x values; NoData if there is none. Returns the plotted
    rows and each series' rows and colour."""
    series = series_of([r for r in rows if r.get(y) is not None and r.get(x) is not None], x, min_points=2)
    if not series:
        raise NoData(f"needs {need}")
    plotted, drawn = [], {}
    for label, rs in series.items():
        line = ax.plot([r[x] for r in rs], [r[y] for r in rs], "-o", label=label, ms=4)
        drawn[label] = (rs, line[0].get_color())
        plotted += [{"series": label, x: r[x], y: r[y], "key": r["key"], "run": r["run"]} for r in rs]
    return plotted, drawn


def _finish(ax: Axes, x: str, title: str, n: int) -> None:
    speedup_axis(ax)
    ax.set_xlabel(AXIS_LABELS[x])
    ax.set_title(title)
    legend(ax, n + 1)


def speedup_vs_k(ax: Axes, data: ReportData) -> list[dict]:
    rows = [r for r in data.rows if r["system"] in ("sd", "ssd", "hf-assisted")]
    plotted, drawn = _lines(ax, rows, "K", Y, "speculative runs at two or more K (--K 2 4 6)")
    _finish(ax, "K", "Speedup over AR vs lookahead K (end-to-end tokens/s)", len(drawn))
    return plotted


def speedup_vs_budget(ax: Axes, data: ReportData) -> list[dict]:
    rows = [r for r in data.rows if r["system"] == "ssd" and isinstance(r.get("budget"), (int, float))]  # not "auto"
    plotted, drawn = _lines(ax, rows, "budget", Y,
                            "SSD runs at two or more budgets (--budget 6 12 24 --schedule uniform geometric)")
    _finish(ax, "budget", "SSD speedup over AR vs fan-out budget: uniform vs geometric schedule", len(drawn))
    return plotted


def speedup_vs_c(ax: Axes, data: ReportData) -> list[dict]:
    rows = [r for r in data.rows if r["system"] in ("sd", "ssd") and r["temperature"] > 0]
    plotted, drawn = _lines(ax, rows, "C", Y, "SD/SSD runs at temperature > 0 with two or more C values")
    twin = ax.twinx()
    for label, (rs, color) in drawn.items():  # same colour as the series' speedup line
        for y, style in (("hit_rate", "s--"), ("alpha", "^:")):
            pts = [r for r in rs if r.get(y) is not None]
            if pts:
                twin.plot([r["C"] for r in pts], [r[y] for r in pts], style, ms=3, alpha=0.6, color=color)
                plotted += [{"series": label, "C": r["C"], y: r[y], "key": r["key"], "run": r["run"]} for r in pts]
    twin.set_ylabel("hit rate (■ dashed), α (▲ dotted)")
    twin.set_ylim(0, 1.05)
    _finish(ax, "C", "Speedup over AR (solid) vs Saguaro C at temperature > 0, with cache hit rate and "
            "acceptance rate α on the right axis", len(drawn))
    # the legend goes on the twin axes, which are drawn on top (else their lines cross it)
    handles, labels = ax.get_legend_handles_labels()
    ax.get_legend().remove()
    if len(drawn) + 1 > 6:  # beside the axes, past the right axis' labels
        twin.legend(handles, labels, fontsize=6, loc="upper left", bbox_to_anchor=(1.12, 1.0), borderaxespad=0)
    else:
        twin.legend(handles, labels, fontsize=7, loc="best")
    return plotted


def speedup_vs_temperature(ax: Axes, data: ReportData) -> list[dict]:
    rows = [r for r in data.rows if r["system"] != "ar" and (r["C"] or 1.0) == 1.0]
    plotted, drawn = _lines(ax, rows, "temperature", Y, "runs at two or more temperatures (--temperature 0 0.7 1)")
    _finish(ax, "temperature", "Speedup over AR vs sampling temperature (C = 1)", len(drawn))
    return plotted


def _crossovers(rows: list[dict]) -> list[dict]:
    """Smallest batch at which a fast SSD backup's speedup reaches the neural backup's, per other setting."""
    out = []
    neural = {(r["run"], r["K"], r["budget"], r["schedule"], r["C"], r["temperature"], r["batch"]): r
              for r in rows if r["system"] == "ssd" and r["backup"] == "neural"}
    fast: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["system"] == "ssd" and r["backup"] in ("random", "lookup"):
            fast.setdefault((r["backup"], r["run"], r["K"], r["budget"], r["schedule"], r["C"], r["temperature"]),
                            []).append(r)
    for (backup, *setting), rs in fast.items():
        for r in sorted(rs, key=lambda r: r["batch"]):
            n = neural.get((*setting, r["batch"]))
            if n is not None and n[Y] is not None and r[Y] is not None and r[Y] >= n[Y]:
                out.append({"crossover_batch": r["batch"], "fast_backup": backup, "run": r["run"], "K": r["K"],
                            "temperature": r["temperature"]})
                break
    return out


def speedup_vs_batch(ax: Axes, data: ReportData) -> list[dict]:
    rows = [r for r in data.rows if r["system"] != "ar" and (r["C"] or 1.0) == 1.0]
    plotted, drawn = _lines(ax, rows, "batch", Y, "runs at two or more batch sizes (--batch-size 1 2 4)")
    for c in _crossovers(rows):
        ax.axvline(c["crossover_batch"], color="black", ls="--", lw=0.8)
        ax.text(c["crossover_batch"], 0.97, f"{c['fast_backup']} backup ≥ neural\nfrom b = {c['crossover_batch']} ",
                transform=ax.get_xaxis_transform(), fontsize=7, ha="right", va="top")
        plotted.append({"series": "crossover", **c})
    _finish(ax, "batch", "Speedup over AR (at the same batch size) vs batch size; where a fast SSD backup "
            "overtakes the neural one", len(drawn))
    ax.set_xscale("log", base=2)
    plain_log_ticks(ax.xaxis, [p["batch"] for p in plotted if "batch" in p])
    return plotted
