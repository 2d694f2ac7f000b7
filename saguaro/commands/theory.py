"""`saguaro theory`: the closed forms of docs/ssd.md as tables for given inputs (numpy/scipy only, no torch).

Subcommands: speedup (E, SD and SSD speedups, Cor. 8/9/16), fanout (Thm 12 schedules), fit-r (Def. 11 fit),
backup (backup choice per batch size and b*), saguaro (exact acceptance and hit probability, Def. 14).
Times are in units of one verify forward (T_v = 1). Add --json for machine-readable output, which echoes
every input (`inputs`) next to the results. Lists are space-separated: --batch 1 4 16, --fanout 1 2 4.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from saguaro.cli import HelpFormatter
from saguaro.formatting import table

DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32, 64)
MISS_POLICIES = ("per-row", "whole-batch")  # theory.MissPolicy's values (kept here: no import at parse time)


def add_parser(sub) -> argparse.ArgumentParser:
    formatter = HelpFormatter
    parser = sub.add_parser(
        "theory",
        help="closed-form SD/SSD/Saguaro theory for given inputs",
        description=__doc__,
        formatter_class=formatter,
    )
    theory_sub = parser.add_subparsers(dest="theory_command", required=True, metavar="WHAT")

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        p = theory_sub.add_parser(name, help=help_text, description=help_text, formatter_class=formatter)
        p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
        return p

    def round_flags(p: argparse.ArgumentParser) -> None:
        p.add_argument("--alpha", type=float, required=True, help="per-token acceptance rate α of SD")
        p.add_argument("-K", "--K", dest="K", type=int, required=True, help="lookahead: draft tokens per round")
        p.add_argument("--t-sd", type=float, required=True, help="T_SD = K·T_d/T_v, the draft time per round")
        p.add_argument("--p-hit", type=float, required=True, help="probability the outcome is in the cache")
        p.add_argument("--t-p", type=float, default=1.0, help="cache-build time T_p (1: fits a verify)")
        p.add_argument("--alpha-hit", type=float, help="acceptance after a hit (default: --alpha)")
        p.add_argument(
            "--miss-policy",
            choices=MISS_POLICIES,
            default=MISS_POLICIES[0],
            help="at batch > 1 when some rows miss: per-row (this engine: the build "
            "completes, hit rows keep their branch, missed rows share one backup) or "
            "whole-batch (the reference engine: any miss drops the build and backs up every row)",
        )

    p = command("speedup", "E(α, K), SD and SSD speedups over AR (Thm 7, Cor. 16) and the Cor. 8/9 bounds")
    round_flags(p)
    p.add_argument("--e-miss", type=float, help="tokens per round after a miss (default: E_SD, neural backup)")
    p.add_argument("--t-b", type=float, help="backup time T_b (default: T_SD, neural backup)")
    p.add_argument("--batch", type=int, nargs="+", default=[1], help="batch sizes b (Cor. 16)")

    p = command("fanout", "Thm 12 optimal fan-out, real and integer, against the uniform schedule")
    p.add_argument("--alpha", type=float, required=True, help="per-token acceptance rate α")
    p.add_argument("-K", "--K", dest="K", type=int, required=True, help="lookahead: outcomes are k = 0..K")
    p.add_argument("--B", "--budget", dest="B", type=int, required=True, help="cache budget B = Σ_k F_k")
    p.add_argument(
        "--r",
        type=float,
        help="power-law exponent of the miss rate; without it the α-model of hits (the default of "
        "simulate and plan for pairs without measured ranks: simulator/alpha_hits.py) or, with "
        "--hit-table, the default pair's measured ranks give the hit probabilities, and the "
        "model's r the real-valued optimum",
    )
    p.add_argument("--scale", type=float, default=1.0, help="a in miss ≈ a·F^(−r) with --r (1 as in the docs)")
    p.add_argument(
        "--hit-table",
        metavar="WORKLOAD",
        help="the default pair's measured ranks instead (qwen-coder 1.5B + 0.5B): spec_bench, "
        "humaneval, spec_bench/<task>",
    )
    p.add_argument("--temperature", type=float, default=0.0, help="the hit model's temperature")
    p.add_argument("--C", type=float, default=1.0, help="measured hit model's Saguaro constant")

    p = command("fit-r", "fit r in miss ≈ a·F^(−r) (Def. 11) from measured (fan-out, miss rate) pairs")
    p.add_argument("--fanout", type=float, nargs="+", required=True, help="fan-outs F (≥ 1)")
    p.add_argument("--miss", type=float, nargs="+", required=True, help="measured miss rates, one per F")
    p.add_argument("--confidence", type=float, default=0.95, help="confidence of the interval for r")
    p.add_argument("--fix-scale", action="store_true", help="fit F^(−r) exactly (a = 1) instead of a·F^(−r)")

    p = command("backup", "neural vs fast backup per batch size by the Cor. 16 speedup, and b*")
    round_flags(p)
    p.add_argument("--fast", choices=["random", "lookup"], default="random", help="kind of fast backup")
    p.add_argument("--fast-e-miss", type=float, default=1.0, help="tokens per round after a fast-backup miss")
    p.add_argument("--fast-t-b", type=float, default=0.0, help="fast backup time")
    p.add_argument("--batch", type=int, nargs="+", default=DEFAULT_BATCHES, help="batch sizes to tabulate")
    p.add_argument("--b-max", type=int, default=1_000_000, help="report no b* above this batch size")

    p = command("saguaro", "exact acceptance and cache-hit probability of Saguaro sampling (Def. 14, Thm 15)")
    p.add_argument("--p", type=float, nargs="+", required=True, help="target distribution over the vocabulary")
    p.add_argument("--q", type=float, nargs="+", required=True, help="draft distribution over the vocabulary")
    p.add_argument("--F", type=int, required=True, help="fan-out: guesses for the bonus token")
    p.add_argument("--C", type=float, nargs="+", default=[1.0], help="Saguaro constants in (0, 1]")
    p.add_argument("--normalise", action="store_true", help="rescale --p and --q to sum to 1 (e.g. counts)")
    return parser


def run(args: argparse.Namespace) -> int:
    handlers = {"speedup": _speedup, "fanout": _fanout, "fit-r": _fit_r, "backup": _backup, "saguaro": _saguaro}
    result, tables = handlers[args.theory_command](args)
    if args.json:
        print(json.dumps(_plain(result), indent=2, allow_nan=False))
    else:
        print("\n\n".join(tables))
    return 0


def _plain(value: Any) -> Any:
    """numpy scalars/arrays -> Python numbers/lists; NaN -> None (JSON has no NaN)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "tolist"):
        return _plain(value.tolist())
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _pairs(rows: dict[str, Any]) -> str:
    """`name  value` lines, names aligned: for one-off quantities, which a table would stretch."""
    width = max(len(k) for k in rows)
    return "\n".join(f"{k.ljust(width)}  {f'{v:.4g}' if isinstance(v, float) else v}" for k, v in rows.items())


