"""The shipped hit tables (simulator/data/hit_tables.json) built from `saguaro bench` run folders of SD (or SSD)
runs (`saguaro models hit-tables`).

Every round record of this engine carries `outcome_rank`, so one SD run per (prompt set, temperature, C)
measures what any fan-out schedule would hit. Entries: the whole prompt set, and each of its tasks.

Several runs pool: the rounds of one (prompt set, T, C) are gathered prompt by prompt across the runs, and
where two runs measured the same prompt at the same T and C, the later run replaces the earlier one's rounds
of that prompt (so a longer rerun of a few prompts is not counted twice). `keep` carries over the entries of
an existing table that the runs do not measure (for when the run folders that made them are gone); the
table's `runs` then lists that table's runs too. Beside the table goes the α-model fitted to it
(simulator.alpha_hits), which carries what the tables share to pairs without measured ranks.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from pathlib import Path

import numpy as np

from saguaro.bench.environment import environment
from saguaro.bench.runfolder import RunDir
from simulator.alpha_hits import FIT_FILE, AlphaHitFit, fit_tables
from simulator.hits import TABLES, EmpiricalHit, from_records, load_tables
from simulator.records import parse_record
from theory.fanout import uniform_fanout

log = logging.getLogger(__name__)

ROW_FIELDS = ("accepted", "emitted", "outcome_rank", "prompt_index", "hit", "outcome_hit")


def rows_by_prompt(path: Path) -> tuple[dict, dict, dict]:
    """One run's decode rows split per prompt: {(prompt set, T, C): {prompt id: [row parts]}}, the task of
    each prompt id, and what the run was (models, lengths)."""
    run = RunDir.open(path)
    config = run.config
    task_of = {p.id: p.task for p in run.prompts() or []}
    settings = {r["key"]: r["settings"] for r in run.results() if "settings" in r}
    found: dict[tuple, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for row in run.rounds():  # parse_record ignores the bench's own keys (key, batch_index, prompt_ids)
        if row.get("phase") != "decode" or row.get("outcome_rank") is None:
            continue
        s = settings[row["key"]]
        key = (config["prompts"], float(s["temperature"]), float(s.get("C") or 1.0))
        ids = [row["prompt_ids"][i] for i in row["prompt_index"]]
        for pid in set(ids):  # a round mixes prompts (and tasks): keep each prompt's rows apart
            keep = [j for j, p in enumerate(ids) if p == pid]
            part = {**row, "batch_size": len(keep)}
            for name in ROW_FIELDS:
                if row.get(name) is not None:
                    part[name] = [row[name][j] for j in keep]
            found[key][pid].append(part)
    about = {
        k: config.get(k)
        for k in (
            "target",
            "draft",
            "dtype",
            "draft_int8",
            "target_quant",
            "draft_quant",
            "prompts",
            "n_prompts",
            "max_new_tokens",
            "batch_sizes",
            "Ks",
        )
    }
    return found, task_of, about


def pool(runs: list[Path]) -> tuple[dict, dict, list[dict]]:
    """Rows of every (prompt set, T, C) and prompt across the runs, a later run replacing an earlier one's
    rows of the same prompt and setting; each prompt's row list is tagged with the run that gave it."""
    pooled: dict[tuple, dict[str, tuple[str, list]]] = defaultdict(dict)
    tasks: dict[str, str] = {}
    abouts = []
    for path in runs:
        found, task_of, about = rows_by_prompt(path)
        tasks.update(task_of)
        abouts.append({"run": path.name, **about})
        for key, per_prompt in found.items():
            for pid, rows in per_prompt.items():
                if pid in pooled[key]:
                    log.info(
                        "%s: replaces %s's rounds of %s at T=%g C=%g",
                        path.name,
                        pooled[key][pid][0],
                        pid,
                        key[1],
                        key[2],
                    )
                pooled[key][pid] = (path.name, rows)
    return pooled, tasks, abouts


def entry(workload: str, T: float, C: float, per_prompt: dict[str, tuple[str, list]]) -> dict:
    rows = [r for _, (_, rs) in sorted(per_prompt.items()) for r in rs]
    runs = sorted({run for run, _ in per_prompt.values()})
    model = from_records([parse_record(r) for r in rows], source=f"{' + '.join(runs)}: {workload}, T={T:g}, C={C:g}")
    return {
        "workload": workload,
        "temperature": T,
        "C": C,
        "prompts": len(per_prompt),
        "rounds": sum(len(rs) for _, rs in per_prompt.values()),
        "runs": runs,
        "model": model.to_dict(),
    }


