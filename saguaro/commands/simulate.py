"""`saguaro simulate`: the SimPy model of AR, SD and SSD for one configuration or a sweep (no torch).

Every axis flag takes several values (--strategy, --K, --budget, --backup, --batch, --C): one value each
gives a detailed report of one configuration, several give a table over the grid. Timing comes from a
roofline of the hardware and model presets (default), constant times (--timing constant) or the engine's
own records (--fit RECORDS.jsonl). With --validate RECORDS2.jsonl ... the fitted simulator predicts each
validation run's tokens/s and reports the error against the measured figure.

Latency is in theory.latency's terms (as vLLM's serving benchmark): TTFT, ITL (the gap between successive
emissions of a request: a speculative round is one gap), TPOT and E2EL. Tables give each latency column in
ms, or in s where its values reach 10 s (the unit is in the header); JSON always in ms. A metric with no
sample (e.g. TPOT when no request finished) is "none" in tables and null in JSON.

Hit rate: the fraction of SSD verification rounds, counted per sequence, whose outcome was in the
speculation cache; each sequence's first round, which has no cache yet, is left out. (JSON also gives
all_rows_hit_round_rate: the fraction of rounds in which every row of the batch hit, a new sequence's
first round counting as a miss.)

Lists are space-separated: --K 2 4 --batch 1 8, --fanout 4 2 2 1 3. JSON output (--json) echoes the
inputs: pair, hardware, timing source, α, hit model, seed, the grid and the workload.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from saguaro.calibration.files import check_same_precision, fit_all, read_all
from saguaro.cli import HelpFormatter
from saguaro.commands.values import argument_type, flat, numbers
from saguaro.formatting import Progress, format_table, latency_unit, number, readable, table, write_json

TABLE_COLUMNS = [
    "strategy",
    "K",
    "budget",
    "fanout",
    "backup",
    "batch",
    "C",
    "tok/s",
    "tok/s/seq",
    "tok/s/acc",
    "ttft_p99_ms",
    "itl_p50_ms",
    "itl_p99_ms",
    "tpot_p50_ms",
    "tpot_p99_ms",
    "hit",
    "tok/round",
    "overloaded",
    "capacity_rps",
]


_floats = argument_type(numbers, float, "expected numbers separated by spaces")


def add_scenario_flags(p: argparse.ArgumentParser, rounds: int) -> None:
    """Flags shared with `saguaro plan`: models and hardware, timing, acceptance, workload, link."""
    g = p.add_argument_group("models and hardware (roofline timing)")
    g.add_argument("--pair", default="qwen-coder", help="model pair preset: qwen-coder, llama, qwen3")
    g.add_argument("--target", help="target model preset (overrides --pair)")
    g.add_argument("--draft", help="draft model preset (overrides --pair)")
    g.add_argument("--hardware", default="cpu", help="target hardware: cpu, h100, h200, a100")
    g.add_argument("--draft-hardware", help="draft hardware (default: --hardware)")
    g.add_argument("--tp", type=int, help="target tensor-parallel degree (default: the pair's)")
    g.add_argument(
        "--eager",
        action="store_true",
        help="forwards launched kernel by kernel (no CUDA graph): the preset's launch overhead per layer",
    )
    g.add_argument(
        "--engine",
        default="saguaro",
        metavar="ENGINE",
        help="whose per-step costs (simulator.presets.ENGINES): this engine with graph-captured forwards "
        "(saguaro), this engine's eager forwards as measured on an H200 (saguaro-eager-h200), this "
        "engine's own work beyond the forwards, measured with them taken out on this project's CPU "
        "(saguaro-cpu), the reference engine as the paper shows it (reference) or as its test log "
        "times it (reference-log)",
    )
    g = p.add_argument_group("timing")
    g.add_argument(
        "--timing", choices=["roofline", "constant"], default="roofline", help="timing model when --fit is not given"
    )
    g.add_argument(
        "--fit",
        metavar="RECORDS",
        nargs="+",
        help="fit the timing model from the engine's per-round JSONL records (several files: one fit; "
        "add saguaro calibrate's records for SSD's interference, branch cost and backup time)",
    )
    g.add_argument(
        "--level",
        metavar="RECORDS",
        nargs="+",
        help="with --fit: scale the fitted target and draft forwards to the level of an SD run's rounds "
        "(saguaro bench records; the calibration keeps the shapes, the run sets the level; a ratio "
        "within 5%% of 1 is left at 1)",
    )
    g.add_argument("--t-verify-ms", type=float, default=10.0, help="constant timing: T_v")
    g.add_argument("--t-draft-ms", type=float, default=1.0, help="constant timing: one draft step T_d")
    g.add_argument("--t-build-ms", type=float, help="constant timing: cache build T_p (default (K+1)·T_d)")
    g.add_argument("--t-backup-ms", type=float, help="constant timing: neural backup T_b (default K·T_d)")
    g = p.add_argument_group("acceptance and cache hits")
    g.add_argument(
        "--alpha",
        type=float,
        help="per-token acceptance rate α (default: the pair preset's, fitted to its published SD "
        "figure; the default pair's measured one; else 0.8, assumed)",
    )
    g.add_argument(
        "--alpha-per-position",
        type=_floats,
        nargs="+",
        metavar="ALPHA",
        help="α_1 ... α_K: acceptance by position instead (space-separated)",
    )
    g.add_argument("--alpha-lookup", type=float, help="acceptance rate of the prompt-lookup backup")
    g.add_argument("--replay", metavar="RECORDS", help="replay accepted counts and hits from engine records")
    g.add_argument(
        "--calibrate",
        metavar="RECORDS",
        help="measure α and the hit model (from the rounds' outcome ranks, SD or SSD) from engine "
        "records instead of the flags",
    )
    g.add_argument(
        "--hit-model",
        choices=["auto", "measured", "alpha", "powerlaw", "constant"],
        default="auto",
        help="cache hits: auto (the pair's measured ranks where it has them, the default pair's; else "
        "alpha), measured (where the bonus stood among the draft's guesses on the default pair, "
        "simulator/data/hit_tables.json, the entry of --hit-table nearest in --temperature and C), "
        "alpha (the α-model fitted to those tables, carried to any pair through α and T), "
        "power-law misses a·F^(-r) per outcome, or a constant",
    )
    g.add_argument(
        "--hit-table",
        default="spec_bench",
        metavar="WORKLOAD",
        help="measured hit model's workload: spec_bench, spec_bench/<task>, humaneval",
    )
    g.add_argument("--r", type=float, default=1.0, help="power-law exponent r")
    g.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="power-law scale a, with --hit-model powerlaw (as in the docs and theory fanout)",
    )
    g.add_argument("--p-hit", type=float, default=0.9, help="constant hit probability")
    g.add_argument(
        "--saguaro-table",
        metavar="FILE",
        help="a JSON file with four lists of equal length, one entry per Saguaro setting: C (the "
        "constant), alpha (the acceptance rate measured with it), r and scale (the power-law "
        'miss fit measured with it), e.g. {"C": [1, 0.5], "alpha": [0.8, 0.78], "r": '
        '[1.0, 1.3], "scale": [0.5, 0.4]}',
    )
    g.add_argument(
        "--fanout-rule",
        choices=["geometric", "uniform"],
        default="geometric",
        help="schedule for a budget: Thm 12 integer optimum (geometric) or even spread (uniform)",
    )
    g.add_argument(
        "--miss-policy",
        choices=["per-row", "whole-batch"],
        default="per-row",
        help="SSD at batch > 1 when some rows miss: per-row (this engine: the cache build "
        "completes, hit rows keep their branch, missed rows share one backup) or whole-batch "
        "(the reference engine: any miss drops the build and backs up every row)",
    )
    g.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="> 0: the draft also sends q (vocab × 2 bytes per token) over the link",
    )
    g = p.add_argument_group("workload")
    g.add_argument("--prompt-len", default="128", help="prompt tokens: N or LOW:HIGH")
    g.add_argument("--output-len", default="256", help="output tokens: N, LOW:HIGH or inf")
    g.add_argument(
        "--shared-prefix",
        type=float,
        default=0.0,
        metavar="F",
        help="fraction of each prompt the requests share (a system prompt): with the prefix cache, "
        "requests after the first prefill only the rest (default 0)",
    )
    g.add_argument("--rounds", type=int, default=rounds, help="target forwards to simulate")
    g.add_argument("--seed", type=int, default=0, help="seed of all random draws")
    g.add_argument("--link-latency-ms", type=float, help="draft link latency (default: the draft hardware's)")
    g.add_argument("--link-gb-s", type=float, help="draft link bandwidth (default: the draft hardware's)")


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "simulate",
        help="simulate AR/SD/SSD timing (one configuration or a sweep)",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    g = p.add_argument_group("configuration (several values, space-separated: a sweep)")
    g.add_argument("--strategy", nargs="+", default=["ssd"], choices=["ar", "sd", "ssd"], help="strategies")
    g.add_argument(
        "-K",
        "--K",
        dest="K",
        type=int_or_auto,
        nargs="+",
        default=[4],
        help="draft tokens per round; auto: the fastest K in 1..8, as the engine's K auto settles",
    )
    g.add_argument(
        "--budget",
        type=int_or_auto,
        nargs="+",
        default=[12],
        help="SSD fan-out budget B = Σ F_k; auto: the engine's rule (the build within 90%% of a verify)",
    )
    g.add_argument(
        "--fanout",
        type=_floats,
        nargs="+",
        metavar="F",
        help="explicit SSD schedule F_0 ... F_K, space-separated (one K, instead of --budget)",
    )
    g.add_argument(
        "--backup", nargs="+", default=["neural"], choices=["neural", "random", "lookup"], help="SSD backups"
    )
    g.add_argument("--batch", type=int, nargs="+", default=[1], help="batch size / concurrency")
    g.add_argument("--C", type=float, nargs="+", default=[1.0], help="Saguaro constants (C ≠ 1 needs --saguaro-table)")
    g.add_argument("--rate", type=float, help="Poisson arrivals per second (open loop; default: closed loop)")
    add_scenario_flags(p, rounds=5000)
    g = p.add_argument_group("output")
    g.add_argument(
        "--json", metavar="PATH", help="also write the results and their inputs as JSON ('-' for stdout only)"
    )
    g.add_argument("--trace", metavar="PATH", help="write a Chrome trace of the timeline (one configuration)")
    g.add_argument("--markdown", action="store_true", help="tables in Markdown")
    g.add_argument(
        "--validate",
        metavar="RECORDS",
        nargs="+",
        help="with --fit: predict each run in these records and compare with its measured tokens/s",
    )
    g.add_argument("--benchmark", action="store_true", help="measure simulated rounds per second of wall time")
    return p


def int_or_auto(text: str) -> int | str:
    """-K / --budget values: a whole number or "auto" (simulator.scenario.Scenario.resolve)."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number or auto, got {text!r}") from None