def _fixed(rows: list[dict], columns: list[str]) -> str:
    """A table with every figure to three decimals (one format per column, no scientific notation)."""
    return table(rows, columns, decimals=3)


def _round_quantities(args: argparse.Namespace) -> dict[str, Any]:
    from theory import expected_tokens

    alpha_hit = args.alpha if args.alpha_hit is None else args.alpha_hit
    if args.K < 1:
        raise ValueError(f"--K must be >= 1 (draft tokens per round), got {args.K}")
    if not args.t_sd >= 0:
        raise ValueError(f"--t-sd must be >= 0 (K·T_d/T_v, draft time per round in verify units), got {args.t_sd}")
    return {"E_sd": expected_tokens(args.alpha, args.K), "E_hit": expected_tokens(alpha_hit, args.K)}


def _speedup(args: argparse.Namespace) -> tuple[dict, list[str]]:
    from theory import sd_speedup, ssd_over_sd_ceiling, ssd_speedup

    q = _round_quantities(args)
    E_miss = q["E_sd"] if args.e_miss is None else args.e_miss
    T_b = args.t_sd if args.t_b is None else args.t_b
    sd = sd_speedup(args.alpha, args.K, args.t_sd / args.K)
    ceiling = ssd_over_sd_ceiling(q["E_hit"], q["E_sd"], args.t_sd)
    neural = args.e_miss is None and args.t_b is None
    cor8 = neural and args.t_p <= 1 and q["E_hit"] >= q["E_sd"]
    rows = []
    for b in args.batch:
        ssd = ssd_speedup(args.p_hit, q["E_hit"], E_miss, args.t_p, T_b, b, miss_policy=args.miss_policy)
        rows.append({"b": b, "all_hit": args.p_hit**b, "ssd_speedup": ssd, "ssd_over_sd": ssd / sd})
    summary = {
        **q,
        "E_miss": E_miss,
        "T_b": T_b,
        "miss_policy": args.miss_policy,
        "sd_speedup": sd,
        "cor9_ceiling_ssd_over_sd": ceiling,
        "cor8_never_slower_than_sd": cor8,
    }
    tables = [_pairs(summary), _fixed(rows, ["b", "all_hit", "ssd_speedup", "ssd_over_sd"])]
    return {"inputs": _inputs(args), **summary, "by_batch": rows}, tables


