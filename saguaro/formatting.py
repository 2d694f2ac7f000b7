"""What the commands print, in one format: tables (plain or Markdown) from lists of dicts, figures with fixed
decimals and latencies with their unit in the header, JSON without NaN, and progress lines on stderr."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e-2 or abs(value) >= 1e4 else f"{value:.3f}".rstrip("0").rstrip(".")
    return str(value)


def format_table(rows: list[dict], columns: list[str], markdown: bool = False) -> str:
    """Columns missing from every row are dropped; a missing cell prints as '-'."""
    columns = [c for c in columns if any(c in r for r in rows)]
    cells = [[_cell(r.get(c)) for c in columns] for r in rows]
    if markdown:
        lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(row) + " |" for row in cells]
        return "\n".join(lines)
    widths = [max(len(c), *(len(row[i]) for row in cells)) if cells else len(c) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


# -- figures people read: one number format per column, the unit in the header ----------------------
def _finite_values(values) -> list[float]:
    return [abs(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]


def latency_unit(values_ms) -> tuple[str, float, int]:
    """(unit, factor from ms, decimals) for a set of latencies: s with 2 decimals once any reaches 10 s, else
    ms with 1 decimal (2 below 10 ms)."""
    finite = _finite_values(values_ms)
    top = max(finite, default=0.0)
    if top >= 10_000:
        return "s", 1e-3, 2
    return "ms", 1.0, 2 if top < 10 else 1


def _decimals(values) -> int:
    """Fixed decimals for a column of plain figures: 1 from 100 up, 2 from 1, else 3."""
    top = max(_finite_values(values), default=0.0)
    return 1 if top >= 100 else 2 if top >= 1 else 3


def number(value, decimals: int, factor: float = 1.0, limit: float | None = None) -> str | None:
    """A figure as printed: fixed decimals, 'none' for NaN (no sample), '!' past its limit (same unit as value)."""
    if value is None:
        return None
    if isinstance(value, float) and math.isnan(value):
        return "none" if limit is None else "none!"
    text = f"{value * factor:,.{decimals}f}".replace(",", "")
    return text + ("!" if limit is not None and value > limit else "")


def readable(
    rows: list[dict], columns: list[str], limits: dict[str, float] | None = None, decimals: int | None = None
) -> tuple[list[dict], list[str]]:
    """Rows and columns for format_table with every float fixed-format: a column named *_ms in ms or s (the
    header says which, chosen over the column), other float columns with fixed decimals (`decimals`, or by
    the column's size). `limits` (ms, by column) adds '!' to a latency past it."""
    fixed = decimals
    limits = limits or {}
    renamed, out = {}, [dict(r) for r in rows]
    for column in columns:
        values = [r.get(column) for r in rows]
        if not any(isinstance(v, float) for v in values):
            continue
        if column in ("C", "F"):  # a setting (Saguaro constant, fan-out): as given
            for r in out:
                if isinstance(r.get(column), float):
                    r[column] = f"{r[column]:g}"
        elif column.endswith("_ms"):
            unit, factor, decimals = latency_unit(values)
            new = column[: -len("_ms")] + f"_{unit}"
            renamed[column] = new
            for r in out:
                r[new] = number(r.pop(column, None), decimals, factor, limits.get(column))
        else:
            decimals = _decimals(values) if fixed is None else fixed
            for r in out:
                value = r.get(column)
                if isinstance(value, float):
                    r[column] = number(value, decimals)
    return out, [renamed.get(c, c) for c in columns]


def table(
    rows: list[dict],
    columns: list[str],
    markdown: bool = False,
    limits: dict | None = None,
    decimals: int | None = None,
) -> str:
    """format_table of `readable` rows: every float in its column's fixed format."""
    return format_table(*readable(rows, columns, limits, decimals), markdown=markdown)


# -- JSON ---------------------------------------------------------------------------------------------------
def _finite(value):
    """The payload with NaN and infinities as None: JSON has no NaN (a metric without samples is null)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def write_json(path: str, payload) -> None:
    """`payload` as indented JSON (NaN as null) into `path`, or on stdout for "-"."""
    text = json.dumps(_finite(payload), indent=2, default=str, allow_nan=False)
    if path == "-":
        print(text)
    else:
        Path(path).write_text(text + "\n", encoding="utf-8")


# -- progress -----------------------------------------------------------------------------------------------
class Progress:
    """Progress of a long loop on stderr: a tqdm bar when stderr is a terminal, else a line every few seconds
    (with -v); nothing with -q, and nothing at all when the loop ends within two seconds."""

    DELAY_S, EVERY_S = 2.0, 5.0

    def __init__(self, what: str, args: argparse.Namespace) -> None:
        shown = getattr(args, "_progress", None)
        tty = bool(getattr(sys.stderr, "isatty", lambda: False)())
        if shown is None:  # the CLI did not decide: a terminal, or -v
            shown = tty or bool(getattr(args, "verbose", False))
        self.what, self.shown, self.tty = what, bool(shown) and not getattr(args, "quiet", False), tty
        self.start = self.last = time.monotonic()
        self.bar = None

    def __call__(self, done: int, total: int) -> None:
        if not self.shown:
            return
        now = time.monotonic()
        if self.tty and self.bar is None and now - self.start >= self.DELAY_S and done < total:
            try:
                from tqdm import tqdm
            except ImportError:
                self.tty = False
            else:
                self.bar = tqdm(
                    total=total,
                    initial=done,
                    desc=self.what,
                    unit="config",
                    file=sys.stderr,
                    dynamic_ncols=True,
                    leave=False,
                )
                return
        if self.bar is not None:
            self.bar.update(done - self.bar.n)
            if done >= total:
                self.close()
            return
        if not self.tty and now - self.start >= self.DELAY_S and (now - self.last >= self.EVERY_S or done >= total):
            self.last = now
            print(f"{self.what}: {done}/{total} configurations, {now - self.start:.0f} s", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