def build(runs: list[Path], keep: dict | None = None) -> dict:
    pooled, tasks, abouts = pool(runs)
    entries = []
    for (prompt_set, T, C), per_prompt in sorted(pooled.items()):
        by_task: dict[str, dict] = defaultdict(dict)
        for pid, value in per_prompt.items():
            by_task[tasks.get(pid, prompt_set)][pid] = value
        groups = [(prompt_set, per_prompt)]
        if len(by_task) > 1:  # one task: the whole set says it
            groups += [(f"{prompt_set}/{task}", part) for task, part in sorted(by_task.items())]
        for workload, part in groups:
            try:
                entries.append(entry(workload, T, C, part))
            except ValueError as err:  # a task too small to have both kinds of outcome
                log.warning("skipped %s T=%g C=%g: %s", workload, T, C, err)
    if keep:
        have = {(e["workload"], e["temperature"], e["C"]) for e in entries}
        kept = [e for e in keep.get("entries", []) if (e["workload"], e["temperature"], e["C"]) not in have]
        entries += kept
        named = {a["run"] for a in abouts}
        abouts += [{**a, "kept_from_table": True} for a in keep.get("runs", []) if a.get("run") not in named]
    entries.sort(key=lambda e: (e["workload"], e["temperature"], e["C"]))
    pair = " / ".join(sorted({f"{a['target']} + {a['draft']}" for a in abouts}))
    return {"pair": pair, "runs": abouts, "environment": environment(), "entries": entries}


def measured_hit_rate(model: dict, fanout: tuple[int, ...]) -> tuple[float, int]:
    """The share of the entry's own outcomes that `fanout` would have hit (outcome k hit iff rank < F_k),
    with the number of outcomes: no i.i.d. assumption on α, the measured outcome mix as it was."""
    m = EmpiricalHit.from_dict(model)
    K = len(m.rejected)
    if len(fanout) != K + 1:
        raise ValueError(f"the reference schedule needs K + 1 = {K + 1} fan-outs, got {len(fanout)}")
    parts = list(m.rejected) + [m.all_accepted]
    n = sum(c.total for c in parts)
    hits = sum(c.total * (1.0 - float(c.miss(np.array(F)))) for c, F in zip(parts, fanout, strict=True) if c.total)
    return hits / n, n


def markdown(table: dict, budget: int = 8) -> str:
    """One row per entry: prompts, sequence rounds, outcomes, mean α, the hit rate of the uniform schedule
    of `budget` over the K + 1 outcomes (with a Wilson 95% interval) and the fitted power law."""
    lines = []
    for e in table["entries"]:
        m = e["model"]
        K = m["K"]
        F = tuple(int(f) for f in uniform_fanout(K, budget))
        rate, n = measured_hit_rate(m, F)
        z = 1.96
        centre = (rate + z * z / (2 * n)) / (1 + z * z / n)
        half = z * np.sqrt(rate * (1 - rate) / n + z * z / (4 * n * n)) / (1 + z * z / n)
        fit = m.get("power_law") or {}
        r = f"{fit['r']:.2f} [{fit['r_ci95'][0]:.2f}, {fit['r_ci95'][1]:.2f}]" if fit else "-"
        alpha = np.nanmean(np.array(m["alpha"], dtype=float))
        lines.append(
            f"| {e['workload']} | {e['temperature']:g} | {e['C']:g} | {e.get('prompts', '-')} | "
            f"{e.get('rounds', '-')} | {m['outcomes']} | {alpha:.2f} | {rate:.3f} "
            f"[{centre - half:.3f}, {centre + half:.3f}] | {r} | {fit.get('scale', '-')} |"
        )
    head = (
        f"| workload | T | C | prompts | rounds | outcomes | mean α | hit rate, K 4 B {budget} uniform "
        f"{[int(f) for f in uniform_fanout(4, budget)]} [95%] | r [95%] | scale |\n"
        "|---|---|---|---|---|---|---|---|---|---|"
    )
    return head + "\n" + "\n".join(lines) + "\n"


def write(runs: list[Path], out: Path = TABLES, keep: Path | None = None, markdown_out: Path | None = None) -> dict:
    """Build the table from `runs` (with `keep`'s unmeasured entries) and write it to `out` (and its Markdown
    rows to `markdown_out`), and the α-model fitted to it beside it (alpha_hits.json: simulator.alpha_hits);
    ValueError where a run cannot be read or a table cannot be kept."""
    table = build([Path(run) for run in runs], load_tables(keep) if keep else None)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(table, indent=1) + "\n")
    try:
        write_alpha_model(table, out.with_name(FIT_FILE.name))
    except ValueError as err:  # too few settings for the α-model: the table stands on its own
        log.warning("the α-model beside %s was not fitted: %s", out, err)
    if markdown_out is not None:
        Path(markdown_out).write_text(markdown(table))
    return table


def write_alpha_model(table: dict, out: Path = FIT_FILE) -> AlphaHitFit:
    """The α-model fitted to a hit-table file's entries (simulator.alpha_hits.fit_tables), written to `out`."""
    fit = fit_tables(table, table.get("pair", "the measured pair"))
    Path(out).write_text(json.dumps(fit.to_dict(), indent=1) + "\n")
    return fit