def _lengths(text: str):
    from simulator import Lengths

    return None if text.strip().lower() in ("inf", "none") else Lengths.parse(text)


def _saguaro_table(path: str | None):
    from simulator import SaguaroTable

    if path is None:
        return None
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        return SaguaroTable(*(tuple(float(v) for v in data[key]) for key in ("C", "alpha", "r", "scale")))
    except (OSError, KeyError, TypeError, json.JSONDecodeError) as err:
        raise ValueError(
            f"cannot read the Saguaro table {path}: {err}; it must be JSON with lists C, alpha, r and scale"
        ) from None


def fitted_from_args(args: argparse.Namespace):
    """--fit's timing, leveled to --level's SD rounds when given (simulator.fit.FittedTiming.leveled)."""
    if args.level and not args.fit:
        raise ValueError("--level scales a fitted timing: give --fit CALIBRATION.jsonl with it")
    check_same_precision(args.fit, args.level or ())
    fitted = fit_all(args.fit)
    return fitted.leveled(read_all(args.level)) if args.level else fitted


def timing_from_args(args: argparse.Namespace):
    """(timing model, target devices, draft hardware or None, fitted model or None)."""
    from simulator import ConstantTiming, Deployment, RooflineTiming
    from simulator.presets import PAIRS, engine_preset, hardware_preset, model_preset

    if args.fit or args.level:
        fitted = fitted_from_args(args)
        return fitted, 1, None, fitted
    if args.timing == "constant":
        timing = ConstantTiming(
            t_verify_ms=args.t_verify_ms,
            t_draft_ms=args.t_draft_ms,
            t_build_ms=args.t_build_ms,
            t_backup_ms=args.t_backup_ms,
        )
        return timing, 1, None, None
    if args.pair not in PAIRS:
        raise ValueError(f"unknown pair {args.pair!r}: choose one of {', '.join(PAIRS)} or give --target/--draft")
    target_name, draft_name, pair_tp = PAIRS[args.pair]
    tp = args.tp or pair_tp
    hardware = hardware_preset(args.hardware)
    draft_hw = hardware_preset(args.draft_hardware or args.hardware)
    eager = getattr(args, "eager", False)
    timing = RooflineTiming(
        Deployment(model_preset(args.target or target_name), hardware, tp, eager=eager),
        Deployment(model_preset(args.draft or draft_name), draft_hw, 1, eager=eager),
        engine=engine_preset(getattr(args, "engine", "saguaro")),
    )
    return timing, tp, draft_hw, None


