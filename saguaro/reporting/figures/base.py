"""What every figure shares: the data it draws from, rendering to PNG with the plotted data beside it.

A figure function takes a matplotlib Axes and a `ReportData`, draws, sets axis labels (with units) and
a title saying what was measured, and returns the rows it plotted. `render` adds where it was measured
to the title and writes `<name>.png` and `<name>.csv` (the returned rows) side by side. A figure whose
data is not in the runs, or cannot support it (a power law through two points, a crossover with one
backup), raises `NoData` saying why and what run would supply it; the report prints that line instead.

Layout: constrained, saved with `bbox_inches="tight"`, legends outside the data area (beside the axes),
ratio axes from 0 with 1.0 drawn. Rows from a disturbed run (`Run.disturbed`) are drawn hollow or hatched
and listed with a dagger (†).
"""

from __future__ import annotations

import csv
import io
import json
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, never a window
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure as MplFigure
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

from saguaro.reporting.analysis.load import Run

DPI = 110


class NoData(ValueError):
    """The runs hold nothing this figure can show; the message says which runs would."""


@dataclass
class ReportData:
    runs: list[Run]
    rows: list[dict]  # saguaro.reporting.analysis.variants.variant_rows
    predictions: list[dict] = field(default_factory=list)  # saguaro.reporting.analysis.predict
    hit_by_k: list[dict] = field(default_factory=list)  # saguaro.reporting.analysis.hits
    miss_points: list[dict] = field(default_factory=list)
    power_law: list[dict] = field(default_factory=list)
    serving: list[dict] = field(default_factory=list)  # client runs: saguaro.reporting.analysis.serving.point_rows
    notes: list[str] = field(default_factory=list)  # what the figure being drawn left out, and why

    def note(self, text: str) -> None:
        """A line for the report under the figure being drawn (e.g. a part not drawn, and why)."""
        self.notes.append(text)

    @property
    def where(self) -> str:
        """'models on machine' for titles; several runs on different setups are all named."""
        setups = list(dict.fromkeys(f"{run.models} on {run.where}" for run in self.runs))
        return setups[0] if len(setups) == 1 else f"{len(setups)} setups: " + "; ".join(setups)


@dataclass(frozen=True)
class Figure:
    name: str  # file stem
    caption: str  # one line for the report
    draw: Callable[[Axes, ReportData], list[dict]]
    size: Callable[[ReportData], tuple[float, float]] = lambda data: (9.0, 4.5)  # the legend sits beside


@dataclass(frozen=True)
class Rendered:
    figure: Figure
    png: Path
    data: Path
    rows: list[dict]
    canvas: MplFigure  # the drawn figure (closed: inspect it, do not show it)
    notes: list[str] = field(default_factory=list)


def _cell(value):
    if isinstance(value, (list, dict, tuple)):
        return json.dumps(value)
    return "" if value is None else value


def write_csv(rows: list[dict], path: Path) -> None:
    columns = list(dict.fromkeys(k for r in rows for k in r))
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for r in rows:
            writer.writerow({k: _cell(r.get(k)) for k in columns})


def _save_png(fig, path: Path) -> None:
    """PNG with a 256-colour palette: a third of the bytes, no visible change for line and bar charts."""
    from PIL import Image

    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=DPI, format="png", bbox_inches="tight", pad_inches=0.05)
    buffer.seek(0)
    with Image.open(buffer) as image:
        image.convert("RGB").quantize(colors=256).save(path, optimize=True)


def draw(figure: Figure, data: ReportData) -> tuple[MplFigure, list[dict]]:
    """The figure drawn on a constrained layout, its title over the whole figure; NoData propagates."""
    fig, ax = plt.subplots(figsize=figure.size(data), layout="constrained")
    data.notes.clear()
    try:
        rows = figure.draw(ax, data)
    except BaseException:
        plt.close(fig)
        raise
    # The title goes over the whole figure (axes with long tick labels sit off-centre).
    width = int(fig.get_figwidth() * 13)  # characters that fit at fontsize 9
    title = textwrap.wrap(ax.get_title(), width) + textwrap.wrap(f"measured: {data.where}", width)
    ax.set_title("")
    fig.suptitle("\n".join(title), fontsize=9)
    return fig, rows


def render(figure: Figure, data: ReportData, out_dir: Path) -> Rendered:
    """Draw one figure into out_dir/<name>.png with out_dir/<name>.csv beside; NoData propagates."""
    out_dir.mkdir(parents=True, exist_ok=True)
    fig, rows = draw(figure, data)
    try:
        png, csv_path = out_dir / f"{figure.name}.png", out_dir / f"{figure.name}.csv"
        _save_png(fig, png)
        write_csv(rows, csv_path)
    finally:
        plt.close(fig)
    return Rendered(figure, png, csv_path, rows, fig, list(data.notes))


