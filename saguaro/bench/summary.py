"""summary.json and summary.md of a run folder: one row per variant, per-task acceptance, errors."""

from __future__ import annotations

from saguaro.bench.runfolder import RunDir
from saguaro.formatting import format_table
from saguaro.reporting.analysis.load import load_run
from saguaro.reporting.analysis.variants import category_pivot, category_rows, error_rows, variant_rows

COLUMNS = [
    "key",
    "prompts",
    "errors",
    "threads",
    "new_tokens",
    "wall_s",
    "tokens_per_s",
    "speedup_vs_ar",
    "speedup_vs_hf",
    "mean_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "p99_tpot_ms",
    "p50_itl_ms",
    "p99_itl_ms",
    "alpha",
    "tokens_per_round",
    "hit_rate",
]


def summarize(run_dir: RunDir, unavailable: list[dict] | None = None) -> dict:
    """Write summary.json and summary.md; return the summary."""
    run = load_run(run_dir.path)
    rows = variant_rows([run])
    summary = {
        "run": run.name,
        "where": run.where,
        "models": run.models,
        "variants": rows,
        "by_task": category_rows([run]),
        "errors": error_rows([run]),
        "unavailable": unavailable or [],
    }
    run_dir.write_summary(summary, markdown(summary))
    return summary


def markdown(summary: dict) -> str:
    lines = [
        f"# Bench {summary['run']}",
        "",
        f"Measured on {summary['where']}; models {summary['models']}.",
        "",
        format_table(summary["variants"], COLUMNS, markdown=True),
        "",
    ]
    if summary["by_task"]:
        pivot, tasks = category_pivot(summary["by_task"])
        table = format_table(pivot, ["key", *tasks], markdown=True)
        lines += ["## Acceptance by task (α / tokens per round)", "", table, ""]
    if summary["unavailable"]:
        lines += ["## Unavailable", ""] + [f"- `{u['key']}`: {u['reason']}" for u in summary["unavailable"]] + [""]
    if summary["errors"]:
        lines += ["## Errors", ""] + [f"- `{e['key']}` {e['prompt_id']}: {e['error']}" for e in summary["errors"]]
        lines.append("")
    return "\n".join(lines)
