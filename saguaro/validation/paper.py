"""Published GPU figures next to the simulator's predictions (`saguaro validate paper`; simulations only, no torch).

The figures are saguaro.validation.published's: the paper's batch-1 table and the reference engine's test log.
For each published SD figure one acceptance rate α is fitted (brentq on the simulated SD decode tokens/s);
nothing else is fitted to a figure. Every other row is simulated with that α on the presets: the H100 roofline
(simulator.presets, whose per-layer and launch overheads were calibrated once, as they say), the source's
engine (simulator.presets.ENGINES: "reference" for the paper, "reference-log" for the test log, whose own
draft-cycle times it was calibrated on) and, for SSD, the α-model of cache hits at that α
(simulator.alpha_hits): no rank table has been measured on these pairs, and the default pair's is not theirs.

`run_fits` returns one result per fit; `table` and `cycle_table` print them; `payload` is the JSON.
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from scipy.optimize import brentq

from saguaro.validation.published import FIT_KEYS, FITS, SOURCES, Fit, Run
from simulator import Deployment, IidAcceptance, Lengths, LinkSpec, RooflineTiming, Scenario, SimResult, simulate
from simulator.alpha_hits import AlphaHit
from simulator.feasibility import check
from simulator.presets import ENGINE_SOURCES, PAIRS, engine_preset, hardware_preset, model_preset
from simulator.timing import EngineCosts
from theory import MissPolicy, Strategy

log = logging.getLogger(__name__)

HARDWARE = "h100"
PROMPT_TOKENS = 128  # the reference's bench truncates prompts to --input_len 128
OUTPUT_TOKENS = 512
ALPHA_XTOL = 1e-5
TOLERANCE = 0.10
SSD_RUN_F = 3  # the paper's SSD fan-out (published.SSD_PAPER), for the variants' hit-model interval


@dataclass(frozen=True)
class Setup:
    """How one fit's runs are simulated: the pair, the engine and what a variant changes."""

    pair: str
    engine: str
    rounds: int
    seed: int
    hits: object | None = None  # a HitModel; None: the α-model at the fitted α
    costs: EngineCosts | None = None  # None: the engine preset's

    @property
    def engine_costs(self) -> EngineCosts:
        return self.costs if self.costs is not None else engine_preset(self.engine)


def timing(pair: str, engine: str | EngineCosts, eager: bool = False) -> RooflineTiming:
    """The pair on the H100 preset (the target at the pair's TP, the draft on one device), with an engine's costs."""
    if pair not in PAIRS:
        raise ValueError(f"unknown pair {pair!r}: choose one of {', '.join(PAIRS)}")
    target, draft, tp = PAIRS[pair]
    hw = hardware_preset(HARDWARE)
    costs = engine_preset(engine) if isinstance(engine, str) else engine
    return RooflineTiming(
        Deployment(model_preset(target), hw, tp, eager=eager),
        Deployment(model_preset(draft), hw, 1, eager=eager),
        engine=costs,
    )


def scenario(setup: Setup, alpha: float, eager: bool = False) -> Scenario:
    """Batch in a closed loop, 128-token prompts, 512 output tokens, greedy; the worker finishes each build
    before it serves the next request (the per-row policy's timeline, which the reference's loop has)."""
    hw = hardware_preset(HARDWARE)
    target_tp = PAIRS[setup.pair][2]
    return Scenario(
        timing=timing(setup.pair, setup.engine_costs, eager),
        acceptance=IidAcceptance(alpha),
        hits=setup.hits,
        fanout_rule="uniform",
        miss_policy=MissPolicy.PER_ROW,
        prompt_len=Lengths(PROMPT_TOKENS),
        output_len=Lengths(OUTPUT_TOKENS),
        link=LinkSpec(hw.interconnect_latency_us / 1e3, hw.interconnect_gb_s),
        target_devices=target_tp,
        rounds=setup.rounds,
        seed=setup.seed,
    )


