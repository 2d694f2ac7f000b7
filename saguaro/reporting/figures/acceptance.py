"""Acceptance and cache hits: hit rate by position k, accepted-length histogram, miss rate vs fan-out."""

from __future__ import annotations

import numpy as np
from matplotlib.axes import Axes
from matplotlib.ticker import FuncFormatter

from saguaro.reporting.analysis.hits import MIN_FIT_POINTS
from saguaro.reporting.figures.base import DAGGER, HATCH, NoData, ReportData, legend, plain_log_ticks
from theory import miss_rate, outcome_probabilities

MAX_HISTOGRAMS = 4


def hit_rate_by_k(ax: Axes, data: ReportData) -> list[dict]:
    """Lookups pooled over SSD variants with the same temperature and C; error bars: binomial std. error."""
    if not data.hit_by_k:
        raise NoData("needs SSD runs (--systems ssd) with per-round hit records")
    pooled: dict[tuple, dict[int, list[int]]] = {}
    for r in data.hit_by_k:
        row = next(v for v in data.rows if (v["run"], v["key"]) == (r["run"], r["key"]))
        counts = pooled.setdefault((row["temperature"], row["C"] or 1.0), {}).setdefault(r["k"], [0, 0])
        counts[0] += r["hits"]
        counts[1] += r["lookups"]
    plotted = []
    for (T, C), by_k in sorted(pooled.items()):
        ks = sorted(by_k)
        rate = np.array([by_k[k][0] / by_k[k][1] for k in ks])
        n = np.array([by_k[k][1] for k in ks])
        label = f"T={T:g}, C={C:g} ({int(n.sum())} lookups)"
        ax.errorbar(ks, rate, yerr=np.sqrt(rate * (1 - rate) / n), fmt="-o", ms=4, capsize=3, label=label)
        plotted += [
            {"temperature": T, "C": C, "k": k, "lookups": int(m), "hits": by_k[k][0], "hit_rate": float(h)}
            for k, m, h in zip(ks, n, rate, strict=True)
        ]
    ax.set_xlabel("k (draft tokens accepted in the round whose outcome was looked up)")
    ax.set_ylabel("cache hit rate (fraction of lookups)")
    ax.set_ylim(0, 1.05)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(True, alpha=0.3)
    legend(ax)
    ax.set_title("SSD speculation-cache hit rate by verification outcome k (all SSD variants pooled by T and C)")
    return plotted


def _typical(rows: list[dict]) -> list[dict]:
    """Up to MAX_HISTOGRAMS variants at the runs' base settings (smallest batch and temperature, C = 1,
    neural backup), one per system and K."""
    base = [r for r in rows if (r["C"] or 1.0) == 1.0 and r["backup"] in (None, "neural")] or rows
    b, T = min(r["batch"] for r in base), min(r["temperature"] for r in base)
    base = [r for r in base if r["batch"] == b and r["temperature"] == T] or base
    chosen: dict[tuple, dict] = {}
    for r in sorted(base, key=lambda r: -(r["rounds"] or 0)):
        chosen.setdefault((r["system"], r["K"]), r)
    return sorted(chosen.values(), key=lambda r: (r["K"], r["system"]))[:MAX_HISTOGRAMS]