def hit_model_from_args(args: argparse.Namespace, alpha: float | None = None):
    """The hit model the flags ask for at acceptance α (`--calibrate` may replace it with the records' own)."""
    from saguaro.commands.hit_choice import alpha_choice, hit_choice

    return hit_choice(args, alpha_choice(args)[0] if alpha is None else alpha)[0]


def scenario_from_args(args: argparse.Namespace, rate_per_s: float | None):
    from saguaro.commands.hit_choice import alpha_choice
    from simulator import (
        IidAcceptance,
        LinkSpec,
        PerPositionAcceptance,
        Replay,
        Scenario,
        read_records,
    )
    from simulator.calibrate import calibrate
    from simulator.hits import from_records

    timing, tp, draft_hw, fitted = timing_from_args(args)
    alpha = alpha_choice(args)[0]
    hits = hit_model_from_args(args, alpha)
    if args.replay:
        acceptance = Replay(tuple(read_records(args.replay)))
    elif args.calibrate:
        records = read_records(args.calibrate)
        measured = calibrate(records)
        acceptance = IidAcceptance(measured.acceptance.alpha, alpha_lookup=args.alpha_lookup)
        if any(r.outcome_rank is not None for r in records):
            hits = from_records(records, source=f"measured: {args.calibrate}")
        else:
            hits = measured.hits or hit_model_from_args(args, measured.acceptance.alpha)
    elif args.alpha_per_position:
        acceptance = PerPositionAcceptance(tuple(flat(args.alpha_per_position)), alpha_lookup=args.alpha_lookup)
    else:
        acceptance = IidAcceptance(alpha, alpha_lookup=args.alpha_lookup)
    latency = args.link_latency_ms
    if latency is None:
        latency = fitted.link_latency_ms if fitted else (draft_hw.interconnect_latency_us / 1e3 if draft_hw else 0.0)
    bandwidth = args.link_gb_s or (draft_hw.interconnect_gb_s if draft_hw else math.inf)
    vocab = timing.draft.model.vocab if hasattr(timing, "draft") and hasattr(timing.draft, "model") else 151936
    return Scenario(
        timing=timing,
        acceptance=acceptance,
        hits=hits,
        saguaro=_saguaro_table(args.saguaro_table),
        fanout_rule=args.fanout_rule,
        miss_policy=args.miss_policy,
        prompt_len=_lengths(args.prompt_len) or _lengths("128"),
        output_len=_lengths(args.output_len),
        rate_per_s=rate_per_s,
        shared_prefix=args.shared_prefix,
        link=LinkSpec(latency, bandwidth),
        draft_probs_bytes=2.0 * vocab if args.temperature > 0 else 0.0,
        target_devices=tp,
        rounds=args.rounds,
        seed=args.seed,
    )


