"""The planner's question, checked on `saguaro bench` runs: from an SD run's records plus `saguaro calibrate`
alone, predict every configuration of the runs (AR, SD, SSD at each K / budget / backup) and compare with what
they measured (`saguaro validate engine`).

- timing: `fit_timing` on the calibration records (its own prompt, SD and SSD rounds: the verify alone, the
  worker's interference, branch decode cost, backup time) at the configuration's temperature (`saguaro
  calibrate --temperature`; given several, each configuration takes the one at its temperature, else the
  nearest: at T > 0 sampling the draft's branches costs more than at T = 0), leveled (`FittedTiming.leveled`:
  an SD run's verify and draft over the fit's set the level of the target's and the draft's forwards) to the
  SD variants of the same run folder at that temperature, all K and batch sizes pooled, where the folder has
  any (the planner's case: an SD run on the machine as it is now; with `saguaro bench --order interleaved`
  every variant of the folder saw the same moments), else to the reference SD variant below; `level=False`:
  the calibration's level as it is. The SD variants that set their own folder's level are marked
  "level source";
- acceptance and hits: one reference SD variant's records per temperature (α per position, and the empirical
  hit model from where each bonus stood among the draft's guesses): the SD variant at batch 1 with the largest
  K among the runs given, so that its positions cover every K predicted (without one at batch 1, the smallest
  batch's: each row of a batch records its own outcomes);
- the simulator then runs each configuration (closed loop at its batch size, the run's mean prompt and output
  lengths) and its decode tokens/s (Σ emitted / Σ round time) is compared with the measured one, and at
  batch > 1 also with the rounds that ran at the full batch (`full_batch_tokens_per_s`: the bench's fixed
  batches end with their last rows running on alone, which the closed loop does not do).

Each row also puts the configuration's rounds beside its leveled fit term by term (verify, SD draft, SSD
build, neural backup), so that a miss can be traced to the forward the fit has wrong. A second prediction
shows the former way for contrast: timing fitted on the SD rounds alone, the power-law hit model a·F^(−r)
with r = 1, a = 0.5.

Several calibrations at one temperature are fitted as one (their records pooled, as `saguaro simulate --fit
A B` does): a calibration before the runs and one after them bracket the machine's drift over the runs.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from saguaro.calibration.files import check_same_precision, fit_all
from saguaro.validation.measured import (
    full_batch_tokens_per_s,
    label,
    lookup_alpha,
    lookup_alphas,
    measured_hit_rate,
    measured_tokens_per_s,
    variants,
)
from simulator import ClosedLoop, PerPositionAcceptance, Policy, PowerLawHit, Scenario, SimConfig, fit_timing, simulate
from simulator.fit import sd_first_widths
from simulator.hits import from_records
from simulator.link import LinkSpec
from simulator.scenario import AUTO, AUTO_K_MAX
from simulator.workload import Lengths
from theory.glossary import Backup, Strategy

log = logging.getLogger(__name__)

TOLERANCE = 0.10  # a held-out configuration's decode tokens/s is "within" when off by at most this share
TERMS = ("verify", "draft", "cache_build", "backup")


@dataclass(frozen=True)
class EngineValidation:
    """One row per configuration (`rows`, the JSON's), the calibrations by temperature (their names and fitted
    timing) and each reference temperature's level."""

    rows: list[dict]
    calibrations: dict[float, tuple[str, object]]
    levels: dict[float, object]

    def held_out(self) -> list[dict]:
        """The rows that are not an α source."""
        return [r for r in self.rows if not r["reference"]]

    def to_json(self) -> dict:
        fits = {
            f"{t:g}": {
                "calibration": str(path),
                "ssd_verify_factor": timing.ssd_verify_factor,
                "fit_errors": timing.errors,
                "build_level": timing.build_level,
                "build_level_applied": bool(timing.build_scale),
            }
            for t, (path, timing) in self.calibrations.items()
        }
        return {"rows": self.rows, "calibrations": fits, "levels": {f"{t:g}": v for t, v in self.levels.items()}}


