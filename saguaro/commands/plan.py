"""`saguaro plan`: the best strategy and settings for latency targets (an SLO) and an arrival rate, and how
many replicas and accelerators it takes, with the simulated figures that justify it (no torch).

Grid points that cannot run (context window, tensor parallelism, memory per device) are dropped and listed
with the reason. Every other point is simulated at full load (closed loop at its batch size); points that
meet every target are sized for the arrival rate (with --headroom), and the best few are checked with
Poisson arrivals at rate / replicas per replica, adding replicas until every target holds.

With --placement it answers where SSD pays instead (saguaro/commands/placement.py): SSD with a device or
core of its own against AR and SD with everything for the target, at the SLO, on presets (predicted), this
machine's calibration (predicted) or its bench runs (measured).

Targets: --metric M --target-ms X, and/or --ttft-ms, --tpot-ms, --itl-ms, --e2el-ms, all at --percentile.
Metrics are theory.latency's (as vLLM's serving benchmark): ttft (arrival to first token), itl (gap between
successive streamed chunks; a speculative round is one gap), tpot ((e2el − ttft) / (tokens − 1)), e2el.
The output starts with the assumptions the plan rests on; a latency marked ! violates its target. Latency
columns are in ms, or in s where their values reach 10 s (the header says which); JSON always in ms and
echoes the inputs (pair, hardware, timing source, α, hit model, seed, the grid, the workload). Lists are
space-separated: --K 2 4 6 --batch 1 4 16.
"""

from __future__ import annotations

import argparse

from saguaro.cli import HelpFormatter
from saguaro.commands.placement import add_flags as add_placement_flags
from saguaro.commands.simulate import add_scenario_flags, int_or_auto, scenario_inputs
from saguaro.formatting import Progress, latency_unit, number, table, write_json

METRICS = ("ttft", "tpot", "itl", "e2el")  # theory.latency.METRICS (not imported here: the CLI starts light)
SETTINGS = ["strategy", "K", "budget", "fanout", "backup", "batch", "C"]
FIGURES = ["capacity_rps", "replicas", "accelerators", "tok/s/acc"]
SOURCED = ("alpha", "r", "scale", "p_hit")  # flags whose defaults the assumptions call assumed


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "plan",
        help="capacity plan: best SD/SSD settings and replicas for latency targets",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    g = p.add_argument_group("demand and targets")
    g.add_argument(
        "--rate",
        type=float,
        help="arrival rate, requests per second (all replicas); needed for a capacity plan, not with --placement",
    )
    g.add_argument(
        "--metric",
        choices=METRICS,
        default="itl",
        help="the primary metric, limited by --target-ms: itl (per streamed chunk), tpot, ttft or e2el",
    )
    g.add_argument("--target-ms", type=float, help="the primary metric's limit in milliseconds")
    for metric in METRICS:
        g.add_argument(f"--{metric}-ms", type=float, metavar="MS", help=f"a limit on {metric} as well (ms)")
    g.add_argument("--percentile", type=int, choices=[50, 90, 99], default=99, help="of every target")
    g.add_argument(
        "--objective",
        choices=["accelerators", "latency"],
        default="accelerators",
        help="fewest accelerators or lowest primary latency among plans that meet the SLO",
    )
    g.add_argument("--headroom", type=float, default=0.85, help="plan for this fraction of capacity")
    g.add_argument("--check-top", type=int, default=3, help="open-loop checks of the best N")
    g.add_argument("--check-requests", type=int, default=300, help="requests per open-loop check")
    g = p.add_argument_group("candidates (space-separated lists)")
    g.add_argument("--strategy", nargs="+", default=["ar", "sd", "ssd"], choices=["ar", "sd", "ssd"], help="strategies")
    g.add_argument(
        "-K",
        "--K",
        dest="K",
        type=int_or_auto,
        nargs="+",
        default=[2, 4, 6],
        help="draft tokens per round (auto: the fastest K in 1..8, as the engine's K auto settles)",
    )
    g.add_argument(
        "--budget",
        type=int_or_auto,
        nargs="+",
        default=[6, 12, 24],
        help="SSD fan-out budgets B = Σ F_k (auto: the engine's rule, the build within 90%% of a verify)",
    )
    g.add_argument(
        "--backup", nargs="+", default=["neural", "random"], choices=["neural", "random", "lookup"], help="SSD backups"
    )
    g.add_argument("--batch", type=int, nargs="+", default=[1, 4, 16], help="max batch per replica")
    g.add_argument("--C", type=float, nargs="+", default=[1.0], help="Saguaro constants (C ≠ 1 needs --saguaro-table)")
    add_scenario_flags(p, rounds=2000)
    g = p.add_argument_group("placement: where SSD pays (saguaro/commands/placement.py)")
    add_placement_flags(g)
    g = p.add_argument_group("output")
    g.add_argument("--json", metavar="PATH", help="also write the plan and its inputs as JSON ('-' for stdout only)")
    g.add_argument("--markdown", action="store_true", help="tables in Markdown")
    g.add_argument("--show", type=int, default=10, help="candidates to list")
    p.set_defaults(_defaults={name: p.get_default(name) for name in SOURCED})
    return p


