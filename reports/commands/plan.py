"""`saguaro plan`: the best strategy and settings for a latency target and an arrival rate, and how many
replicas and accelerators it takes, with the simulated figures that justify it (no torch).

Every grid point is simulated at full load (closed loop at its batch size); points that meet the target
are sized for the arrival rate (with --headroom), and the best few are checked with Poisson arrivals at
rate / replicas per replica, adding replicas until the target holds.

Metrics are theory.latency's (as vLLM's serving benchmark): ttft (arrival to first token), itl (gap between
successive streamed chunks; a speculative round is one gap), tpot ((e2el − ttft) / (tokens − 1)), e2el.
"""

from __future__ import annotations

import argparse

from reports.commands.simulate import _write_json, add_scenario_flags

SETTINGS = ["strategy", "K", "budget", "fanout", "backup", "batch", "C"]
FIGURES = ["capacity_rps", "replicas", "accelerators", "tok/s/acc"]


def latency_columns(target) -> tuple[str, str]:
    """The target metric at full load and in the open-loop check, named with percentile and unit."""
    name = f"{target.metric}_p{target.percentile}_ms"
    return f"full_load_{name}", f"checked_{name}"


def columns(target) -> list[str]:
    return [*SETTINGS, *latency_columns(target), *FIGURES]


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("plan", help="capacity plan: best SD/SSD settings and replicas for a latency target",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("demand and target")
    g.add_argument("--rate", type=float, required=True, help="arrival rate, requests per second (all replicas)")
    g.add_argument("--metric", choices=["itl", "tpot", "ttft", "e2el"], default="itl",
                   help="latency metric: itl (per streamed chunk, default), tpot, ttft or e2el")
    g.add_argument("--percentile", type=int, choices=[50, 90, 99], default=99, help="default 99")
    g.add_argument("--target-ms", type=float, required=True, help="the metric's limit in milliseconds")
    g.add_argument("--objective", choices=["accelerators", "latency"], default="accelerators",
                   help="fewest accelerators (default) or lowest latency among plans that meet the target")
    g.add_argument("--headroom", type=float, default=0.85, help="plan for this fraction of capacity (default 0.85)")
    g.add_argument("--check-top", type=int, default=3, help="open-loop checks of the best N (default 3)")
    g.add_argument("--check-requests", type=int, default=300, help="requests per open-loop check (default 300)")
    g = p.add_argument_group("candidates")
    g.add_argument("--strategy", nargs="+", default=["ar", "sd", "ssd"], choices=["ar", "sd", "ssd"])
    g.add_argument("--K", type=int, nargs="+", default=[2, 4, 6], help="default 2 4 6")
    g.add_argument("--budget", type=int, nargs="+", default=[6, 12, 24], help="SSD budgets (default 6 12 24)")
    g.add_argument("--backup", nargs="+", default=["neural", "random"], choices=["neural", "random", "lookup"])
    g.add_argument("--batch", type=int, nargs="+", default=[1, 4, 16], help="max batch per replica (default 1 4 16)")
    g.add_argument("--C", type=float, nargs="+", default=[1.0], help="Saguaro constants (needs --saguaro-table)")
    add_scenario_flags(p, rounds=2000)
    g = p.add_argument_group("output")
    g.add_argument("--json", metavar="PATH", help="also write the plan as JSON ('-' for stdout only)")
    g.add_argument("--markdown", action="store_true", help="tables in Markdown")
    g.add_argument("--show", type=int, default=10, help="candidates to list (default 10)")
    return p


def _row(candidate, target) -> dict:
    full_load, checked = latency_columns(target)
    return {**candidate.settings, full_load: candidate.latency_ms, checked: candidate.checked_latency_ms,
            "capacity_rps": candidate.capacity_per_s, "replicas": candidate.replicas,
            "accelerators": candidate.accelerators,
            "tok/s/acc": candidate.screened.tokens_per_s_per_accelerator}


def run(args: argparse.Namespace) -> int:
    from reports.commands.simulate import scenario_from_args
    from reports.tables import format_table
    from simulator import Grid, LatencyTarget, plan

    target = LatencyTarget(args.metric, args.percentile, args.target_ms)
    scenario = scenario_from_args(args, None)
    if scenario.output_len is None:
        raise ValueError("planning needs finite --output-len (requests must finish)")
    grid = Grid(strategies=tuple(args.strategy), K=tuple(args.K), budget=tuple(args.budget),
                backup=tuple(args.backup), batch=tuple(args.batch), C=tuple(args.C))
    result = plan(scenario, grid, args.rate, target, objective=args.objective, headroom=args.headroom,
                  check_top=args.check_top, check_requests=args.check_requests)
    if args.json:
        _write_json(args.json, {
            "target": str(target), "rate_per_s": args.rate,
            "best": None if result.best is None else {**_row(result.best, target),
                                                      "checked": result.best.checked.to_dict()},
            "candidates": [_row(c, target) for c in result.candidates],
            "rejected": [{**s, latency_columns(target)[0]: v} for s, v in result.rejected],
        })
    if args.json == "-":
        return 0
    print(f"target: {target} at {args.rate:g} requests/s")
    if result.best is None:
        print("no configuration meets the target: relax it, add smaller batches, or faster hardware")
    else:
        best, checked = result.best, result.best.checked
        print(f"best: {best.settings}")
        print(f"  {best.replicas} replicas × {best.accelerators // best.replicas} accelerators = "
              f"{best.accelerators} accelerators")
        print(f"  checked with Poisson arrivals at {args.rate / best.replicas:.3g} requests/s per replica: "
              f"{target.metric} p{target.percentile} = {best.checked_latency_ms:.2f} ms, "
              f"ttft p99 {checked.ttft_ms['p99']:.1f} ms, itl p50/p99 {checked.itl_ms['p50']:.2f}/"
              f"{checked.itl_ms['p99']:.2f} ms, tpot p50/p99 {checked.tpot_ms['p50']:.2f}/"
              f"{checked.tpot_ms['p99']:.2f} ms, {checked.tokens_per_s:.1f} tokens/s per replica, mean batch "
              f"{checked.mean_batch:.2f}" + (f", hit rate {checked.hit_rate:.3f}" if checked.hit_rate else ""))
        print(f"  at full load (batch {best.settings['batch']}): {best.screened.tokens_per_s:.1f} tokens/s per "
              f"replica, {best.screened.tokens_per_s_per_accelerator:.1f} per accelerator")
    print(f"\ncandidates that meet the target at full load ({len(result.candidates)}; "
          f"{len(result.rejected)} did not):")
    print(format_table([_row(c, target) for c in result.candidates[: args.show]], columns(target),
                       markdown=args.markdown))
    return 0
