"""What a `saguaro bench` run folder measured, read for `saguaro validate engine`: each variant's settings and
decode records, its decode tokens/s (over all its rounds and over its full-batch rounds), SSD's hit rate as the
simulator counts it, the prompt-lookup backup's own acceptance, and the label a table prints for it."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from saguaro.bench.runfolder import RunDir
from simulator.hits import alpha_per_position, is_draft_sourced
from simulator.records import parse_record


def variants(path: Path) -> dict[str, tuple[dict, list]]:
    """key -> (settings, decode records in order), the key prefixed with the run folder's name."""
    run = RunDir.open(path)
    settings = {
        r["key"]: r["settings"] | {"system": r["system"], "run": path.name} for r in run.results() if "settings" in r
    }
    records: dict[str, list] = defaultdict(list)
    for row in run.rounds():  # parse_record ignores the bench's own keys (key, batch_index, prompt_ids)
        if row.get("phase") == "decode":
            records[row["key"]].append(parse_record(row))
    return {f"{path.name}/{k}": (settings[k], v) for k, v in records.items() if k in settings}


def lookup_alpha(rows: list) -> float:
    """α of the prompt-lookup backup's own speculations in these rounds (the rows that missed): an SD run
    cannot tell it, so a lookup configuration is given its own (marked in the table)."""
    accepted = rejected = 0
    for r in rows:
        for i, k in enumerate(r.accepted):
            if not is_draft_sourced(r, i):
                accepted += k
                rejected += k < r.K
    return accepted / max(1, accepted + rejected)


def lookup_alphas(rows: list) -> tuple[float, ...] | None:
    """The lookup backup's acceptance per position in these rounds: α_i = P(x_i accepted | x_1..x_{i−1} were),
    over the rows whose speculation it made. None where a position was never reached."""
    alphas = alpha_per_position(rows, draft_sourced=False)
    return tuple(alphas) if alphas and all(np.isfinite(alphas)) else None


def measured_tokens_per_s(rows: list) -> float:
    return sum(sum(r.emitted) for r in rows) / sum(r.round_ms for r in rows) * 1e3


def full_batch_tokens_per_s(rows: list) -> float | None:
    """Tokens/s over the rounds at the configuration's batch size only, None when every round ran at it. `saguaro
    bench` runs fixed batches, whose last rows run on alone until the batch is done (rows of one batch finished
    27-34 rounds apart in the batch-4 runs of 2026-12-04, reports/2026-12-cpu-prediction-accuracy); the
    simulator's closed loop refills a finished row at once, so these rounds are what it predicts."""
    batch = rows[0].batch_size
    full = [r for r in rows if r.batch_size == batch]
    return None if len(full) == len(rows) else measured_tokens_per_s(full)


def measured_hit_rate(rows: list) -> float | None:
    """SSD's hit rate in these rounds as the simulator counts it: outcomes the next round found in the cache
    over outcomes looked up (the engine's `outcome_hit`; a sequence's first round has no cache and is not
    counted). None for other strategies."""
    flags = [h for r in rows for h in (r.outcome_hit or []) if h is not None]
    return sum(flags) / len(flags) if flags else None


def label(settings: dict, rows: list) -> str:
    s = settings
    parts = [s["system"], f"T={s['temperature']:g}", f"b={rows[0].batch_size}"]
    if s.get("adaptive"):
        parts.append("K=auto")
    elif s.get("K"):
        parts.append(f"K={s['K']}")
    if s["system"] == "ssd" and s.get("budget") == "auto":
        parts += [f"B=auto {s.get('schedule') or 'uniform'}", s.get("backup") or "neural"]
    elif s["system"] == "ssd":
        fanout = rows[0].fanout
        parts += [
            f"{s.get('schedule') or 'uniform'} B={sum(fanout)} F={'-'.join(map(str, fanout))}",
            s.get("backup") or "neural",
        ]
    return " ".join(parts)