def _grid(args: argparse.Namespace):
    from simulator import Grid

    return Grid(
        strategies=tuple(args.strategy),
        K=tuple(args.K),
        budget=tuple(args.budget),
        backup=tuple(args.backup),
        batch=tuple(args.batch),
        C=tuple(args.C),
    )


def _lengths_text(lengths) -> str:
    if lengths is None:
        return "endless"
    return f"{lengths.low}" if lengths.upper == lengths.low else f"{lengths.low}:{lengths.upper}"


def scenario_inputs(args: argparse.Namespace, scenario) -> dict:
    """The inputs a run used, resolved (presets to model and hardware names, the hit model to its source) and
    as given (`flags`): what JSON output echoes so that a result file says what it is a result of."""
    from saguaro.commands.hit_choice import alpha_choice, hit_choice
    from simulator import (
        ConstantHit,
        FittedTiming,
        IidAcceptance,
        PerPositionAcceptance,
        PowerLawHit,
        Replay,
        RooflineTiming,
    )
    from simulator.alpha_hits import AlphaHit
    from simulator.hits import EmpiricalHit

    timing = scenario.timing
    acc_alpha = getattr(scenario.acceptance, "alpha", 0.8)
    out: dict = {}
    if isinstance(timing, RooflineTiming):
        t, d = timing.target, timing.draft
        out["pair"] = {"preset": args.pair, "target": t.model.name, "draft": d.model.name, "target_tp": t.tp}
        out["hardware"] = {"target": t.hardware.name, "draft": d.hardware.name}
        out["timing"] = {
            "source": "roofline of the model and hardware presets",
            "engine": args.engine,
            "eager": args.eager,
        }
    elif isinstance(timing, FittedTiming):
        out["pair"] = out["hardware"] = "those of the fitted records"
        out["timing"] = {"source": "fitted to engine records", "records": list(args.fit)}
        if timing.levels:
            out["timing"]["leveled"] = {"records": list(args.level), **timing.levels}
    else:
        out["pair"] = out["hardware"] = "none: constant timing stands for them"
        out["timing"] = {
            "source": "constant",
            "t_verify_ms": timing.t_verify_ms,
            "t_draft_ms": timing.t_draft_ms,
            "t_build_ms": args.t_build_ms,
            "t_backup_ms": args.t_backup_ms,
        }
    acc = scenario.acceptance
    if isinstance(acc, Replay):
        out["acceptance"] = {"model": "replayed records", "records": args.replay}
    elif isinstance(acc, PerPositionAcceptance):
        out["acceptance"] = {"model": "per position", "alpha": list(acc.alphas)}
    elif isinstance(acc, IidAcceptance):
        out["acceptance"] = {
            "model": "i.i.d.",
            "alpha": acc.alpha,
            "source": f"measured: {args.calibrate}" if args.calibrate else alpha_choice(args)[1],
        }
    hits = scenario.hits
    if isinstance(hits, EmpiricalHit):
        out["hit_model"] = {
            "model": "measured",
            "source": hits.source,
            "hit_table": args.hit_table,
            "temperature": args.temperature,
            "why": hit_choice(args, acc_alpha)[1],
        }
    elif isinstance(hits, AlphaHit):
        out["hit_model"] = {
            "model": "alpha",
            "source": hits.source,
            "alpha": hits.alpha,
            "temperature": hits.temperature,
            "params": list(hits.fit.params.as_tuple()),
        }
    elif isinstance(hits, PowerLawHit):
        out["hit_model"] = {"model": "powerlaw", "r": hits.r, "scale": hits.scale}
    elif isinstance(hits, ConstantHit):
        out["hit_model"] = {"model": "constant", "p_hit": hits.p_hit}
    else:
        out["hit_model"] = {"model": type(hits).__name__}
    out["fanout_rule"] = scenario.fanout_rule
    out["miss_policy"] = scenario.miss_policy.value
    out["saguaro_table"] = args.saguaro_table
    grid = {name: list(getattr(args, name)) for name in ("strategy", "K", "budget", "backup", "batch", "C")}
    if getattr(args, "fanout", None):
        grid["fanout"] = [int(f) for f in flat(args.fanout)]
    out["grid"] = grid
    out["workload"] = {
        "prompt_len": _lengths_text(scenario.prompt_len),
        "output_len": _lengths_text(scenario.output_len),
        "shared_prefix": scenario.shared_prefix,
        "arrivals": (
            "closed loop at each batch size"
            if scenario.rate_per_s is None
            else f"Poisson, {scenario.rate_per_s:g} requests/s"
        ),
        "rounds": scenario.rounds,
    }
    out["link"] = {"latency_ms": scenario.link.latency_ms, "gb_s": scenario.link.bandwidth_gb_s}
    out["seed"] = scenario.seed
    out["flags"] = {k: v for k, v in vars(args).items() if not k.startswith("_") and k not in ("verbose", "quiet")}
    return out


