"""`saguaro validate defaults RUN_DIR...`: are the command line's speculation defaults within 5% of the best
configuration each bench run found? (engine.config.COMMAND_LINE_DEFAULTS; reports/2026-12-cpu-speculation-defaults)

In each run folder, for SD and for SSD: the variant the defaults run (SD: K auto; SSD: K auto, budget auto,
geometric schedule, neural backup), the fastest variant of that system at the same temperature and batch, and
the default's tokens/s over the best's. A run without the default variant of a system is refused: rerun it with
the default among its axes.
"""

from __future__ import annotations

import json
from pathlib import Path

TOLERANCE = 0.05
DEFAULT_KEYS = {"sd": ("K=auto",), "ssd": ("K=auto", "B=auto geometric", "neural")}  # parts of the variant key


def is_default(variant: dict) -> bool:
    """The variant is what the command line runs for its system without speculation flags."""
    parts = DEFAULT_KEYS.get(variant["system"])
    return parts is not None and all(p in variant["key"].split(" T=")[0] for p in parts) and (
        " C=" not in variant["key"])


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
                    raise ValueError(f"{run}: no {system} variant runs the default ({', '.join(DEFAULT_KEYS[system])}) "
                                     f"at T={temperature:g}: add it to the bench's axes")
                default, best = defaults[0], max(group, key=lambda v: v["tokens_per_s"])
                ratio = default["tokens_per_s"] / best["tokens_per_s"]
                rows.append({"run": Path(run).name, "prompts": config.get("prompts"), "system": system,
                             "temperature": temperature, "batch": batch, "default": default["key"],
                             "default_tokens_per_s": default["tokens_per_s"], "best": best["key"],
                             "best_tokens_per_s": best["tokens_per_s"], "ratio": ratio,
                             "within": ratio >= 1 - TOLERANCE, "variants": len(group)})
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| run | prompts | T | system | default tok/s | best variant | best tok/s | default / best | within 5% |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['run']} | {r['prompts']} | {r['temperature']:g} | {r['system'].upper()} | "
                     f"{r['default_tokens_per_s']:.2f} | {r['best']} | {r['best_tokens_per_s']:.2f} | {r['ratio']:.3f} | "
                     f"{'yes' if r['within'] else 'NO'} |")
    return "\n".join(lines) + "\n"