def calibrations_by_temperature(paths: list[Path], build_level: bool = False) -> dict[float, tuple[str, object]]:
    """temperature -> (its calibrations' names, their fitted timing), the temperature from each calibration's
    .summary.json (`saguaro calibrate --temperature`; one written before that option is greedy). Several at one
    temperature make one fit over all their records (`fit_all`), as `saguaro simulate --fit A B` does: two
    calibrations taken around the runs average the machine's drift between them. ValueError with `build_level`
    on one without the engine's build rounds (`FittedTiming.with_build_level`)."""
    groups: dict[float, list[Path]] = defaultdict(list)
    for path in paths:
        summary = path.with_suffix(".summary.json")
        inputs = json.loads(summary.read_text()).get("inputs", {}) if summary.is_file() else {}
        groups[float(inputs.get("temperature", 0.0))].append(path)
    found: dict[float, tuple[str, object]] = {}
    for temperature, group in groups.items():
        timing = fit_all([str(path) for path in group])
        found[temperature] = (" + ".join(map(str, group)), timing.with_build_level() if build_level else timing)
    return found


def timing_at(calibrations: dict[float, tuple[str, object]], temperature: float, say: bool = False):
    """The calibration at this temperature, else the nearest one (a warning when `say`)."""
    nearest = min(calibrations, key=lambda t: (abs(t - temperature), t))
    if say and nearest != temperature:
        log.warning(
            "T = %g: no calibration at this temperature; the one at T = %g (%s) stands in",
            temperature,
            nearest,
            calibrations[nearest][0],
        )
    return calibrations[nearest][1]


def is_auto(settings: dict) -> bool:
    """K "auto" (the bench's adaptive variants) or SSD's budget "auto": the simulator settles them."""
    return bool(settings.get("adaptive")) or settings.get("budget") == "auto"


def predict_auto(
    timing, settings: dict, acceptance, hits, prompt: int, output: int, batch: int, rounds: int, seed: int
) -> tuple[object, str]:
    """A K / budget "auto" variant: settled as the engine would (simulator.scenario.Scenario.resolve); α per
    position beyond the reference's K is its last measured rate."""
    if isinstance(acceptance, PerPositionAcceptance) and len(acceptance.alphas) < AUTO_K_MAX:
        pad = (acceptance.alphas[-1],) * (AUTO_K_MAX - len(acceptance.alphas))
        acceptance = replace(acceptance, alphas=acceptance.alphas + pad)
    strategy = settings["system"]
    scenario = Scenario(
        timing=timing,
        acceptance=acceptance,
        hits=hits,
        prompt_len=Lengths(prompt),
        output_len=Lengths(output),
        rounds=rounds,
        seed=seed,
        link=LinkSpec(latency_ms=getattr(timing, "link_latency_ms", 0.0)),
        fanout_rule="uniform" if settings.get("schedule") == "uniform" else "geometric",
    )
    point = {
        "strategy": strategy,
        "K": AUTO if settings.get("adaptive") else settings["K"],
        "budget": settings.get("budget") if strategy == "ssd" else 0,
        "backup": Backup(settings.get("backup") or "neural"),
        "batch": batch,
        "C": 1.0,
    }
    point, chosen = scenario.resolve(point)
    return simulate(scenario.config(**point)), chosen or ""


def predict(timing, settings: dict, rows: list, acceptance, hits, rounds: int, seed: int, say: bool = True):
    """The simulator's result for this configuration (its decode tokens/s, and for SSD its hit rate)."""
    first = rows[0]
    starts = [r for i, r in enumerate(rows) if i == 0 or r.context_len < rows[i - 1].context_len]
    prompt = max(1, round(float(np.mean([r.context_len for r in starts]))))
    calls = len(starts)
    output = max(2, round(sum(sum(r.emitted) for r in rows) / (calls * first.batch_size)) + 1)
    strategy = settings["system"]
    if is_auto(settings):
        result, chosen = predict_auto(
            timing, settings, acceptance, hits, prompt, output, first.batch_size, rounds, seed
        )
        if say:
            log.info("  %s: %s", label(settings, rows), chosen)
        return result
    backup = Backup(settings.get("backup") or "neural")
    policy = Policy(
        strategy, K=settings.get("K") or 0, fanout=first.fanout if strategy == "ssd" else None, backup=backup
    )
    config = SimConfig(
        policy=policy,
        timing=timing,
        acceptance=acceptance,
        hits=hits if strategy == "ssd" else None,
        workload=ClosedLoop(first.batch_size, Lengths(prompt), Lengths(output)),
        link=LinkSpec(latency_ms=getattr(timing, "link_latency_ms", 0.0)),
        rounds=rounds,
        seed=seed,
    )
    return simulate(config)