def _detail(result, markdown: bool = False) -> str:
    from simulator.metrics import HIT_RATE_DEFINITION
    from theory.latency import METRICS

    sim_ms = result.sim_ms
    lines = [
        "configuration: " + ", ".join(f"{k} {v}" for k, v in result.settings.items()),
        f"simulated: {result.rounds} rounds, {sim_ms / 1e3:.2f} s, {result.tokens} tokens, "
        f"{result.completed_requests} requests done, mean batch {result.mean_batch:.2f}",
        f"tokens/s: {result.tokens_per_s:.2f} total, {result.decode_tokens_per_s:.2f} decode, "
        f"{result.tokens_per_s_per_seq:.2f} per sequence, {result.tokens_per_s_per_accelerator:.2f} per "
        f"accelerator ({result.accelerators})",
        f"tokens per round: {result.tokens_per_round:.3f} (mean accepted {result.mean_accepted:.3f}, "
        f"acceptance rate {result.acceptance_rate:.3f})",
    ]
    if result.hit_rate is not None:
        lines.append(f"hit rate: {result.hit_rate:.3f} ({HIT_RATE_DEFINITION})")
    rows = []
    for name in METRICS:
        stats = getattr(result, f"{name}_ms")
        unit, factor, decimals = latency_unit(stats.values())
        rows.append({"latency": name, "unit": unit, **{stat: number(v, decimals, factor) for stat, v in stats.items()}})
    breakdown = [
        {"actor": actor, "activity": what, "time_ms": ms, "share_%": f"{100 * ms / sim_ms if sim_ms else 0.0:.1f}"}
        for actor, parts in result.breakdown_ms.items()
        for what, ms in parts.items()
        if ms > 0
    ]
    hist = [
        {
            "k": k,
            "rounds": n,
            "hits_after": result.hits_by_k[k] if result.hit_rate is not None else None,
            "misses_after": result.misses_by_k[k] if result.hit_rate is not None else None,
        }
        for k, n in enumerate(result.accepted_hist)
    ]
    busy = readable(breakdown, ["actor", "activity", "time_ms", "share_%"])
    return (
        "\n".join(lines)
        + "\n\n"
        + "\n\n".join(
            [
                format_table(rows, ["latency", "unit", "mean", "p50", "p90", "p99"], markdown=markdown),
                format_table(*busy, markdown=markdown),
                format_table(hist, ["k", "rounds", "hits_after", "misses_after"], markdown=markdown),
            ]
        )
    )


