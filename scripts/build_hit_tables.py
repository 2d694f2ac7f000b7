"""Build simulator/data/hit_tables.json from `saguaro bench` run folders of SD (or SSD) runs.

Every round record of this engine carries `outcome_rank`, so one SD run per (prompt set, temperature, C)
measures what any fan-out schedule would hit. Entries: the whole prompt set, and each of its tasks.

    python scripts/build_hit_tables.py RUN_DIR [RUN_DIR ...] [--out simulator/data/hit_tables.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from saguaro.environment import environment
from saguaro.runfolder import RunDir
from simulator.hits import TABLES, from_records
from simulator.records import parse_record


def entries_of(path: Path) -> tuple[list[dict], dict]:
    run = RunDir.open(path)
    config = run.config
    task_of = {p.id: p.task for p in run.prompts() or []}
    by_task = len(set(task_of.values())) > 1  # one task: the whole set says it
    settings = {r["key"]: r["settings"] for r in run.results() if "settings" in r}
    groups: dict[tuple, list] = defaultdict(list)
    for row in run.rounds():  # parse_record ignores the bench's own keys (key, batch_index, prompt_ids)
        if row.get("phase") != "decode" or row.get("outcome_rank") is None:
            continue
        s = settings[row["key"]]
        key = (s["temperature"], s.get("C") or 1.0)
        groups[(config["prompts"], *key)].append(parse_record(row))
        if not by_task:
            continue
        # by task: keep only the rows of that task (a round mixes prompts of several tasks)
        tasks = [task_of[row["prompt_ids"][i]] for i in row["prompt_index"]]
        for task in set(tasks):
            keep = [i for i, t in enumerate(tasks) if t == task]
            part = {**row, "batch_size": len(keep)}
            for name in ("accepted", "emitted", "outcome_rank", "prompt_index", "hit", "outcome_hit"):
                if row.get(name) is not None:
                    part[name] = [row[name][i] for i in keep]
            groups[(f"{config['prompts']}/{task}", *key)].append(parse_record(part))
    entries = []
    for (workload, T, C), records in sorted(groups.items()):
        try:
            model = from_records(records, source=f"{path.name}: {workload}, T={T:g}, C={C:g}")
        except ValueError as err:  # a task too small to have both kinds of outcome
            print(f"skipped {workload} T={T:g} C={C:g}: {err}", file=sys.stderr)
            continue
        entries.append({"workload": workload, "temperature": T, "C": C, "model": model.to_dict()})
    about = {k: config.get(k) for k in ("target", "draft", "dtype", "draft_int8", "max_new_tokens", "n_prompts")}
    return entries, about


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--out", type=Path, default=TABLES)
    args = p.parse_args(argv)
    entries, abouts = [], []
    for run in args.runs:
        try:
            found, about = entries_of(run)
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        entries += found
        abouts.append({"run": run.name, **about})
    pair = " / ".join(sorted({f"{a['target']} + {a['draft']}" for a in abouts}))
    table = {"pair": pair, "runs": abouts, "environment": environment(), "entries": entries}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(table, indent=1) + "\n")
    for e in entries:
        m = e["model"]
        fit = m.get("power_law") or {}
        print(f"{e['workload']:<32} T={e['temperature']:<4g} C={e['C']:<4g} outcomes={m['outcomes']:<5} "
              f"alpha={m['alpha']} r={fit.get('r')} r_ci95={fit.get('r_ci95')} scale={fit.get('scale')}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