def simulate_run(setup: Setup, run: Run, alpha: float) -> SimResult:
    config = scenario(setup, alpha, run.eager).config(
        run.strategy, K=run.K, budget=max(run.budget, 1), backup=run.backup, batch=run.batch
    )
    check(config)  # context, TP and memory: ValueError if the run could not happen as set up
    return simulate(config)


def fit_alpha(setup: Setup, sd: Run, sd_tps: float) -> float:
    """The α at which simulated SD decodes at `sd_tps` (SD tokens/s grows with α)."""
    gap = lambda a: simulate_run(setup, sd, a).decode_tokens_per_s - sd_tps  # noqa: E731
    low, high = gap(0.01), gap(0.99)
    if low > 0 or high < 0:
        raise ValueError(
            f"{setup.pair} {sd.label()}: SD decodes at {low + sd_tps:.1f}..{high + sd_tps:.1f} tok/s "
            f"for α in [0.01, 0.99], so {sd_tps:.1f} tok/s cannot be fitted: change K or the presets"
        )
    return float(brentq(gap, 0.01, 0.99, xtol=ALPHA_XTOL))


def _error(predicted: float, published: float) -> float:
    return (predicted - published) / published


def draft_cycle_ms(result: SimResult) -> float:
    """The simulated SSD worker's busy time a round: backups and cache builds."""
    draft = result.breakdown_ms.get("draft", {})
    return (draft.get("cache_build", 0.0) + draft.get("backup", 0.0)) / max(result.rounds, 1)


def run_fit(
    fit: Fit, rounds: int, seed: int, hits: Callable[[float], object] | None = None, engine: str | None = None
) -> dict:
    """Fit α to the SD figure, then simulate every row's runs with it. `hits(α)`: another hit model (a
    variant; default the α-model at α); `engine`: another engine preset (a variant)."""
    setup = Setup(fit.pair, engine or fit.engine, rounds, seed)
    results: dict[Run, SimResult] = {}
    ar = simulate_run(setup, Run(Strategy.AR), 0.5)  # AR does not depend on α
    sd_tps = fit.sd_tps if fit.sd_tps is not None else fit.sd_over_ar * ar.decode_tokens_per_s
    alpha = fit_alpha(setup, fit.sd, sd_tps)
    hit_model = hits(alpha) if hits is not None else AlphaHit(alpha)
    bound = replace(setup, hits=hit_model)

    def result(run: Run) -> SimResult:
        if run not in results:
            results[run] = ar if run.strategy is Strategy.AR else simulate_run(bound, run, alpha)
        return results[run]

    rows = []
    for row in fit.rows:
        value = result(row.run).decode_tokens_per_s
        if row.over is not None:
            value /= result(row.over).decode_tokens_per_s
        res = result(row.run)
        error = _error(value, row.published)
        rows.append(
            {
                "figure": row.figure,
                "run": row.run.label(),
                "over": row.over.label() if row.over else None,
                "batch": row.run.batch,
                "published": row.published,
                "predicted": value,
                "error": error,
                "role": row.role,
                "hit_rate": res.hit_rate,
                "tokens_per_round": res.tokens_per_round,
                "cycle_ms": row.cycle_ms,
                "simulated_cycle_ms": draft_cycle_ms(res) if row.run.strategy is Strategy.SSD else None,
                "blocked": row.blocked if abs(error) > TOLERANCE and row.role.startswith("predicted") else "",
            }
        )
    by_fanout: dict[tuple[int, int], list[str]] = {}
    for run in dict.fromkeys(r.run for r in fit.rows if r.run.strategy is Strategy.SSD):
        by_fanout.setdefault((run.K, run.F), []).append(run.label())
    schedules = {
        ", ".join(labels): hit_line(hit_model, Run(Strategy.SSD, K, F)) for (K, F), labels in by_fanout.items()
    }
    return {
        "fit": fit.key,
        "source": fit.source,
        "pair": fit.pair,
        "engine": setup.engine,
        "engine_source": ENGINE_SOURCES[setup.engine],
        "sd": fit.sd.label(),
        "sd_target_tps": sd_tps,
        "alpha": alpha,
        "hit_model": schedules,
        "rows": rows,
        "rounds": rounds,
        "seed": seed,
    }