def targets_from_args(args: argparse.Namespace) -> list:
    """The SLO: --metric's limit first (the primary target: --target-ms or --<metric>-ms; without one, the first
    given of ttft, tpot, itl, e2el), then the other --<metric>-ms."""
    from simulator import LatencyTarget

    limits = {m: getattr(args, f"{m}_ms") for m in METRICS if getattr(args, f"{m}_ms") is not None}
    if args.metric in limits:  # the primary target comes first
        limits = {args.metric: limits[args.metric], **limits}
    if args.target_ms is not None:
        if limits.get(args.metric, args.target_ms) != args.target_ms:
            raise ValueError(
                f"--target-ms {args.target_ms:g} and --{args.metric}-ms {limits[args.metric]:g} set "
                f"two limits on {args.metric}: give one"
            )
        limits = {args.metric: args.target_ms, **limits}
    if not limits:
        raise ValueError(
            "give a latency target: --target-ms MS (on --metric, default itl) or --ttft-ms, "
            "--tpot-ms, --itl-ms, --e2el-ms"
        )
    return [LatencyTarget(m, args.percentile, ms) for m, ms in limits.items()]


def _latencies(result, percentile: int) -> dict:
    from simulator.plan import latency_ms

    return {f"{m}_p{percentile}_ms": latency_ms(result, m, percentile) for m in METRICS}


def _row(candidate, targets, percentile: int) -> dict:
    """A candidate's settings, every latency at full load, the primary's checked value and the sizing (numbers)."""
    primary = targets[0]
    return {
        **{k: candidate.settings.get(k) for k in SETTINGS},
        **_latencies(candidate.screened, percentile),
        f"checked_{primary.metric}_p{primary.percentile}_ms": candidate.checked_latency_ms,
        "capacity_rps": candidate.capacity_per_s,
        "replicas": candidate.replicas,
        "accelerators": candidate.accelerators,
        "tok/s/acc": candidate.screened.tokens_per_s_per_accelerator,
    }


def _limits(targets) -> dict[str, float]:
    """Each target's limit (ms) by the columns that show its metric."""
    limits = {}
    for t in targets:
        limits[f"{t.metric}_p{t.percentile}_ms"] = limits[f"checked_{t.metric}_p{t.percentile}_ms"] = t.ms
    return limits


def slo_table(candidate, targets, percentile: int) -> tuple[list[dict], list[str]]:
    """Every metric at the percentile: its limit, at full load and in the open-loop check ('!' = violated), in
    one unit for the table (ms, or s once a value reaches 10 s); rows and columns as printed."""
    from simulator.plan import latency_ms

    limits = {t.metric: t.ms for t in targets}
    raw = []
    for m in METRICS:
        full = latency_ms(candidate.screened, m, percentile)
        checked = None if candidate.checked is None else latency_ms(candidate.checked, m, percentile)
        raw.append((m, limits.get(m), full, checked))
    unit, factor, decimals = latency_unit([v for row in raw for v in row[1:] if v is not None])
    columns = ["metric", f"limit_{unit}", f"full_load_{unit}", f"checked_{unit}"]
    rows = [
        dict(
            zip(
                columns,
                (
                    f"{m} p{percentile}",
                    number(limit, decimals, factor),
                    number(full, decimals, factor, limit),
                    number(checked, decimals, factor, limit),
                ),
                strict=True,
            )
        )
        for m, limit, full, checked in raw
    ]
    return rows, columns