def terms(timing, rows: list) -> dict:
    """Per term of a configuration's rounds (the verify, SD's draft, SSD's cache build and neural backup): the
    median measured, the median the (leveled) fit predicts for the same rounds' shapes (batch, K, context,
    branches, first width), and how many rounds; terms its rounds lack are left out. Where a configuration's
    tokens/s is off, this says which forward the fit has wrong."""
    pairs: dict[str, list[tuple[float, float]]] = defaultdict(list)
    seen_by = {s: timing.for_strategy(s) for s in {r.strategy for r in rows}}  # SSD's verify with interference
    for r, width in zip(rows, sd_first_widths(rows), strict=True):
        b, K, c = r.batch_size, r.K, r.context_len
        pairs["verify"].append((r.verify_ms, seen_by[r.strategy].verify_ms(b, K + 1, c)))
        if r.strategy is Strategy.SD and r.draft_ms > 0:
            pairs["draft"].append((r.draft_ms, timing.draft_ms(b, K, c, width)))
        if r.strategy is Strategy.SSD and r.cache_build_ms:
            pairs["cache_build"].append((r.cache_build_ms, timing.cache_build_ms(b, K, r.branches, c)))
        if r.strategy is Strategy.SSD and r.backup is Backup.NEURAL and r.backup_time_ms and r.hit and not all(r.hit):
            pairs["backup"].append((r.backup_time_ms, timing.backup_ms(Backup.NEURAL, b, K, c)))
    return {
        name: {
            "measured": round(float(np.median([m for m, _ in v])), 1),
            "predicted": round(float(np.median([q for _, q in v])), 1),
            "rounds": len(v),
        }
        for name in TERMS
        if (v := pairs.get(name))
    }


def _references(found: dict) -> dict[float, tuple[str, dict, list]]:
    """Per temperature, the reference SD variant (one K, not adaptive): the smallest batch, batch 1 where there
    is one, and the largest K there. Every row of a batch records its own outcomes, so an SD run at batch 2 or
    4 tells α and the ranks as well as one at batch 1."""
    reference: dict[float, tuple[str, dict, list]] = {}
    for key, (s, rows) in found.items():
        if s["system"] == "sd" and not s.get("adaptive"):  # one K: one rank table
            best = reference.get(s["temperature"])
            if best is None or (rows[0].batch_size, -s["K"]) < (best[2][0].batch_size, -best[1]["K"]):
                reference[s["temperature"]] = (key, s, rows)
    if not reference:
        raise ValueError(
            "the runs have no SD variant (one K, not adaptive) to take α and hits from: add an SD run "
            "of the same prompts, e.g. saguaro bench --systems sd -K 5"
        )
    return reference


def _run_levels(found: dict, calibrations: dict) -> dict[tuple[str, float], object]:
    """Per (run folder, temperature): the calibration leveled to that folder's own SD variants (one K each;
    any batch, pooled)."""
    own_sd: dict[tuple[str, float], list] = defaultdict(list)
    for s, rows in found.values():
        if s["system"] == "sd" and not s.get("adaptive"):
            own_sd[(s["run"], s["temperature"])] += rows
    levels = {}
    for (run, temperature), rows in own_sd.items():
        try:
            levels[(run, temperature)] = timing_at(calibrations, temperature).leveled(rows)
        except ValueError as e:
            raise ValueError(f"{run}, T = {temperature:g}: {e}") from None
        log.info(
            "%s, T = %g: level from its own SD variants: %s", run, temperature, levels[(run, temperature)].level_text()
        )
    return levels