def _validate(args: argparse.Namespace) -> int:
    from simulator import read_records, validate
    from simulator.validate import TOLERANCE

    if not args.fit:
        raise ValueError("--validate needs --fit CALIBRATION.jsonl: the timings are fitted on a separate run")
    fitted = fitted_from_args(args)
    rows = []
    for path in args.validate:
        for row in validate(fitted, read_records(path)):
            rows.append(
                {
                    "file": Path(path).name,
                    "strategy": row.strategy,
                    "K": row.K,
                    "batch": row.batch,
                    "backup": row.backup,
                    "fanout": "-".join(map(str, row.fanout)) if row.fanout else None,
                    "rounds": row.rounds,
                    "measured": row.measured_tokens_per_s,
                    "simulated": row.simulated_tokens_per_s,
                    "error_%": 100 * row.error,
                    "ok": row.within_tolerance,
                }
            )
    passed = sum(r["ok"] for r in rows)
    fit = {
        "verify": fitted.verify,
        "verify_knee": fitted.verify_knee,
        "draft": fitted.draft,
        "draft_call": fitted.draft_call,
        "levels": fitted.levels,
        "overhead_ms": fitted.overhead,
        "link_latency_ms": fitted.link_latency_ms,
        "relative_rms_error": fitted.errors,
    }
    if args.json:
        inputs = {
            "fit": list(args.fit),
            "validate": list(args.validate),
            "tolerance": TOLERANCE,
            "flags": {k: v for k, v in vars(args).items() if not k.startswith("_")},
        }
        write_json(args.json, {"inputs": inputs, "fit": fit, "validation": rows, "passed": passed})
    if args.json != "-":
        print(f"fitted on {' '.join(args.fit)}: " + ", ".join(f"{k}={v}" for k, v in fit.items()))
        print(table(rows, list(rows[0]) if rows else [], markdown=args.markdown))
        print(f"{passed}/{len(rows)} configurations within {TOLERANCE:.0%} of the measured tokens/s")
    return 0


