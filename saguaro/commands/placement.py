"""`saguaro plan --placement`: does SSD pay here? SSD with its draft on a device (or core) of its own against
AR and SD with everything for the target, at the SLO given, for one of three sources:

- presets (predicted): --pair and --hardware with --devices N (default: the pair's TP + 1, the paper's setting);
- this machine, calibrated (predicted): --fit CAL.jsonl, `saguaro calibrate`'s records of the split (target on
  one core, draft worker on another), with --fit-all-cores CAL_N.jsonl from `saguaro calibrate --threads N`
  for the target with every core; α and hits from --calibrate SD_RECORDS (or the defaults);
- this machine, measured: --runs RUN_DIR... of `saguaro bench` (SSD at --threads 1, AR and SD at --threads N):
  each strategy's best variant, as measured.

A few lines: each side's tokens/s and latency at the SLO's percentile, labelled measured or predicted, and
which wins by how much. On presets, --compare-forwards answers the same question twice, with graph-captured
forwards (the engine's `--compile on`) and with eager ones, and says what compiling buys the winner.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from saguaro.formatting import write_json


def add_flags(g) -> None:
    g.add_argument(
        "--placement",
        action="store_true",
        help="answer where SSD pays instead of a capacity plan (no --rate needed): SSD with a device or "
        "core of its own against AR and SD with everything for the target",
    )
    g.add_argument(
        "--devices",
        type=int,
        help="--placement on presets: devices in all (GPUs, or CPU cores; default: the pair's TP + 1)",
    )
    g.add_argument(
        "--fit-all-cores",
        metavar="RECORDS",
        nargs="+",
        help="--placement with --fit: saguaro calibrate --threads N records, the target with every core",
    )
    g.add_argument(
        "--compare-forwards",
        action="store_true",
        help="--placement on presets: answer with graph-captured forwards (--compile on) and with eager "
        "ones, and say what compiling buys",
    )
    g.add_argument(
        "--runs",
        metavar="RUN_DIR",
        nargs="+",
        type=Path,
        help="--placement, measured: saguaro bench run folders (SSD split; AR and SD with every core)",
    )


def _best(rows: list[dict]) -> dict | None:
    """The fastest side that ran and meets the SLO (None: none does)."""
    ok = [r for r in rows if r["tok/s"] == r["tok/s"] and r["meets_slo"]]
    return max(ok, key=lambda r: r["tok/s"]) if ok else None


def _verdict(rows: list[dict]) -> str:
    """Which side wins (the fastest that meets the SLO) and by how much over each of the others."""
    best = _best(rows)
    if best is None:
        return "none meets the SLO: relax it"
    ran = [r for r in rows if r["tok/s"] == r["tok/s"]]
    by = ", ".join(
        f"{best['tok/s'] / r['tok/s']:.2f}× {r['strategy'].upper()}" + ("" if r["meets_slo"] else " (misses the SLO)")
        for r in ran
        if r is not best
    )
    return f"{best['strategy'].upper()} wins" + (f": {by} tokens/s" if by else "")


def _lines(label: str, rows: list[dict], percentile: int) -> list[str]:
    out = [label]
    for r in rows:
        if r["tok/s"] != r["tok/s"]:
            out.append(f"  {r['strategy'].upper():4s} {r['where']}: cannot run ({r['reason']})")
            continue
        slo = "" if r["meets_slo"] else "  misses the SLO"
        latency = f", TPOT p{percentile} {r['tpot_ms']:.1f} ms" if r.get("tpot_ms") == r.get("tpot_ms") else ""
        out.append(f"  {r['strategy'].upper():4s} {r['tok/s']:8.2f} tok/s{latency}  {r['settings']}; {r['where']}{slo}")
    out.append(f"  -> {_verdict(rows)}")
    return out


def _simulated_rows(outcomes, percentile: int) -> list[dict]:
    rows = []
    for o in outcomes:
        settings = ""
        if o.point is not None:
            parts = [f"K {o.point['K']}"] if o.point["K"] else []
            if o.result is not None and o.result.settings.get("fanout"):
                parts.append(f"fan-out {o.result.settings['fanout']}")
            settings = ", ".join(parts) or "one token a step"
        rows.append(
            {
                "strategy": o.option.strategy.value,
                "where": o.option.where,
                "settings": settings,
                "tok/s": o.tokens_per_s,
                "meets_slo": o.meets,
                "reason": o.reason,
                "tpot_ms": o.result.tpot_ms[f"p{percentile}"] if o.result is not None else float("nan"),
            }
        )
    return rows


def _targets(args) -> list:
    from simulator import LatencyTarget

    limits = {m: getattr(args, f"{m}_ms") for m in ("ttft", "tpot", "itl", "e2el") if getattr(args, f"{m}_ms")}
    if args.target_ms is not None:
        limits.setdefault(args.metric, args.target_ms)
    return [LatencyTarget(m, args.percentile, ms) for m, ms in limits.items()]


def _presets(args) -> tuple[str, list[dict]]:
    from saguaro.commands.simulate import scenario_from_args
    from simulator.placement import compare, preset_options
    from simulator.presets import PAIRS

    scenario = scenario_from_args(args, None)
    devices = args.devices or (args.tp or PAIRS[args.pair][2]) + 1
    outcomes = compare(preset_options(scenario, devices), args.batch[0], _targets(args))
    t = scenario.timing
    label = (
        f"predicted ({args.hardware} preset, engine {args.engine}): {t.target.model.name} + {t.draft.model.name} "
        f"on {devices} × {t.target.hardware.name}, batch {args.batch[0]}"
    )
    return label, _simulated_rows(outcomes, args.percentile)


def _calibrated(args) -> tuple[str, list[dict]]:
    from dataclasses import replace

    from saguaro.calibration.files import fit_all
    from saguaro.commands.simulate import scenario_from_args
    from simulator.placement import Option, compare
    from theory import Strategy

    split = scenario_from_args(args, None)
    options = [Option(Strategy.SSD, "target on one core, draft worker on another (calibrated)", split)]
    if args.fit_all_cores:
        every = replace(split, timing=fit_all(args.fit_all_cores))
        options += [
            Option(Strategy.SD, "target and draft with every core (calibrated)", every),
            Option(Strategy.AR, "target with every core (calibrated)", every),
        ]
    else:
        options += [
            Option(Strategy.SD, "target and draft on one core (no --fit-all-cores)", split),
            Option(Strategy.AR, "target on one core (no --fit-all-cores)", split),
        ]
    outcomes = compare(options, args.batch[0], _targets(args))
    label = f"predicted (this machine, calibrated: {' '.join(args.fit)}), batch {args.batch[0]}"
    return label, _simulated_rows(outcomes, args.percentile)


def measured_rows(runs: list[Path], percentile: int, targets, batch: int = 1) -> list[dict]:
    """Each strategy's best variant at `batch` in the run folders: SSD split at its threads, AR and SD at the
    most threads they ran with."""
    variants = []
    for run in runs:
        path = Path(run) / "summary.json"
        if not path.is_file():
            raise ValueError(f"{run} has no summary.json: give saguaro bench run folders")
        summary = json.loads(path.read_text())
        variants += [
            v
            for v in summary["variants"]
            if v.get("tokens_per_s") and v["system"] in ("ar", "sd", "ssd") and (v.get("batch") or 1) == batch
        ]
    if not variants:
        raise ValueError(
            f"no AR, SD or SSD results at batch {batch} in {' '.join(map(str, runs))}: give saguaro "
            f"bench run folders (or --batch)"
        )
    most = (
        max(v.get("threads") or 1 for v in variants if v["system"] != "ssd")
        if any(v["system"] != "ssd" for v in variants)
        else None
    )
    rows = []
    for system in ("ssd", "sd", "ar"):
        pool = [v for v in variants if v["system"] == system and (system == "ssd" or (v.get("threads") or 1) == most)]
        if not pool:
            continue
        best = max(pool, key=lambda v: v["tokens_per_s"])
        threads = best.get("threads") or 1
        where = (
            f"target on {threads} core(s), draft worker on another"
            if system == "ssd"
            else f"{threads} thread(s) for the target" + (" and its draft" if system == "sd" else "")
        )
        tpot = best.get(f"p{percentile}_tpot_ms", float("nan"))
        meets = all(best.get(f"p{t.percentile}_{t.metric}_ms", float("inf")) <= t.ms for t in targets)
        rows.append(
            {
                "strategy": system,
                "where": where,
                "settings": best["key"],
                "tok/s": best["tokens_per_s"],
                "meets_slo": meets,
                "reason": "",
                "tpot_ms": tpot,
                "run": best.get("run"),
            }
        )
    return rows


def _compare_forwards(args: argparse.Namespace) -> int:
    """The preset answer with graph-captured and with eager forwards, and what compiling buys the winner."""
    from copy import copy

    from simulator.presets import engine_preset

    if args.runs or args.fit:
        raise ValueError("--compare-forwards compares presets (--pair, --hardware): drop --runs and --fit")
    if engine_preset(args.engine).eager:
        raise ValueError(
            f"engine {args.engine} is eager by definition: --compare-forwards needs an engine whose "
            f"forwards can be either (saguaro, reference)"
        )
    blocks = []
    for eager in (False, True):
        variant = copy(args)
        variant.eager = eager
        label, rows = _presets(variant)
        blocks.append((label + ("; eager forwards" if eager else "; graph-captured forwards (--compile on)"), rows))
    (_, graphs), (_, eager_rows) = blocks
    best_graphs, best_eager = _best(graphs), _best(eager_rows)
    if best_graphs is None:
        verdict = "no placement meets the SLO even with graph-captured forwards: relax it"
    elif best_eager is None:
        verdict = (
            f"only graph-captured forwards meet the SLO: compile ({best_graphs['strategy'].upper()}, "
            f"{best_graphs['tok/s']:.1f} tok/s)"
        )
    else:
        verdict = (
            f"graph-captured forwards: {best_graphs['strategy'].upper()} {best_graphs['tok/s']:.1f} tok/s "
            f"against eager {best_eager['strategy'].upper()} {best_eager['tok/s']:.1f}: compiling pays "
            f"{best_graphs['tok/s'] / best_eager['tok/s']:.2f}×"
        )
    if args.json:
        write_json(
            args.json,
            {
                "blocks": [{"label": label, "rows": rows, "verdict": _verdict(rows)} for label, rows in blocks],
                "verdict": verdict,
                "slo": [str(t) for t in _targets(args)],
            },
        )
    if args.json != "-":
        for label, rows in blocks:
            print("\n".join(_lines(label, rows, args.percentile)))
        print(f"=> {verdict}")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.compare_forwards:
        return _compare_forwards(args)
    if args.runs:
        rows = measured_rows(args.runs, args.percentile, _targets(args), args.batch[0])
        label = f"measured (this machine: {' '.join(p.name for p in args.runs)})"
    elif args.fit:
        label, rows = _calibrated(args)
    else:
        label, rows = _presets(args)
    if args.json:
        write_json(
            args.json,
            {"label": label, "rows": rows, "verdict": _verdict(rows), "slo": [str(t) for t in _targets(args)]},
        )
    if args.json != "-":
        print("\n".join(_lines(label, rows, args.percentile)))
    return 0
