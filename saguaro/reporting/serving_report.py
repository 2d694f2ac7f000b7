"""The report's section on client runs (saguaro bench --url): setup, one row per load point, figures, errors."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from saguaro.formatting import format_table
from saguaro.reporting.analysis.load import Run
from saguaro.reporting.analysis.serving import point_rows
from saguaro.reporting.figures import ReportData, markdown_section
from saguaro.reporting.figures.base import DAGGER
from saguaro.reporting.figures.serving import SERVING_FIGURES

POINTS = [
    "series",
    "point",
    "completed",
    "failed",
    "not_sent",
    "requests_per_s",
    "output_tokens_per_s",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "median_e2el_ms",
]
SETUP = [
    "run",
    "label",
    "url",
    "model",
    "endpoint",
    "prompts",
    "num_prompts",
    "max_new_tokens",
    "temperature",
    "seed",
    "client",
    "commit",
    "started",
]
ERRORS_SHOWN = 10


def _setup(run: Run) -> dict:
    c, env = run.config, run.environment
    git = env.get("git") or {}
    return {
        "run": run.name,
        "label": c.get("label"),
        "url": c.get("url"),
        "model": c.get("model"),
        "endpoint": c.get("endpoint"),
        "prompts": c.get("prompts"),
        "num_prompts": c.get("num_prompts"),
        "max_new_tokens": c.get("max_new_tokens"),
        "temperature": c.get("temperature"),
        "seed": c.get("seed"),
        "client": run.where,
        "commit": (git.get("commit") or "unknown")[:12],
        "started": env.get("time"),
    }


def _errors(runs: list[Run]) -> list[dict]:
    counts = Counter(
        (run.name, line["point"], line["error"]) for run in runs for line in run.requests if line.get("error")
    )
    return [
        {"run": run, "point": point, "requests": n, "error": error}
        for (run, point, error), n in counts.most_common(ERRORS_SHOWN)
    ]


def _marked(rows: list[dict]) -> list[dict]:
    return [{**r, "point": f"{r['point']} {DAGGER}" if r.get("disturbed") else r["point"]} for r in rows]


def _footnote(rows: list[dict]) -> list[str]:
    lines = [
        f"- {DAGGER} `{r['series']}` {r['point']}: {r['disturbed']} of {r['sent']} requests disturbed: "
        + "; ".join(r["disturbed_reasons"])
        + "."
        for r in rows
        if r.get("disturbed")
    ]
    if lines:
        lines = [
            "",
            f"{DAGGER} Disturbed while it ran (the run folder's disturbed.json says so); drawn hollow in the figures.",
            "",
            *lines,
        ]
    return lines


def serving_section(runs: list[Run], out_dir: Path) -> list[str]:
    """Markdown lines of the section; its figures are written into out_dir."""
    rows = point_rows(runs)
    md = [
        "## Serving load (client runs)",
        "",
        "Streamed requests from a client to an OpenAI-compatible server, at open-loop Poisson request rates or "
        "closed-loop concurrencies. Latency as vLLM's serving benchmark (theory.latency), over completed "
        "requests: TTFT from sending to the first token, TPOT = (E2EL − TTFT) / (tokens − 1), ITL = the gap "
        "between streamed chunks (a speculative round's tokens arrive as one chunk), E2EL to the last token. "
        "Throughput over each point's duration, from its first send to its last answer.",
        "",
        format_table([_setup(run) for run in runs], SETUP, markdown=True),
        "",
        format_table(_marked(rows), POINTS, markdown=True),
        *_footnote(rows),
        "",
    ]
    if not rows:
        return md + ["_No request was sent in these client runs._", ""]
    data = ReportData(runs, [], serving=rows)
    for load in dict.fromkeys(r["load"] for r in rows):
        for figure in SERVING_FIGURES[load]:
            md += markdown_section(figure, data, out_dir)
    errors = _errors(runs)
    if errors:
        md += [
            "### Failed requests (most frequent errors)",
            "",
            format_table(errors, ["run", "point", "requests", "error"], markdown=True),
            "",
        ]
    return md
