"""Re-run every committed held-out validation of issue 11 with today's simulator, and print one table.

Each round of reports/cpu-default-pair-validation measured its runs and calibrations once; the simulator and
the fit kept changing after. This script predicts every round's held-out runs again, each with the calibration
that round took for them (the rounds' own commands, in SETS), by calling scripts/validate_ssd.py and
scripts/validate_serving.py, and prints per round: the host (from the calibration's summary), the engine rows
within 10% (α sources left out, as validate_ssd.py counts them), the served TTFT/TPOT figures within 15%, and
then every held-out row (configuration, measured, predicted, error). Simulations only: it may run beside
anything (it takes about 35 s for all rounds here). Each run's configuration counts once in the total.

    python scripts/validation_audit.py --out runs/audit [--only stop30 stop38] [--markdown table.md]
"""

from __future__ import annotations

import argparse
import glob
import json
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "reports" / "cpu-default-pair-validation"
ENGINE_TOLERANCE, SERVED_TOLERANCE = 0.10, 0.15


@dataclass(frozen=True)
class Round:
    """One round's held-out runs and the calibration(s) it validated them with (paths under REPORT)."""

    name: str
    runs: tuple[str, ...]  # bench run folders (globs)
    calibrations: tuple[str, ...]
    served: str | None = None  # folder holding *-sd-reference-served and serving/ (the served SSD runs)
    served_calibrations: tuple[str, ...] = field(default=())  # default: the same as the engine rows'
    note: str = ""
    cpu: str = ""  # the host as its README gives it, where the calibration did not record the CPU flags yet


# The rounds' own commands (their READMEs), the first calibration each took unless it says otherwise.
# Each measurement once: stop 27's served runs with the calibration taken with them, not stop 30's again.
SETS = (
    Round("stop26", ("stop26/runs/*-k235", "stop26/runs/*-t07", "stop26/runs/*-b2", "stop26/runs/*-fast-backups"),
          ("stop26/calibration-1905.jsonl",), served="stop27/served",
          served_calibrations=("stop27/served/calibration-2146.jsonl",),
          note="steady host; served: stop 27's runs", cpu="AMD EPYC, AVX-512 BF16 (README)"),
    Round("stop26b", ("stop26/runs/*-k5ref", "stop26/runs/*-b4", "stop26/runs/*-k35-interleaved"),
          ("stop26/calibration-1842.jsonl",), note="steady host; the runs its earlier calibration was taken for",
          cpu="AMD EPYC, AVX-512 BF16 (README)"),
    Round("stop30", ("stop30/runs/*-k235", "stop30/runs/*-b4", "stop30/runs/*-t07", "stop30/runs/*-fast-backups",
                     "stop30/runs/*-b2"), ("stop30/calibration-before.jsonl",),
          note="steady host", cpu="AMD EPYC, AVX-512 BF16 (README)"),
    Round("stop31", ("stop31/runs/*-b2", "stop31/runs/*-b4", "stop31/runs/*-fast-backups"),
          ("stop31/runs/calibration.jsonl",), served="stop31/runs", note="host drifting",
          cpu="AMD EPYC, AVX-512 BF16 (README)"),
    Round("stop32", ("stop32/runs/*-b2", "stop32/runs/*-b4", "stop32/runs/*-fast-backups", "stop32/runs/*-k235"),
          ("stop32/runs/calibration.jsonl",), served="stop32/runs", note="host drifting",
          cpu="AMD EPYC, AVX-512 BF16 (README)"),
    Round("stop33", ("stop33/runs/*-b2", "stop33/runs/*-b4", "stop33/runs/*-fast-backups", "stop33/runs/*-k235"),
          ("stop33/runs/calibration.jsonl",), served="stop33/runs", note="slowest host, 12-30% slower by the end",
          cpu="AMD EPYC, AVX-512 BF16 (README)"),
    Round("stop35", ("stop35/runs/*-b1", "stop35/runs/*-b2"), ("stop35/runs/calibration.jsonl",),
          note="float32 (AVX2 only)"),
    Round("stop36", ("stop36/runs/*-k3-fast", "stop36/runs/*-k2", "stop36/runs/*-b4", "stop36/runs/*-t07"),
          ("stop36/runs/calibration.jsonl", "stop36/runs/calibration-t07.jsonl"), note="float32 (AVX2 only)"),
    Round("stop37", ("stop35/runs/*-b1", "stop37/runs/*-b2"),
          ("stop37/runs/calibration.jsonl", "stop37/runs/calibration-b2.jsonl"), served="stop37/runs",
          served_calibrations=("stop37/runs/calibration.jsonl",),
          note="float32 (AVX2 only); engine rows: its two calibrations pooled, as its README"),
    Round("stop38", ("stop38/runs/*-fast-backups", "stop38/runs/*-b2", "stop38/runs/*-b4"),
          ("stop38/runs/calibration.jsonl",), served="stop38/runs", note="host drifting"),
    Round("stop40", ("stop40/runs/*-k235", "stop40/runs/*-t07"), ("stop40/runs/calibration.jsonl",),
          note="the default `saguaro calibrate` (batch 1 and 4), at the code that resolves issue 11"),
)


def paths(patterns: tuple[str, ...]) -> list[str]:
    found = []
    for pattern in patterns:
        hits = sorted(glob.glob(str(REPORT / pattern)))
        if not hits:
            raise FileNotFoundError(f"no run matches {pattern} under {REPORT}")
        found += hits
    return found