def acceptance_histogram(ax: Axes, data: ReportData) -> list[dict]:
    """Fraction of rounds accepting k draft tokens, with the i.i.d. prediction P(k) at the measured α."""
    rows = [r for r in data.rows if r["accepted_hist"] and r["K"] and r["alpha"] is not None]
    if not rows:
        raise NoData("needs speculative runs of this engine (sd or ssd) with accepted counts")
    chosen = _typical(rows)
    width = 0.8 / len(chosen)
    plotted = []
    for i, r in enumerate(chosen):
        K, hist = r["K"], {int(k): v for k, v in r["accepted_hist"].items()}
        n = sum(hist.values())
        ks = np.arange(K + 1)
        frac = np.array([hist.get(int(k), 0) / n for k in ks])
        iid = outcome_probabilities(r["alpha"], K)
        x = ks - 0.4 + width * (i + 0.5)
        label = r["key"] if len(data.runs) == 1 else f"{r['key']} [{r['run']}]"
        label += f" {DAGGER} disturbed" if r.get("disturbed") else ""
        ax.bar(x, frac, width=width, label=f"{label} (α={r['alpha']:.2f})", hatch=HATCH if r.get("disturbed") else None)
        ax.plot(x, iid, "k_", ms=8, mew=1.5)
        plotted += [
            {
                "key": r["key"],
                "run": r["run"],
                "k": int(k),
                "rounds": hist.get(int(k), 0),
                "fraction": float(f),
                "iid_prediction": float(p),
            }
            for k, f, p in zip(ks, frac, iid, strict=True)
        ]
    ax.plot([], [], "k_", ms=8, mew=1.5, label="i.i.d. prediction P(k) at the measured α")
    ax.set_xlabel("k (draft tokens accepted per round)")
    ax.set_ylabel("fraction of sequence-rounds")
    ax.set_ylim(bottom=0)
    ax.grid(True, axis="y", alpha=0.3)
    legend(ax)
    ax.set_title("Accepted-length histogram (per sequence and round)")
    return plotted


def miss_vs_fanout(ax: Axes, data: ReportData) -> list[dict]:
    points = [p for p in data.miss_points if p["misses"] > 0]
    temperatures = {p["temperature"] for p in points}
    counts = {T: len({p["fanout"] for p in points if p["temperature"] == T}) for T in temperatures}
    if max(counts.values(), default=0) < MIN_FIT_POINTS:
        most = max(counts.values(), default=0)
        raise NoData(
            f"a power law a·F^(−r) has two parameters, so it needs misses at {MIN_FIT_POINTS} or more "
            f"fan-outs F_k at one temperature to be tested; these runs have {most} "
            "(SSD runs at more budgets: --budget 6 12 24)"
        )
    for T, n in sorted(counts.items()):
        if n < MIN_FIT_POINTS:
            data.note(f"T={T:g}: misses at {n} fan-out(s) only, drawn without a fit.")
    plotted = []
    for T in sorted({p["temperature"] for p in points}):
        ps = [p for p in points if p["temperature"] == T]
        dots = ax.loglog([p["fanout"] for p in ps], [p["miss_rate"] for p in ps], "o", ms=5, label=f"measured, T={T:g}")
        plotted += [{"kind": "point", **p} for p in ps]
        fit = next((f for f in data.power_law if f["temperature"] == T and "r" in f), None)
        fit = fit if counts[T] >= MIN_FIT_POINTS else None
        if fit is not None:
            F = np.geomspace(min(p["fanout"] for p in ps), max(p["fanout"] for p in ps), 50)
            ax.loglog(
                F,
                miss_rate(F, fit["r"], fit["scale"]),
                "-",
                color=dots[0].get_color(),
                label=f"fit T={T:g}: {fit['scale']:.2f}·F^(−{fit['r']:.2f}±{fit['r_stderr']:.2f})",
            )
            plotted.append(
                {
                    "kind": "fit",
                    "temperature": T,
                    "r": fit["r"],
                    "r_stderr": fit["r_stderr"],
                    "scale": fit["scale"],
                    "n_points": fit["n_points"],
                }
            )
    plain_log_ticks(ax.xaxis, [p["fanout"] for p in points])
    plain = FuncFormatter(lambda v, _: f"{v:g}")  # 0.3, not 3×10^−1 (minor ticks are labelled within a decade)
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)
    ax.set_xlabel("fan-out F (guesses cached for the outcome)")
    ax.set_ylabel("miss rate 1 − p_hit (fraction of lookups)")
    ax.grid(True, which="both", alpha=0.3)
    legend(ax)
    ax.set_title("Cache miss rate vs fan-out (log-log) with fitted power law a·F^(−r)")
    return plotted