def _fanout(args: argparse.Namespace) -> tuple[dict, list[str]]:
    from theory import expected_hit_probability, integer_fanout, optimal_fanout, outcome_probabilities, uniform_fanout
    from theory.fanout import round_largest_remainder

    if args.r is None:  # the α-model or a measured table: as simulate and plan take them, so all three agree
        from simulator.alpha_hits import AlphaHit
        from simulator.hits import best_schedule, measured

        if args.hit_table is not None:
            model = measured(args.hit_table, args.temperature, args.C)
            r = (model.meta.get("power_law") or {}).get("r", model.tail_r)
        else:
            model = AlphaHit(args.alpha, args.temperature)
            r = model.tail_r
        real = optimal_fanout(args.alpha, r, args.K, args.B)
        integer = best_schedule(model, args.alpha, args.K, args.B)
        hit_of = lambda F: model.hit_rate(args.alpha, tuple(int(round(f)) for f in F))  # noqa: E731
        source = f"{model.source} (real optimum: its power law, r = {r:g})"
    else:
        real = optimal_fanout(args.alpha, args.r, args.K, args.B)
        integer = integer_fanout(args.alpha, args.r, args.K, args.B, args.scale)
        hit_of = lambda F: expected_hit_probability(F, args.alpha, args.r, args.scale)  # noqa: E731
        source = f"power law: miss = {args.scale:g}·F^(-{args.r:g})"
    schedules = {
        "optimal_real": real,
        "optimal_integer": integer,
        "largest_remainder": round_largest_remainder(real, args.B),
        "uniform": uniform_fanout(args.K, args.B),
    }
    P = outcome_probabilities(args.alpha, args.K)
    rows = [{"k": k, "P(k)": P[k], **{name: F[k] for name, F in schedules.items()}} for k in range(args.K + 1)]
    hits = {name: float(hit_of(F)) for name, F in schedules.items()}
    hit_rows = [{"schedule": name, "hit_probability": h, "miss_rate": 1 - h} for name, h in hits.items()]
    tables = [
        f"hit model: {source}",
        _fixed(rows, ["k", "P(k)", *schedules]),
        _fixed(hit_rows, ["schedule", "hit_probability", "miss_rate"]),
    ]
    return {
        "inputs": _inputs(args),
        "hit_model": source,
        "P": P,
        "schedules": schedules,
        "hit_probability": hits,
    }, tables


def _fit_r(args: argparse.Namespace) -> tuple[dict, list[str]]:
    from dataclasses import asdict

    from theory import fit_r, miss_rate

    fit = fit_r(args.fanout, args.miss, confidence=args.confidence, fix_scale=args.fix_scale)
    points = [
        {"F": F, "measured_miss": m, "fitted_miss": miss_rate(F, fit.r, fit.scale)}
        for F, m in zip(args.fanout, args.miss, strict=True)
    ]
    summary = {
        "r": fit.r,
        "r_stderr": fit.r_stderr,
        f"r_ci_{args.confidence:g}": f"[{fit.r_ci[0]:.4g}, {fit.r_ci[1]:.4g}]",
        "scale_a": fit.scale,
        "points": fit.n_points,
        "dof": fit.dof,
        "method": fit.method,
    }
    tables = [_pairs(summary), _fixed(points, ["F", "measured_miss", "fitted_miss"])]
    return {"inputs": _inputs(args), **asdict(fit), "points": points}, tables


