"""Every committed held-out set predicted again with today's simulator (`saguaro validate audit`).

Each study of the simulator's predictions (reports/*/manifest.json with "held_out" sets) measured its runs and
calibrations once; the simulator and the fit may have changed since. The audit unpacks each study's runs,
predicts every set's held-out bench runs (`saguaro validate engine`) and served runs (`saguaro validate
serving`) with the calibration the set names, and tabulates per set: the host, how far the runs' SD verifies
ran from the calibration's fit, the engine rows within 10% (α sources left out) and the served TTFT/TPOT
figures within 15%; then the same per host speed (steady or drifting) and over all sets, each run's
configuration counted once; then every held-out row. Simulations only: it may run beside anything (about a
minute for every set on a 2-core CPU).
"""

from __future__ import annotations

import json
import logging
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from saguaro.validation.engine import TOLERANCE as ENGINE_TOLERANCE
from saguaro.validation.engine import validate_runs
from saguaro.validation.serving import TOLERANCE as SERVED_TOLERANCE
from saguaro.validation.serving import validate_served
from saguaro.validation.studies import REPORTS, HeldOutSet, held_out_sets, paths, unpack

log = logging.getLogger(__name__)


@dataclass
class SetResult:
    """One set's held-out engine rows and served errors."""

    held_out: HeldOutSet
    engine_rows: list[dict]
    served_errors: list[float] = field(default_factory=list)


def choose(sets: list[HeldOutSet], only: list[str] | None) -> list[HeldOutSet]:
    """The sets named in `only` (all when None); ValueError naming the unknown ones and the known."""
    if not sets:
        raise ValueError("no study under reports/ has held-out sets in its manifest.json")
    unknown = sorted(set(only or ()) - {s.name for s in sets})
    if unknown:
        raise ValueError(f"unknown held-out set(s) {' '.join(unknown)}; known: {' '.join(s.name for s in sets)}")
    return [s for s in sets if not only or s.name in only]


def audit_set(held_out: HeldOutSet, root: Path, out: Path, rounds: int) -> SetResult:
    """The set's engine rows (α sources left out) and served errors; each validation's JSON written to
    out/<set>-engine.json and out/<set>-served.json."""
    engine = validate_runs(paths(root, held_out.runs), paths(root, held_out.calibrations), rounds=rounds)
    (out / f"{held_out.name}-engine.json").write_text(json.dumps(engine.to_json(), indent=1) + "\n")
    result = SetResult(held_out, engine.held_out())
    served = held_out.served
    if served is not None:
        calibrations = served.calibrations or held_out.calibrations
        (sd_run,) = paths(root, (served.sd_run,))
        (server_rounds,) = paths(root, (served.server_rounds,))
        table = validate_served(
            paths(root, served.client_runs), paths(root, calibrations), sd_run, server_rounds, served.max_num_seqs
        )
        (out / f"{held_out.name}-served.json").write_text(json.dumps(table.to_json(), indent=1) + "\n")
        result.served_errors = table.errors()
    return result


def run_audit(
    reports: Path = REPORTS,
    out: Path | None = None,
    only: list[str] | None = None,
    rounds: int = 4000,
    work: Path | None = None,
) -> list[SetResult]:
    """Every chosen set predicted again; `work` is where the studies' archives are unpacked (`out` when None),
    `out` where each validation's JSON goes."""
    chosen = choose(held_out_sets(reports), only)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for held_out in chosen:
        log.info("audit: %s", held_out.name)
        root = unpack(reports, held_out.study, Path(work or out) / "runs")
        try:
            results.append(audit_set(held_out, root, out, rounds))
        except (ValueError, FileNotFoundError) as err:
            raise type(err)(f"{held_out.name}: {err}") from None
    return results


def drift(rows: list[dict]) -> str:
    """The range of the runs' measured level (their SD verifies' time over the calibration's fit: the engine
    validation levels each run folder by it): how far the host's speed moved from the calibration's."""
    levels = [row["level"]["measured"]["target"] for row in rows if row.get("level")]
    return f"×{min(levels):.2f}-{max(levels):.2f}" if levels else "-"


def share(errors: list[float], tolerance: float) -> str:
    if not errors:
        return "-"
    within = sum(abs(e) <= tolerance for e in errors)
    return f"{within} of {len(errors)} (median {statistics.median(abs(e) for e in errors):.1%})"


def _once(results: list[SetResult]) -> tuple[list[dict], list[float]]:
    """The engine rows with each run's configuration once (a run two sets validated: the first set's), and
    every served error."""
    rows, served, seen = [], [], set()
    for r in results:
        rows += [row for row in r.engine_rows if (row["run"], row["configuration"]) not in seen]
        seen |= {(row["run"], row["configuration"]) for row in r.engine_rows}
        served += r.served_errors
    return rows, served


def _by_strategy(rows: list[dict]) -> str:
    within: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for row in rows:
        counts = within[row["configuration"].split()[0]]
        counts[0] += abs(row["error"]) <= ENGINE_TOLERANCE
        counts[1] += 1
    return ", ".join(
        f"{name.upper()} {a}/{n}" for name in ("ar", "sd", "ssd") if name in within for a, n in [within[name]]
    )


def markdown(results: list[SetResult]) -> str:
    """The summary per set, per host speed and over all; then every held-out row."""
    summary = [
        "| set | host | SD verifies' time over the fit | engine rows within 10% | served within 15% | note |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        s = r.held_out
        summary.append(
            f"| {s.name} | {s.host} | {drift(r.engine_rows)} | "
            f"{share([row['error'] for row in r.engine_rows], ENGINE_TOLERANCE)} | "
            f"{share(r.served_errors, SERVED_TOLERANCE)} | {s.note} |"
        )
    groups = ["| hosts | engine rows within 10% | of them by strategy | served within 15% |", "|---|---|---|---|"]
    for speed in ("steady", "drifting"):
        part = [r for r in results if r.held_out.host_speed == speed]
        if part:
            rows, served = _once(part)
            groups.append(
                f"| {speed} ({len(part)} sets) | {share([r['error'] for r in rows], ENGINE_TOLERANCE)} | "
                f"{_by_strategy(rows)} | {share(served, SERVED_TOLERANCE)} |"
            )
    rows, served = _once(results)
    groups.append(
        f"| all ({len(results)} sets) | {share([r['error'] for r in rows], ENGINE_TOLERANCE)} | "
        f"{_by_strategy(rows)} | {share(served, SERVED_TOLERANCE)} |"
    )
    detail = ["| set | configuration | measured tok/s | predicted | error |", "|---|---|---|---|---|"]
    for r in results:
        for row in r.engine_rows:
            mark = " (level source)" if row["level_source"] else ""
            detail.append(
                f"| {r.held_out.name} | {row['configuration']}{mark} | {row['measured']:.3f} | "
                f"{row['predicted']:.3f} | {row['error']:+.1%} |"
            )
    note = "Each run's configuration counts once in a group's total (a run two sets validated: the first set's)."
    return "\n".join(summary) + "\n\n" + "\n".join(groups) + "\n\n" + note + "\n\n" + "\n".join(detail) + "\n"