# -- what the figure functions share -----------------------------------------------------------------
AXIS_LABELS = {
    "K": "K (draft tokens per round)",
    "budget": "fan-out budget B = Σ F_k (guesses)",
    "C": "Saguaro constant C",
    "temperature": "temperature",
    "batch": "batch size b (sequences)",
}
SETTING_NAMES = ("K", "budget", "schedule", "C", "backup", "temperature", "batch")


def fmt(name: str, value) -> str:
    if name in ("schedule", "backup"):
        return str(value)
    short = {"temperature": "T", "batch": "b", "budget": "B"}.get(name, name)
    return f"{short}={value:g}" if isinstance(value, float) else f"{short}={value}"


def _group(rows: list[dict], x: str) -> dict[str, list[dict]]:
    # None (the axis does not apply to that system) is not a value of its own: the system name says it
    varying = [s for s in SETTING_NAMES if s != x and len({r[s] for r in rows if r.get(s) is not None}) > 1]
    several_runs = len({r["run"] for r in rows}) > 1
    groups: dict[str, list[dict]] = {}
    for r in rows:
        parts = [r["system"]] + [fmt(s, r[s]) for s in varying if r.get(s) is not None]
        if several_runs:
            parts.append(f"[{r['run']}]")
        groups.setdefault(" ".join(parts), []).append(r)
    return groups


def series_of(rows: list[dict], x: str, min_points: int = 1) -> dict[str, list[dict]]:
    """Rows grouped into lines: one per system, run and setting of the other axes, labelled by what varies.

    `min_points`: drop lines with fewer distinct x values (one point says nothing about a trend); the
    labels then name only what varies among the lines kept.
    """
    groups = _group(rows, x)
    if min_points > 1:
        kept = [r for rs in groups.values() if len({r[x] for r in rs}) >= min_points for r in rs]
        groups = _group(kept, x)
    return {label: sorted(rs, key=lambda r: r[x]) for label, rs in groups.items()}


def legend(ax: Axes, n: int | None = None, handles=None, labels=None) -> None:
    """The legend beside the axes, outside the data area (the constrained layout makes room for it).

    `n` is accepted for older callers and ignored. On axes with a twin, pass the twin's handles too and call
    it on the twin (drawn on top) so that the legend clears the right axis' labels."""
    if handles is None:
        handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return
    twin = any(other is not ax and other.bbox.bounds == ax.bbox.bounds for other in ax.figure.axes)
    ax.legend(
        handles,
        labels,
        fontsize=7 if len(handles) <= 8 else 6,
        loc="upper left",
        bbox_to_anchor=(1.15 if twin else 1.02, 1.0),
        borderaxespad=0,
        frameon=False,
    )


def plain_log_ticks(axis, values) -> None:
    """Ticks at the given values, printed as plain numbers (log axes would print 2×10^0)."""
    axis.set_major_locator(FixedLocator(sorted(set(values))))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def speedup_axis(ax: Axes, reference: str = "AR (1×)", ylabel: str = "speedup over AR (× tokens/s)") -> None:
    """A ratio axis: from 0, with the reference (1.0) drawn."""
    ax.axhline(1.0, color="grey", lw=0.8, ls=":", label=reference)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)


DAGGER = "†"
DISTURBED_LABEL = "† disturbed run (hollow marker / hatched bar)"
HATCH = "///"


def plural(n: int, word: str, many: str | None = None) -> str:
    """'1 thread', '2 threads' (`many` for irregular plurals)."""
    return f"{n:g} {word if n == 1 else (many or word + 's')}"


def mark_disturbed_legend(ax: Axes, any_disturbed: bool) -> None:
    """A legend entry explaining the hollow markers and hatched bars, when some row is disturbed."""
    if any_disturbed:
        ax.plot([], [], "o", mfc="none", color="black", ms=5, label=DISTURBED_LABEL)


def spread(values: list[float]) -> tuple[float, float, float] | None:
    """(p25, median, p75) of per-prompt values; None without any."""
    import numpy as np

    if not values:
        return None
    q = np.percentile(values, [25, 50, 75])
    return float(q[0]), float(q[1]), float(q[2])


def markdown_section(figure: Figure, data: ReportData, out_dir) -> list[str]:
    """A report's section for one figure: drawn (image, data file, notes) or the reason it was not."""
    md = [f"### {figure.name.replace('_', ' ')}", "", figure.caption, ""]
    try:
        done = render(figure, data, out_dir)
    except NoData as why:
        return md + [f"_Not drawn: {why}._", ""]
    md += [f"![{figure.caption}]({done.png.name})", "", f"Data: [{done.data.name}]({done.data.name})", ""]
    return md + [f"_{note}_" for note in done.notes] + ([""] if done.notes else [])