def validate_runs(
    runs: list[Path],
    calibrations: list[Path],
    rounds: int = 4000,
    seed: int = 0,
    level: bool = True,
    build_level: bool = False,
) -> EngineValidation:
    """Every configuration of `runs` (bench run folders) predicted from `calibrations` and the runs' SD
    variants; ValueError (what to do) on calibrations of another precision, a folder whose SD rounds cannot
    set a level, or runs without an SD variant. `build_level`: scale the fit's builds to the calibration's
    engine build rounds (`saguaro calibrate --build-tokens`), an experiment (simulator.fit)."""
    runs, calibrations = [Path(p) for p in runs], [Path(p) for p in calibrations]
    if rounds < 1:
        raise ValueError(f"--rounds must be at least 1, got {rounds}")
    check_same_precision(calibrations, runs)
    by_temperature = calibrations_by_temperature(calibrations, build_level)
    found = {k: v for run in runs for k, v in variants(run).items()}
    reference = _references(found)
    run_levels = _run_levels(found, by_temperature) if level else {}
    from_sd, levels = {}, {}
    for temperature, (key, s, rows) in reference.items():
        hits = from_records(rows)
        timing = timing_at(by_temperature, temperature, say=True)
        own = (run_levels.get((s["run"], temperature)) or timing.leveled(rows)) if level else timing
        levels[temperature] = own.levels
        from_sd[temperature] = (
            hits,
            PerPositionAcceptance(tuple(float(a) for a in hits.meta["alpha"])),
            replace(fit_timing(rows), fast_backup_ms=timing.fast_backup_ms),
            own,
        )
        leveled = f"; level: {own.level_text()}" if own.levels else ""
        log.info(
            "T = %g: α per position and hits from %s (α %s)%s",
            temperature,
            key,
            ", ".join(f"{a:.3f}" for a in hits.meta["alpha"]),
            leveled,
        )
    table = []
    for key, (settings, rows) in found.items():
        if settings["temperature"] not in from_sd:
            continue
        table.append(
            _row(
                key,
                settings,
                rows,
                from_sd[settings["temperature"]],
                run_levels,
                reference[settings["temperature"]][0],
                rounds,
                seed,
            )
        )
    return EngineValidation(rows=table, calibrations=by_temperature, levels=levels)


def _row(
    key: str, settings: dict, rows: list, sources: tuple, run_levels: dict, reference_key: str, rounds: int, seed: int
) -> dict:
    hits, acceptance, old_timing, own_timing = sources
    measured = measured_tokens_per_s(rows)
    own = settings.get("backup") == "lookup"
    if own:
        acceptance = replace(acceptance, alpha_lookup=lookup_alpha(rows), alphas_lookup=lookup_alphas(rows))
    place = (settings["run"], settings["temperature"])
    level_source = place in run_levels and settings["system"] == "sd" and not settings.get("adaptive")
    own_timing = run_levels.get(place, own_timing)
    result = predict(own_timing, settings, rows, acceptance, hits, rounds, seed)
    predicted, hit = result.decode_tokens_per_s, measured_hit_rate(rows)
    full = full_batch_tokens_per_s(rows)
    old = predict(
        old_timing, settings, rows, acceptance, PowerLawHit(1.0, 0.5), rounds, seed, say=False
    ).decode_tokens_per_s
    return {
        "configuration": label(settings, rows) + (" (own lookup α)" if own else ""),
        "run": settings["run"],
        "reference": key == reference_key,
        "level_source": level_source,
        "level": own_timing.levels or None,
        "rounds": len(rows),
        "measured": round(measured, 3),
        "predicted": round(predicted, 3),
        "error": round(predicted / measured - 1, 4),
        "measured_full_batch": None if full is None else round(full, 3),
        "error_full_batch": round(predicted / (full or measured) - 1, 4),
        "former_predicted": round(old, 3),
        "former_error": round(old / measured - 1, 4),
        "hit_rate": None if hit is None else round(hit, 4),
        "predicted_hit_rate": None if hit is None else round(result.hit_rate, 4),
        "terms": terms(own_timing, rows),
    }
