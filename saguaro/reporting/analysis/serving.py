"""Client runs (`saguaro bench --url`) read back: one row per load point, from the request lines.

The figures of a point are always recomputed from requests.jsonl (the run's own summaries are written by the
same function), so an interrupted run still reports what it measured. Latency is theory.latency's, over the
requests that completed; throughput is over the point's duration, from its first send to its last answer.
"""

from __future__ import annotations

import math
from collections import defaultdict

from saguaro.reporting.analysis.load import Run
from theory.latency import RequestLatency, summarize


def _none_for_nan(values: dict) -> dict:
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in values.items()}


def _latency(line: dict) -> RequestLatency:
    return RequestLatency(line["ttft_s"], line["tpot_s"], tuple(line["itl_s"]), line["e2el_s"], line["new_tokens"])


def point_summary(config: dict, point: str, lines: list[dict], planned: int) -> dict:
    """The figures of one load point from its request lines; `planned`: requests the point was to send.

    Keys: the inputs (url, model, endpoint, rate, concurrency, seed, prompts, max_new_tokens, temperature,
    label), request counts, duration_s, requests_per_s, output_tokens_per_s, and theory.latency.summarize's
    mean/median/std/p50/p90/p99 of ttft, tpot, itl and e2el in ms (None without a sample).
    """
    ok = [r for r in lines if r.get("error") is None]
    duration = max((r["done_s"] for r in lines), default=0.0)
    output_tokens = sum(r["new_tokens"] for r in ok)
    first = lines[0] if lines else {}
    return {
        "point": point,
        "label": config.get("label"),
        "url": config.get("url"),
        "model": config.get("model"),
        "endpoint": config.get("endpoint"),
        "rate": first.get("rate"),
        "concurrency": first.get("concurrency"),
        "seed": config.get("seed"),
        "prompts": config.get("prompts"),
        "num_prompts": config.get("num_prompts"),
        "max_new_tokens": config.get("max_new_tokens"),
        "temperature": config.get("temperature"),
        "ignore_eos": config.get("ignore_eos"),
        "requests": planned,
        "sent": len(lines),
        "completed": len(ok),
        "failed": len(lines) - len(ok),
        "not_sent": planned - len(lines),
        "duration_s": duration,
        "requests_per_s": len(ok) / duration if duration > 0 else None,
        "output_tokens_per_s": output_tokens / duration if duration > 0 else None,
        "total_output_tokens": output_tokens,
        "total_prompt_tokens": sum(r.get("prompt_tokens") or 0 for r in ok),
        **_none_for_nan(summarize([_latency(r) for r in ok])),
    }


def _series(run: Run, runs: list[Run]) -> str:
    """A line's name in figures: the run's --label (the system), with the run's name when labels repeat."""
    label = run.config.get("label") or run.name
    same = [r for r in runs if (r.config.get("label") or r.name) == label]
    return label if len(same) == 1 else f"{label} [{run.name}]"


def point_rows(runs: list[Run]) -> list[dict]:
    """One row per (client run, load point), in run order then point order; `rate` is a float (inf too)."""
    rows = []
    for run in runs:
        by_point: dict[str, list[dict]] = defaultdict(list)
        for line in run.requests:
            by_point[line["point"]].append(line)
        for point, lines in by_point.items():
            row = point_summary(run.config, point, lines, run.config.get("num_prompts", len(lines)))
            rate = row["rate"]
            reasons = [why for why in map(run.disturbed, lines) if why]
            row.update(
                run=run.name,
                series=_series(run, runs),
                load="rate" if rate is not None else "concurrency",
                rate=None if rate is None else float(rate),
                disturbed=len(reasons),
                disturbed_reasons=list(dict.fromkeys(reasons)),
            )
            rows.append(row)
    return rows