def _overload_warning(results, rate: float | None) -> str | None:
    """One line for the rows of a sweep whose arrivals exceed their capacity (their latencies are not quoted)."""
    over = [r for r in results if r.settings.get("overloaded")]
    if not over:
        return None
    return (
        f"warning: {len(over)} of {len(results)} configurations are overloaded (overloaded = True): "
        f"{rate:g} requests/s arrive but they serve at most capacity_rps at full load, so their queues grow "
        f"and no latency is quoted; lower --rate, raise --batch, or size replicas with saguaro plan"
    )


def run(args: argparse.Namespace) -> int:
    from simulator import Policy, feasibility, rounds_per_second, simulate, sweep, write_chrome_trace

    if args.validate:
        return _validate(args)
    scenario = scenario_from_args(args, args.rate)
    grid = _grid(args)
    points, chosen_lines = [], []
    progress = Progress("simulate: settling K / budget auto", args)
    try:
        given = grid.points()
        for point in given:  # K / budget "auto": settled as the engine would (a simulation per K)
            point, chosen = scenario.resolve(point)
            points.append(point)
            chosen_lines += [chosen] if chosen else []
            progress(len(points), len(given))
    finally:
        progress.close()
    if args.json != "-":
        for line in chosen_lines:
            print(f"auto: {line}", file=sys.stderr)
    feasibility.check(*(scenario.config(**p) for p in points))  # cannot run as asked: one line, exit 2
    if args.benchmark:
        configs = [scenario.config(**p) for p in points]
        for config in configs:
            wall, cpu = max(rounds_per_second(config) for _ in range(3))
            where = ", ".join(f"{k} {v}" for k, v in config.settings().items())
            print(
                f"{where}: {wall:,.0f} simulated rounds per second of wall time, {cpu:,.0f} per "
                f"second of CPU time (best of 3 runs of {config.rounds:,} rounds)"
            )
        return 0
    fanout = flat(args.fanout)
    if fanout is not None:
        if len(points) != 1 or points[0]["strategy"].value != "ssd":
            raise ValueError("--fanout gives one explicit schedule: use it with one SSD configuration")
        if any(f != int(f) for f in fanout):
            raise ValueError(
                f"--fanout takes whole numbers of guesses F_0 ... F_K; got {' '.join(f'{f:g}' for f in fanout)}"
            )
    if args.trace and len(points) != 1:
        raise ValueError("--trace writes the timeline of one configuration: give one value per axis")
    if len(points) == 1:
        p = points[0]
        config = scenario.config(**p)
        if fanout is not None:
            from dataclasses import replace

            config = replace(
                config,
                policy=Policy(
                    "ssd",
                    K=p["K"],
                    fanout=tuple(int(f) for f in fanout),
                    backup=p["backup"],
                    miss_policy=args.miss_policy,
                ),
            )
        result = simulate(config, trace=bool(args.trace))
        if args.trace:
            print(f"trace: {write_chrome_trace(result.timeline, args.trace)}")
        result, overloaded = feasibility.honest(config, result)  # overloaded: capacity, not latency
        results = [result]
        if overloaded is not None:
            print(f"warning: {overloaded}", file=sys.stderr)
        if args.json != "-":
            print(_detail(result, args.markdown))
    else:
        progress = Progress("simulate", args)
        try:
            swept = sweep(scenario, grid, progress=progress, points=points)  # in the order of points
        finally:
            progress.close()
        results = [feasibility.honest(scenario.config(**p), r)[0] for p, (_, r) in zip(points, swept, strict=True)]
        if args.json != "-":
            print(table([r.row() for r in results], TABLE_COLUMNS, markdown=args.markdown))
        warning = _overload_warning(results, args.rate)
        if warning:
            print(warning, file=sys.stderr)
    if args.json:
        write_json(args.json, {"inputs": scenario_inputs(args, scenario), "results": [r.to_dict() for r in results]})
    return 0