def host(r: Round) -> str:
    """The CPU as the calibration's summary recorded it, with the bfloat16 flag that decides the dtype."""
    if r.cpu:
        return r.cpu
    summary = REPORT / Path(r.calibrations[0]).with_suffix(".summary.json")
    try:
        inputs = json.loads(summary.read_text()).get("inputs", {})
    except (OSError, ValueError):
        return "?"
    flags = inputs.get("cpu_flags") or ""
    kind = "AVX-512 BF16" if "avx512_bf16" in flags else "AVX2" if "avx2" in flags else "flags not recorded"
    return f"{inputs.get('cpu', '?')}, {kind}"


def run(script: str, args: list[str], out: Path) -> dict:
    """One validation script, its table to out.log, its JSON to out.json."""
    cmd = [sys.executable, str(ROOT / "scripts" / script), *args, "--json", str(out.with_suffix(".json"))]
    with out.with_suffix(".log").open("w") as log:
        done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    if done.returncode:
        raise RuntimeError(f"{script} failed (exit {done.returncode}): see {out.with_suffix('.log')}")
    return json.loads(out.with_suffix(".json").read_text())


def engine_rows(r: Round, out: Path, rounds: int) -> list[dict]:
    table = run("validate_ssd.py", [*paths(r.runs), "--calibration", *paths(r.calibrations),
                                    "--rounds", str(rounds)], out / f"{r.name}-engine")
    return [row for row in table["rows"] if not row["reference"]]


def served_errors(r: Round, out: Path) -> list[float]:
    if r.served is None:
        return []
    base = REPORT / r.served
    runs = sorted(glob.glob(str(base / "serving" / "*-serve-ssd-c1"))) + \
        sorted(glob.glob(str(base / "serving" / "*-serve-ssd-rates")))
    reference = sorted(glob.glob(str(base / "*-sd-reference-served")))
    table = run("validate_serving.py", [*runs, "--calibration", *paths(r.served_calibrations or r.calibrations),
                                        "--sd-run", *reference, "--server-rounds",
                                        str(base / "serving" / "serve-ssd-8-rounds.jsonl"), "--max-num-seqs", "8"],
                out / f"{r.name}-served")
    return [error for row in table["rows"] for error in row["error"].values()]


def drift(rows: list[dict]) -> str:
    """The range of the runs' measured level (their SD verifies' time over the calibration's fit:
    validate_ssd.py levels each run folder by it): how far the host's speed moved from the calibration's."""
    levels = [row["level"]["measured"]["target"] for row in rows if row.get("level")]
    return f"×{min(levels):.2f}-{max(levels):.2f}" if levels else "-"


def share(errors: list[float], tolerance: float) -> str:
    if not errors:
        return "-"
    within = sum(abs(e) <= tolerance for e in errors)
    return f"{within} of {len(errors)} (median {statistics.median(abs(e) for e in errors):.1%})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="folder for each validation's log and JSON")
    p.add_argument("--only", nargs="+", metavar="ROUND", help=f"rounds to run (default all: "
                   f"{' '.join(r.name for r in SETS)})")
    p.add_argument("--rounds", type=int, default=4000, help="simulated rounds per configuration (default 4000)")
    p.add_argument("--markdown", type=Path, help="also write the tables to this file")
    args = p.parse_args(argv)
    chosen = [r for r in SETS if not args.only or r.name in args.only]
    unknown = set(args.only or ()) - {r.name for r in SETS}
    if unknown:
        print(f"validation_audit: unknown round(s) {' '.join(sorted(unknown))}; known: "
              f"{' '.join(r.name for r in SETS)}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    summary = ["| round | host | SD verifies' time over the fit | engine rows within 10% | served within 15% | note |",
               "|---|---|---|---|---|---|"]
    detail = ["| round | configuration | measured tok/s | predicted | error |", "|---|---|---|---|---|"]
    engine_all, served_all, seen = [], [], set()  # the total counts each run's configuration once
    for r in chosen:
        print(f"validation_audit: {r.name}", file=sys.stderr)
        try:
            rows = engine_rows(r, args.out, args.rounds)
            served = served_errors(r, args.out)
        except (FileNotFoundError, RuntimeError) as err:  # a run not checked out, or a validation that failed
            print(f"validation_audit: {r.name}: {err}", file=sys.stderr)
            return 1
        engine_all += [row["error"] for row in rows if (row["run"], row["configuration"]) not in seen]
        seen |= {(row["run"], row["configuration"]) for row in rows}
        served_all += served
        engine = share([row["error"] for row in rows], ENGINE_TOLERANCE)
        summary.append(f"| {r.name} | {host(r)} | {drift(rows)} | {engine} "
                       f"| {share(served, SERVED_TOLERANCE)} | {r.note} |")
        for row in rows:
            mark = " (level source)" if row["level_source"] else ""
            detail.append(f"| {r.name} | {row['configuration']}{mark} | {row['measured']:.3f} | "
                          f"{row['predicted']:.3f} | {row['error']:+.1%} |")
    summary.append(f"| all | | | {share(engine_all, ENGINE_TOLERANCE)} | {share(served_all, SERVED_TOLERANCE)} | "
                   "each run's configuration once (a run two rounds validated: the first's) |")
    text = "\n".join(summary) + "\n\n" + "\n".join(detail) + "\n"
    print(text)
    if args.markdown:
        args.markdown.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