def hit_line(model, run: Run) -> str:
    """The hit model an SSD run was predicted with, in one line (with its interval for the α-model)."""
    fanout = (run.F,) * (run.K + 1)
    if isinstance(model, AlphaHit):
        return model.describe(fanout)
    source = getattr(model, "source", type(model).__name__)
    return f"{source} (applied to this pair on purpose: a variant)"


def run_fits(keys: list[str] | None = None, rounds: int = 3000, seed: int = 0) -> list[dict]:
    """Every fit of saguaro.validation.published (or those named), each with its predicted rows."""
    if rounds < 1:
        raise ValueError(f"--rounds must be at least 1, got {rounds}")
    keys = list(FIT_KEYS) if keys is None else keys
    unknown = [k for k in keys if k not in FIT_KEYS]
    if unknown:
        raise ValueError(f"unknown fit(s) {' '.join(unknown)}: choose from {' '.join(FIT_KEYS)}")
    out = []
    for fit in FITS:
        if fit.key in keys:
            log.info("fitting %s", fit.key)
            out.append(run_fit(fit, rounds, seed))
    return out


# -- variants: one uncertain choice moved at a time on the paper's rows, α refitted each time -------------
def _with_K(fit: Fit, K: int) -> Fit:
    def moved(run: Run | None) -> Run | None:
        return None if run is None or run.strategy is Strategy.AR else replace(run, K=K)

    rows = tuple(replace(row, run=moved(row.run) or row.run, over=moved(row.over) or row.over) for row in fit.rows)
    return replace(fit, sd=replace(fit.sd, K=K), rows=rows)


def _interval_end(alpha: float, fanout: tuple[int, ...], quantile: float) -> AlphaHit:
    """The α-model with the resampled parameters whose hit rate for `fanout` sits at this quantile."""
    model = AlphaHit(alpha)
    ranked = sorted(model.fit.resampled, key=lambda p: model.hit_rate(alpha, fanout, p))
    params = ranked[min(int(quantile * len(ranked)), len(ranked) - 1)]
    return AlphaHit(alpha, fit=replace(model.fit, params=params))


def variants(rounds: int, seed: int, keys: tuple[str, ...] = ("paper-llama", "paper-qwen3")) -> list[dict]:
    """The paper's fits again with one choice moved: the hit model's interval ends, the default pair's measured
    table (applied here on purpose), every outcome cached, the other engines, K 4."""
    from simulator import ConstantHit
    from simulator.hits import measured

    out = []
    for fit in (f for f in FITS if f.key in keys):
        fanout = (SSD_RUN_F,) * (max(r.run.K for r in fit.rows) + 1)
        moves = [
            ("α-model, low end of its 90% interval", fit, {"hits": lambda a, F=fanout: _interval_end(a, F, 0.05)}),
            ("α-model, high end of its 90% interval", fit, {"hits": lambda a, F=fanout: _interval_end(a, F, 0.95)}),
            (
                "the default pair's measured table (Spec-Bench, T 0), applied on purpose",
                fit,
                {"hits": lambda a: measured()},
            ),
            ("every outcome cached (Cor. 9's ceiling)", fit, {"hits": lambda a: ConstantHit(1.0)}),
            ("engine saguaro (SD drafts K forwards)", fit, {"engine": "saguaro"}),
            ("engine reference-log (the test log's draft costs)", fit, {"engine": "reference-log"}),
            ("K 4 for SD and SSD", _with_K(fit, 4), {}),
        ]
        for label, moved, kwargs in moves:
            res = run_fit(moved, rounds, seed, **kwargs)
            out.append({**res, "variant": label})
    return out


def variant_table(results: list[dict]) -> str:
    lines = ["| fit | variant | α (fitted) | " + "figure: predicted (error) |", "|---|---|---|---|"]
    for res in results:
        cells = "; ".join(
            f"{row['figure']} {_fmt(row['predicted'])} ({100 * row['error']:+.1f}%)"
            for row in res["rows"]
            if row["role"].startswith("predicted")
        )
        lines.append(f"| {res['fit']} | {res['variant']} | {res['alpha']:.3f} | {cells} |")
    return "\n".join(lines)


