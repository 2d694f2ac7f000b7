"""`saguaro validate defaults RUN_DIR...`: are the command line's speculation defaults within 5% of the best
configuration each bench run found? (engine.config.COMMAND_LINE_DEFAULTS; reports/2026-12-cpu-speculation-defaults)

In each run folder, for SD and for SSD: the variant the defaults run (SD: K auto; SSD: K auto, budget auto,
geometric schedule, neural backup), the fastest variant of that system at the same temperature and batch, and
the default's tokens/s over the best's. A run without the default variant of a system is refused: rerun it with
the default among its axes.

The best of many variants is picked on the same noisy calls it is judged by, so a single run flatters it. Where
the run folder has its results.jsonl, each row also gets an interval for that ratio: the run's prompts resampled
with replacement (each variant answered the same prompts, so the resampling keeps them paired), the 5th and 95th
percentile of the ratio over BOOTSTRAP draws. An interval that straddles 0.95 says the run cannot tell. Where
the default is the best, the interval is of its ratio to the runner-up (its lead, and how sure the run is of it).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

TOLERANCE = 0.05
BOOTSTRAP = 2000  # resamples of the prompts for the ratio's interval
LEVEL = 0.90  # the interval's coverage
DEFAULT_KEYS = {"sd": ("K=auto",), "ssd": ("K=auto", "B=auto geometric", "neural")}  # parts of the variant key


def is_default(variant: dict) -> bool:
    """The variant is what the command line runs for its system without speculation flags."""
    parts = DEFAULT_KEYS.get(variant["system"])
    return (
        parts is not None and all(p in variant["key"].split(" T=")[0] for p in parts) and (" C=" not in variant["key"])
    )


def check(runs: list[Path]) -> list[dict]:
    """One row per run folder, system, temperature and batch: the default against the best."""
    rows = []
    for run in runs:
        path = Path(run) / "summary.json"
        if not path.is_file():
            raise ValueError(f"{run} has no summary.json: give saguaro bench run folders")
        variants = json.loads(path.read_text())["variants"]
        config = json.loads((Path(run) / "config.json").read_text()) if (Path(run) / "config.json").is_file() else {}
        for system in DEFAULT_KEYS:
            groups: dict[tuple, list[dict]] = {}
            for v in variants:
                if v["system"] == system and v.get("tokens_per_s"):
                    groups.setdefault((v.get("temperature"), v.get("batch")), []).append(v)
            for (temperature, batch), group in sorted(groups.items(), key=lambda g: str(g[0])):
                defaults = [v for v in group if is_default(v)]
                if not defaults:
                    raise ValueError(
                        f"{run}: no {system} variant runs the default ({', '.join(DEFAULT_KEYS[system])}) "
                        f"at T={temperature:g}: add it to the bench's axes"
                    )
                ranked = sorted(group, key=lambda v: -v["tokens_per_s"])  # stable: the first of equals stays first
                default, best = defaults[0], ranked[0]
                ratio = default["tokens_per_s"] / best["tokens_per_s"]
                # the interval against the best, or where the default is the best, against the runner-up
                rival = next((v for v in ranked if v is not default), None)
                interval = paired_interval(Path(run), default["key"], rival["key"]) if rival else None
                low, high = interval or (None, None)
                rows.append(
                    {
                        "run": Path(run).name,
                        "prompts": config.get("prompts"),
                        "system": system,
                        "temperature": temperature,
                        "batch": batch,
                        "default": default["key"],
                        "default_tokens_per_s": default["tokens_per_s"],
                        "best": best["key"],
                        "best_tokens_per_s": best["tokens_per_s"],
                        "ratio": ratio,
                        "within": ratio >= 1 - TOLERANCE,
                        "variants": len(group),
                        "low": low,
                        "high": high,
                        "rival": rival["key"] if rival else None,
                    }
                )
    return rows


def paired_interval(
    run: Path, default: str, best: str, draws: int = BOOTSTRAP, seed: int = 0
) -> tuple[float, float] | None:
    """The LEVEL interval of (default tokens/s) / (best tokens/s) with the run's prompts resampled, or None
    without per-call results (or without a prompt both answered)."""
    path = run / "results.jsonl"
    if not path.is_file():
        return None
    calls: dict[str, dict[str, tuple[float, float]]] = {default: {}, best: {}}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        if r.get("key") in calls and not r.get("error") and r.get("wall_s"):
            tokens, wall = calls[r["key"]].get(r["prompt_id"], (0.0, 0.0))
            calls[r["key"]][r["prompt_id"]] = (tokens + r["new_tokens"], wall + r["wall_s"])
    prompts = sorted(set(calls[default]) & set(calls[best]))
    if not prompts:
        return None
    d = np.array([calls[default][p] for p in prompts])  # [prompts, (tokens, wall)]
    b = np.array([calls[best][p] for p in prompts])
    picks = np.random.default_rng(seed).integers(0, len(prompts), size=(draws, len(prompts)))
    ratios = (d[picks, 0].sum(1) / d[picks, 1].sum(1)) / (b[picks, 0].sum(1) / b[picks, 1].sum(1))
    tail = (1 - LEVEL) / 2
    low, high = np.quantile(ratios, [tail, 1 - tail])
    return float(low), float(high)


def markdown(rows: list[dict]) -> str:
    lines = [
        "| run | prompts | T | system | default tok/s | best variant | best tok/s | default / best | "
        f"{LEVEL:.0%} interval of default / best (default best: / runner-up), prompts resampled | within 5% |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        interval = "-" if r.get("low") is None else f"{r['low']:.3f}-{r['high']:.3f}"
        lines.append(
            f"| {r['run']} | {r['prompts']} | {r['temperature']:g} | {r['system'].upper()} | "
            f"{r['default_tokens_per_s']:.2f} | {r['best']} | {r['best_tokens_per_s']:.2f} | "
            f"{r['ratio']:.3f} | "
            f"{interval} | {'yes' if r['within'] else 'NO'} |"
        )
    return "\n".join(lines) + "\n"
