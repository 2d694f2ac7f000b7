"""`saguaro report`: one Markdown report with PNG figures (and their data as CSV) from bench run folders."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from saguaro.bench.runfolder import SUMMARY_JSON
from saguaro.formatting import format_table
from saguaro.reporting.analysis.gap import TARGET_SHARE, gap_rows, reading
from saguaro.reporting.analysis.hits import hit_by_k, miss_vs_fanout, power_law_fits
from saguaro.reporting.analysis.load import Run, load_run
from saguaro.reporting.analysis.predict import ceiling_rows, predictions
from saguaro.reporting.analysis.variants import category_pivot, category_rows, error_rows, variant_rows
from saguaro.reporting.figures import FIGURES, ReportData, markdown_section
from saguaro.reporting.figures.base import DAGGER, plural, spread
from saguaro.reporting.serving_report import serving_section

HEADLINE = [
    "key",
    "prompts",
    "errors",
    "threads",
    "tokens_per_s",
    "speedup_vs_ar",
    "prompt_speedup_iqr",
    "speedup_vs_hf",
    "p50_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "p50_itl_ms",
    "p99_itl_ms",
    "alpha",
    "tokens_per_round",
    "hit_rate",
]
PREDICTED = [
    "key",
    "measured",
    "simulated",
    "simulated_error",
    "closed_form",
    "closed_form_error",
    "alpha",
    "p_hit",
    "alpha_hit",
    "alpha_miss",
    "T_d_over_T_v",
    "T_p",
    "T_b",
    "T_ar_over_T_v",
]
CEILING = ["key", "sd_key", "measured_ssd_over_sd", "ceiling", "share", "T_sd", "E_hit", "E_sd", "hit_rate"]
GAP = [
    "key",
    "share",
    "misses_tokens",
    "misses_backup",
    "start",
    "waits",
    "shapes",
    "interference",
    "overhead",
    "rest",
    "p_hit",
    f"p_hit_for_{round(TARGET_SHARE * 100)}",
    "E_miss_over_E_hit",
    "backup_ms",
    "start_ms",
    "link_ms",
    "overrun_rounds",
    "T_p",
]
FITS = ["temperature", "r", "r_stderr", "scale", "n_points", "method", "note"]
REPORT = "report.md"


def load_runs(paths: list[str | Path]) -> list[Run]:
    if not paths:
        raise ValueError("give at least one run folder (made by `saguaro bench`)")
    runs = [load_run(p) for p in paths]
    names = [r.name for r in runs]
    if len(set(names)) != len(names):
        raise ValueError(f"two run folders share a name {names}: rename one (names label the series)")
    return runs


def load_data(paths: list[str | Path]) -> tuple[ReportData, list[str]]:
    """The engine bench runs among `paths` (client runs are reported apart) with everything figures need."""
    return bench_data([run for run in load_runs(paths) if not run.is_client])


def bench_data(runs: list[Run]) -> tuple[ReportData, list[str]]:
    rows = variant_rows(runs)
    if not rows:
        where = ", ".join(str(run.path) for run in runs) or "these run folders"
        raise ValueError(f"no engine results in {where}: run `saguaro bench` (or --resume it) first")
    pred = predictions(runs, rows)
    points = miss_vs_fanout(runs, rows)
    data = ReportData(runs, rows, pred.rows, hit_by_k(runs, rows), points, power_law_fits(points))
    return data, pred.notes


def _command(run: Run) -> str:
    argv = run.environment.get("argv") or []
    if argv and Path(argv[0]).name in ("saguaro", "cli.py"):
        argv = ["saguaro", *argv[1:]]
    return " ".join(shlex.quote(a) for a in argv) if argv else "(not recorded)"


def _setup_rows(runs: list[Run]) -> list[dict]:
    out = []
    for run in runs:
        env, c = run.environment, run.config
        git = env.get("git") or {}
        commit = (git.get("commit") or "unknown")[:12] + (" (with local changes)" if git.get("dirty") else "")
        out.append(
            {
                "run": run.name,
                "models": run.models,
                "machine": run.where,
                "memory_gib": env.get("machine", {}).get("memory_gib"),
                "torch": env.get("packages", {}).get("torch"),
                "transformers": env.get("packages", {}).get("transformers"),
                "commit": commit,
                "prompts": f"{c.get('prompts')} × {c.get('n_prompts')}",
                "max_new_tokens": c.get("max_new_tokens"),
                "started": env.get("time"),
            }
        )
    return out


def _unavailable(runs: list[Run]) -> list[dict]:
    out = []
    for run in runs:
        path = run.path / SUMMARY_JSON
        if path.is_file():
            out += [{"run": run.name, **u} for u in json.loads(path.read_text()).get("unavailable", [])]
    return out


def _table(rows: list[dict], columns: list[str], runs: int) -> str:
    return format_table(rows, (["run"] if runs > 1 else []) + columns, markdown=True)


def marked(rows: list[dict]) -> list[dict]:
    """Rows for a table: a disturbed row's key ends in †; `prompt_speedup_iqr` as 'p25–p75' of the
    per-prompt speedups over AR."""
    out = []
    for r in rows:
        q = spread(r.get("prompt_speedups") or [])
        out.append(
            {
                **r,
                "key": f"{r['key']} {DAGGER}" if r.get("disturbed") else r["key"],
                "prompt_speedup_iqr": f"{q[0]:.2f}–{q[2]:.2f}" if q else None,
            }
        )
    return out


def disturbed_footnote(rows: list[dict], several_runs: bool) -> list[str]:
    """Markdown lines under a table: what disturbed each † row, and how many of its requests."""
    lines = []
    for r in rows:
        if r.get("disturbed"):
            where = f"`{r['key']}`" + (f" [{r['run']}]" if several_runs else "")
            total = (r.get("prompts") or 0) + (r.get("errors") or 0)
            lines.append(
                f"{DAGGER} {where}: {r['disturbed']} of {total} requests disturbed: "
                + "; ".join(r.get("disturbed_reasons") or [])
                + "."
            )
    if lines:
        lines = [
            "",
            f"{DAGGER} Disturbed while it ran (the run folder's disturbed.json or result lines say so); drawn "
            "hollow or hatched in the figures. Its numbers understate what the system does undisturbed.",
            "",
            *(f"- {line}" for line in lines),
        ]
    return lines


def _mean_abs(rows: list[dict], field: str) -> str:
    errors = [abs(r[field]) for r in rows if r.get(field) is not None]
    return f"{sum(errors) / len(errors):.1%} over {len(errors)} variants" if errors else "n/a"


def build_report(paths: list[str | Path], out_dir: str | Path, command: str | None = None) -> Path:
    """Write out_dir/report.md, the figures (PNG) and their data (CSV); return the report's path.

    Engine bench runs and client runs (saguaro bench --url) may be mixed; each kind gets its own sections."""
    runs = load_runs(paths)
    clients = [run for run in runs if run.is_client]
    bench = [run for run in runs if not run.is_client]
    data_notes = bench_data(bench) if bench else None
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    md = ["# Saguaro benchmark report", ""]
    if any(run.environment.get("synthetic") for run in runs):
        md += [
            "> **Synthetic data.** These runs were generated by a statistical stand-in for the engine "
            "(tests/saguaro/fixtures), not measured on hardware. They exercise the report; they say nothing "
            "about real speed.",
            "",
        ]
    md += [
        f"Made with `{command or 'saguaro report ' + ' '.join(str(p) for p in paths)}` from "
        f"{plural(len(runs), 'run folder')}:",
        "",
    ]
    md += [f"- `{run.name}`: `{_command(run)}`" for run in runs] + [""]
    if data_notes is not None:
        md += _bench_sections(*data_notes, out_dir)
    if clients:
        md += serving_section(clients, out_dir)
    path = out_dir / REPORT
    path.write_text("\n".join(md), encoding="utf-8")
    return path


def _bench_sections(data: ReportData, notes: list[str], out_dir: Path) -> list[str]:
    n = len(data.runs)
    md = [
        "## Where it ran",
        "",
        format_table(_setup_rows(data.runs), list(_setup_rows(data.runs)[0]), markdown=True),
        "",
        "## Headline",
        "",
        "Throughput is generated tokens over the wall time of the generate calls (warm-up excluded); "
        "speedups compare with AR and with transformers' `generate` at the same temperature and batch size. "
        "`threads`: torch threads of the target's process (SSD's draft worker has its own core(s)). "
        "Latency per request as vLLM's serving benchmark: TTFT to the first token, TPOT = (E2EL − TTFT) / "
        "(tokens − 1), ITL = the gap between streamed chunks (a speculative round is one chunk); runs "
        "recorded before chunk times were kept have no ITL (-). `prompt_speedup_iqr`: the interquartile "
        "range of the per-prompt speedups over AR (each prompt's tokens/s over AR's on the same prompt).",
        "",
        _table(marked(data.rows), HEADLINE, n),
        *disturbed_footnote(data.rows, n > 1),
        "",
        "## Figures",
        "",
    ]
    for figure in FIGURES:
        md += markdown_section(figure, data, out_dir)
    md += [
        "## Measured vs simulated vs closed form",
        "",
        "Decode-phase speedup over AR (prefill excluded). The closed forms use each run's own α, hit rate and "
        "mean per-round times and have no term for per-round overhead; the simulator's timing model is fitted "
        "on the same runs' round records (in-sample). Errors are predicted / measured − 1.",
        "",
    ]
    if data.predictions:
        md += [
            _table(marked(data.predictions), PREDICTED, n),
            "",
            f"Mean absolute error: simulated {_mean_abs(data.predictions, 'simulated_error')}, "
            f"closed form {_mean_abs(data.predictions, 'closed_form_error')}.",
            "",
        ]
    else:
        md += ["_No sd or ssd variant with an AR baseline in these runs._", ""]
    md += [f"- {note}" for note in notes] + ([""] if notes else [])
    ceilings = ceiling_rows(data.runs, data.rows)
    if ceilings:
        md += [
            "## SSD against its Cor. 9 ceiling",
            "",
            "Cor. 9 bounds SSD/SD by (1 + T_SD)·E_hit / E_SD: T_SD = SD's drafting time per round over SSD's "
            "verify time (measured while the draft worker runs), E_hit = tokens per SSD sequence-round that hit "
            "the cache, E_SD = tokens per SD round, all from this run's rounds. `share` = measured SSD/SD "
            "(decode tokens/s) over the ceiling.",
            "",
            _table(marked(ceilings), CEILING, n),
            "",
        ]
        md += _gap_section(data, ceilings, n)
    if data.power_law:
        md += ["## Power-law fit of the miss rate", "", format_table(data.power_law, FITS, markdown=True), ""]
    by_task, tasks = category_pivot(category_rows(data.runs))
    if by_task:
        md += [
            "## Acceptance by task",
            "",
            "Each cell: α / tokens per round, over that task's prompts.",
            "",
            _table(by_task, ["key", *tasks], n),
            "",
        ]
    unavailable, errors = _unavailable(data.runs), error_rows(data.runs)
    if unavailable:
        md += ["## Not run", ""] + [f"- `{u['key']}`: {u['reason']}" for u in unavailable] + [""]
    if errors:
        md += ["## Failed prompts", "", _table(errors, ["key", "prompt_id", "error"], n), ""]
    return md


def _gap_section(data: ReportData, ceilings: list[dict], n: int) -> list[str]:
    """Where each SSD variant loses against its ceiling (saguaro.reporting.analysis.gap), right under the ceiling
    table."""
    gaps = gap_rows(data.runs, ceilings)
    if not gaps:
        return []
    return [
        "### Where the share goes",
        "",
        "Read each factor as the part of the ceiling one cause leaves (1 = no loss, below 1 a loss, above 1 a "
        "gain); they multiply to `share` exactly, so the smallest is where SSD loses most. "
        "`misses_tokens`: SSD's tokens per sequence-round over E_hit; `misses_backup`: SSD's time outside the "
        "backup of missed rounds; `start`: outside each call's first wait (the worker taking in the prompt); "
        "`waits`: outside the other waits for the worker (the link, a cache build outlasting the previous "
        "verify); `shapes`: SD's round at its own block lengths over at SSD's; `interference`: SD's round "
        "with SD's verify over with SSD's, at the same block lengths (the worker running next to the verify); "
        "`overhead`: the rest of each round (sampling, bookkeeping), SSD's against SD's; `rest`: the cut at EOS "
        "or the length limit and the mean batch, SSD's against SD's. "
        f"`p_hit_for_{round(TARGET_SHARE * 100)}`: the share of speculations from the cache (`p_hit` today) "
        f"that would give a {TARGET_SHARE:.0%} share with every other factor, E_miss/E_hit and `backup_ms` per "
        "missed round as measured (- where none would); `start_ms`, `link_ms` (the median wait in rounds "
        "whose cache was built within the previous verify), `overrun_rounds` (the share of rounds whose was "
        "not) and `T_p` say where the waits come from.",
        "",
        _table(marked(gaps), GAP, n),
        "",
        *(f"- {reading(g)}" for g in gaps),
        "",
    ]
