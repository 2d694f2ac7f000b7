"""How far one machine's measurement moves between repeats of the same `saguaro bench` run: the floor under any
prediction's error there.

Give two or more run folders of the same grid (the same command, run again). For each configuration (the
bench's variant key, e.g. `ssd K=3 B=8 geometric neural T=0 b=1`) found in more than one of them, it prints
the decode tokens/s each run measured (Σ emitted / Σ round time, as `saguaro validate engine` compares) and their
spread (largest over smallest, minus 1), then the same for the configuration's speed over its own run's SD
variants (those every run has, their rounds pooled). `saguaro validate engine` levels a calibration to each
run's SD variants, so the second spread is what leveling cannot take out: if SSD over SD itself moves by 12%
between two runs, no prediction from an SD run and a calibration can be held to 10% on that machine.

    python -m benchmarks.repeatability RUN_DIR RUN_DIR [RUN_DIR ...] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from saguaro.validation.measured import measured_tokens_per_s, variants


def spread(values: list[float]) -> float:
    """Largest over smallest, minus 1 (0 for values that agree)."""
    return max(values) / min(values) - 1.0


def table(runs: list[Path]) -> list[dict]:
    """One row per configuration (the bench's variant key) measured in two runs or more: its tokens/s, and its
    ratio to its run's SD variants (those of one K that every run has, their rounds pooled)."""
    found = {}
    for run in runs:
        # variants() prefixes each bench key with the folder's name: the key alone names the configuration (its
        # settings, not what the run did with them, as a label with the first round's fan-out would)
        found[run.name] = {key.split("/", 1)[1]: entry for key, entry in variants(run).items()}
        if not found[run.name]:
            raise ValueError(f"{run} has no decode rounds: give saguaro bench run folders")
    shared_sd = set.intersection(
        *(
            {
                name
                for name, (settings, _) in by_key.items()
                if settings["system"] == "sd" and not settings.get("adaptive")
            }
            for by_key in found.values()
        )
    )
    sd_speed = (
        {
            run: measured_tokens_per_s([r for name in shared_sd for r in by_key[name][1]])
            for run, by_key in found.items()
        }
        if shared_sd
        else {}
    )
    speeds: dict[str, dict[str, float]] = defaultdict(dict)  # configuration -> run -> tokens/s
    for run, by_key in found.items():
        for name, (_, rows) in by_key.items():
            speeds[name][run] = measured_tokens_per_s(rows)
    out = []
    for name, by_run in speeds.items():
        if len(by_run) < 2:
            continue
        row = {"configuration": name, "tokens_per_s": by_run, "spread": spread(list(by_run.values()))}
        if sd_speed:
            row["over_sd"] = {run: v / sd_speed[run] for run, v in by_run.items()}
            row["over_sd_spread"] = spread(list(row["over_sd"].values()))
        out.append(row)
    if not out:
        raise ValueError("no configuration appears in two of these runs: give repeats of one bench grid")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", type=Path, nargs="+", help="saguaro bench run folders of one grid, run again")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    try:
        if len(args.runs) < 2 or len({run.name for run in args.runs}) < len(args.runs):
            raise ValueError("give two run folders or more, with different names (repeats of one bench command)")
        rows = table(args.runs)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    names = [run.name for run in args.runs]
    print(
        "| configuration | "
        + " | ".join(f"tok/s {n}" for n in names)
        + " | spread | "
        + " | ".join(f"over SD {n}" for n in names)
        + " | spread |"
    )
    print("|---|" + "---|" * (2 * len(names) + 2))
    for r in rows:
        speeds = " | ".join(f"{r['tokens_per_s'][n]:.3f}" if n in r["tokens_per_s"] else "-" for n in names)
        over = r.get("over_sd", {})
        ratios = " | ".join(f"{over[n]:.3f}" if n in over else "-" for n in names)
        over_spread = f"{r['over_sd_spread']:.1%}" if "over_sd_spread" in r else "-"
        print(f"| {r['configuration']} | {speeds} | {r['spread']:.1%} | {ratios} | {over_spread} |")
    largest = max(rows, key=lambda r: r["spread"])
    print(f"\nlargest spread of tokens/s: {largest['spread']:.1%} ({largest['configuration']})")
    leveled = [r for r in rows if "over_sd_spread" in r and not r["configuration"].startswith("sd ")]
    if leveled:
        worst = max(leveled, key=lambda r: r["over_sd_spread"])
        print(
            f"largest spread over the run's SD (what leveling leaves): {worst['over_sd_spread']:.1%} "
            f"({worst['configuration']})"
        )
    if args.json:
        args.json.write_text(json.dumps({"runs": names, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