def _describe(candidate, targets, args) -> list[str]:
    from simulator.plan import EXTRA_REPLICAS

    settings = {k: v for k, v in candidate.settings.items() if k in SETTINGS or k == "miss_policy"}
    sizing = {
        "replicas": candidate.replicas,
        "accelerators/replica": candidate.accelerators // candidate.replicas,
        "accelerators": candidate.accelerators,
        "capacity_rps": candidate.capacity_per_s,
        "tok/s/acc": candidate.screened.tokens_per_s_per_accelerator,
    }
    per_replica = args.rate / candidate.replicas
    where = (
        "not checked"
        if candidate.checked is None
        else (
            f"Poisson arrivals at {per_replica:.3g} requests/s per replica"
            + ("" if candidate.passed else f", the last of {EXTRA_REPLICAS + 1} replica counts tried")
        )
    )
    rows, columns = slo_table(candidate, targets, args.percentile)
    return [
        table([{**settings, **sizing}], [*settings, *sizing], markdown=args.markdown),
        "",
        f"SLO at p{args.percentile}: full load = closed loop at batch {candidate.settings['batch']}; "
        f"checked = {where}; ! = violated",
        table(rows, columns, markdown=args.markdown),
    ]


def run(args: argparse.Namespace) -> int:
    from saguaro.commands.assumptions import assumptions, left_aligned
    from saguaro.commands.simulate import _grid, scenario_from_args
    from simulator import plan

    if args.placement:
        from saguaro.commands.placement import run as placement

        return placement(args)
    if args.rate is None:
        raise ValueError("a capacity plan needs --rate (requests per second); or ask --placement where SSD pays")
    targets = targets_from_args(args)
    scenario = scenario_from_args(args, None)
    if scenario.output_len is None:
        raise ValueError("planning needs finite --output-len (requests must finish)")
    progress = Progress("plan", args)
    try:
        result = plan(
            scenario,
            _grid(args),
            args.rate,
            targets,
            objective=args.objective,
            headroom=args.headroom,
            check_top=args.check_top,
            check_requests=args.check_requests,
            progress=progress,
        )
    finally:
        progress.close()
    rows = assumptions(args, scenario, targets)  # saguaro.commands.assumptions
    pct = args.percentile
    if args.json:

        def detail(c):
            return (
                None
                if c is None
                else {
                    **_row(c, targets, pct),
                    "settings": c.settings,
                    "checked": c.checked.to_dict() if c.checked else None,
                }
            )

        inputs = {
            **scenario_inputs(args, scenario),
            "rate_per_s": args.rate,
            "slo": [str(t) for t in targets],
            "objective": args.objective,
            "headroom": args.headroom,
        }
        write_json(
            args.json,
            {
                "inputs": inputs,
                "assumptions": rows,
                "slo": [str(t) for t in targets],
                "rate_per_s": args.rate,
                "best": detail(result.best),
                "closest": detail(result.closest),
                "candidates": [_row(c, targets, pct) for c in result.candidates],
                "rejected": [_row(c, targets, pct) for c in result.rejected],
                "infeasible": [{**i.settings, "reason": i.reason} for i in result.infeasible],
            },
        )
    if args.json == "-":
        return 0

    print(f"plan for {args.rate:g} requests/s under {'; '.join(map(str, targets))}\n")
    print("assumptions")
    print(table(rows, ["assumption", "value", "source"], markdown=True) if args.markdown else left_aligned(rows))
    print()
    if result.best is not None:
        best = result.best
        print(
            f"best: {best.replicas} replica(s) × {best.accelerators // best.replicas} accelerator(s) = "
            f"{best.accelerators} accelerator(s)"
        )
        print("\n".join(_describe(best, targets, args)))
    else:
        print("no configuration meets the SLO: relax it, add smaller batches, or faster hardware")
        if result.closest is not None:
            print("the closest:")
            print("\n".join(_describe(result.closest, targets, args)))
    latencies = [f"{m}_p{pct}_ms" for m in METRICS]
    checked = f"checked_{targets[0].metric}_p{targets[0].percentile}_ms"
    print(
        f"\ncandidates that meet the SLO at full load ({len(result.candidates)}; {len(result.rejected)} missed "
        f"it, {len(result.infeasible)} cannot run); latencies at full load, ! = violated:"
    )
    print(
        table(
            [_row(c, targets, pct) for c in result.candidates[: args.show]],
            [*SETTINGS, *latencies, checked, *FIGURES],
            markdown=args.markdown,
            limits=_limits(targets),
        )
    )
    if result.infeasible:
        print(f"\n{len(result.infeasible)} configuration(s) cannot run (dropped):")
        for i in result.infeasible[: args.show]:
            where = " ".join(f"{k}={i.settings[k]}" for k in SETTINGS if i.settings.get(k) is not None)
            print(f"  {where}: {i.reason}")
    return 0