# -- output ---------------------------------------------------------------------------------------------
def _fmt(value: float) -> str:
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def table(results: list[dict]) -> str:
    """One Markdown row per published figure: published, predicted, error, and what the row is."""
    lines = [
        "| source | pair | α (fitted) | figure | run | published | predicted | error | role |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for res in results:
        for row in res["rows"]:
            run = row["run"] + (f" / {row['over']}" if row["over"] else "")
            lines.append(
                f"| {res['source']} | {res['pair']} | {res['alpha']:.3f} | {row['figure']} | {run} | "
                f"{_fmt(row['published'])} | {_fmt(row['predicted'])} | {100 * row['error']:+.1f}% | "
                f"{row['role']} |"
            )
    return "\n".join(lines)


def cycle_table(results: list[dict]) -> str:
    """The SSD draft's cycle a round, published (the log's "avg draft step") against simulated."""
    lines = [
        "| pair | run | published cycle (ms) | simulated (ms) | error | simulated hit rate | "
        "tokens a round a sequence: published (tok/s × cycle ÷ batch) | simulated |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for res in results:
        for row in res["rows"]:
            if row["cycle_ms"] is None:
                continue
            published = row["published"] * row["cycle_ms"] / 1e3 / row["batch"]
            lines.append(
                f"| {res['pair']} | {row['run']} | {row['cycle_ms']:.2f} | {row['simulated_cycle_ms']:.2f} | "
                f"{100 * _error(row['simulated_cycle_ms'], row['cycle_ms']):+.1f}% | {row['hit_rate']:.3f} | "
                f"{published:.2f} | {row['tokens_per_round']:.2f} |"
            )
    return "\n".join(lines) if len(lines) > 2 else ""


def inputs_text(results: list[dict]) -> str:
    """What each fit rests on: its source, engine, α and the hit model of each SSD run."""
    lines = []
    for res in results:
        lines.append(
            f"- {res['fit']} ({SOURCES[res['source']]}): engine {res['engine']} ({res['engine_source']}); "
            f"α {res['alpha']:.4f} fitted to SD {res['sd']} at {res['sd_target_tps']:.1f} tok/s"
        )
        for run, line in res["hit_model"].items():
            lines.append(f"  - hit model of {run}: {line}")
    return "\n".join(lines)


def blocked_text(results: list[dict]) -> str:
    """For each predicted row more than 10% off: the assumption it misses and the measurement that settles it."""
    lines = []
    for res in results:
        for row in res["rows"]:
            if row["blocked"]:
                lines.append(f"- {res['pair']} {row['run']} ({100 * row['error']:+.1f}%): {row['blocked']}")
    return "\n".join(dict.fromkeys(lines))


def summary(results: list[dict]) -> tuple[int, int]:
    """(predicted rows within 10%, predicted rows)."""
    predicted = [row for res in results for row in res["rows"] if row["role"].startswith("predicted")]
    return sum(abs(row["error"]) <= TOLERANCE for row in predicted), len(predicted)


def git_commit() -> dict:
    """The commit the simulator ran at, and whether its sources differed from it (None: not a git checkout)."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "simulator", "theory", "saguaro/validation"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError) as err:
        log.warning("no git commit recorded: %s", err)
        return {"commit": None, "sources_modified": None}
    return {"commit": head.stdout.strip(), "sources_modified": bool(dirty.stdout.strip())}


def payload(results: list[dict], spread: list[dict], command: str) -> dict:
    within, predicted = summary(results)
    return {
        "command": command,
        "git": git_commit(),
        "hardware": HARDWARE,
        "prompt_tokens": PROMPT_TOKENS,
        "output_tokens": OUTPUT_TOKENS,
        "sources": SOURCES,
        "predicted_within_10_percent": [within, predicted],
        "fits": results,
        "variants": spread,
    }