def _backup(args: argparse.Namespace) -> tuple[dict, list[str]]:
    from theory import Backup, BackupOption, backup_speedups, critical_batch_size

    q = _round_quantities(args)
    neural = BackupOption(Backup.NEURAL, E_miss=q["E_sd"], T_b=args.t_sd)
    fast = BackupOption(Backup(args.fast), E_miss=args.fast_e_miss, T_b=args.fast_t_b)
    speeds = backup_speedups(args.p_hit, q["E_hit"], args.t_p, [neural, fast], args.batch, args.miss_policy)
    rows = [
        {
            "b": b,
            "neural": speeds[0, i],
            args.fast: speeds[1, i],
            "choice": args.fast if speeds[1, i] > speeds[0, i] else "neural",
        }
        for i, b in enumerate(args.batch)
    ]
    b_star = critical_batch_size(
        args.p_hit, q["E_hit"], args.t_p, neural, fast, b_max=args.b_max, miss_policy=args.miss_policy
    )
    summary = {
        **q,
        "miss_policy": args.miss_policy,
        "b_star": b_star if b_star is not None else f"none up to {args.b_max}",
    }
    tables = [_pairs(summary), _fixed(rows, ["b", "neural", args.fast, "choice"])]
    return {"inputs": _inputs(args), **q, "b_star": b_star, "by_batch": rows}, tables


def _saguaro(args: argparse.Namespace) -> tuple[dict, list[str]]:
    import numpy as np

    from theory import all_accepted_hit_probability, saguaro_position

    p, q = np.asarray(args.p, dtype=float), np.asarray(args.q, dtype=float)
    for flag, dist in (("--p", p), ("--q", q)):
        if not args.normalise and abs(dist.sum() - 1) > 1e-6:
            raise ValueError(f"{flag} must sum to 1 (it sums to {dist.sum():.6g}); pass --normalise to rescale it")
    if args.normalise:
        if p.sum() <= 0 or q.sum() <= 0 or (p < 0).any() or (q < 0).any():
            raise ValueError("--normalise needs non-negative --p and --q with a positive sum")
        p, q = p / p.sum(), q / q.sum()
    rows, sigmas = [], []
    for C in args.C:
        pos = saguaro_position(p, q, args.F, C)
        sigmas.append(pos.sigma)
        rows.append(
            {
                "C": C,
                "acceptance": pos.acceptance,
                "reject": pos.reject,
                "hit_given_reject": pos.hit_given_reject,
                "hit_and_reject": pos.hit_and_reject,
                "bonus_in_saguaro_set": pos.bonus_in_saguaro_set,
                "sigma": "[" + ", ".join(f"{s:.3g}" for s in pos.sigma) + "]",
            }
        )
    all_accepted = all_accepted_hit_probability(p, q, args.F)
    columns = ["C", "acceptance", "reject", "hit_given_reject", "hit_and_reject", "bonus_in_saguaro_set", "sigma"]
    tables = [
        _fixed(rows, columns),
        f"saguaro set: top {args.F + 1} tokens of q (F + 1; ties to the lower id); "
        f"hit if all accepted (bonus from p, guesses top {args.F} of q): {all_accepted:.4g}",
    ]
    json_rows = [{**row, "sigma": sigma} for row, sigma in zip(rows, sigmas, strict=True)]
    return {"inputs": _inputs(args), "by_C": json_rows, "hit_if_all_accepted": all_accepted}, tables


def _inputs(args: argparse.Namespace) -> dict[str, Any]:
    """The flags as given, minus argparse's bookkeeping."""
    skip = ("json", "verbose", "command", "theory_command")
    return {k: v for k, v in vars(args).items() if not k.startswith("_") and k not in skip}
