"""What a plan rests on, said once: models, hardware, timing, acceptance, hits, workload, SLO, seed.

Each assumption comes with its source: a preset (and that preset's own source), a file measured from,
a flag given, or a flag's default, which is called what it is: assumed, not measured. Flags whose
default is an assumption are compared with the parser's defaults (`args._defaults`).
"""

from __future__ import annotations

import argparse

from saguaro.commands.hit_choice import alpha_choice, hit_choice
from simulator import ConstantHit, FittedTiming, IidAcceptance, PerPositionAcceptance, PowerLawHit, RooflineTiming
from simulator.alpha_hits import AlphaHit
from simulator.hits import EmpiricalHit
from simulator.presets import ENGINE_SOURCES, PAIR_SOURCES


def _source(args, flag: str, given: str = "given", default: str = "default: assumed, not measured") -> str:
    return default if getattr(args, flag) == args._defaults[flag] else given


def _lengths_text(lengths) -> str:
    if lengths is None:
        return "endless"
    return f"{lengths.low}" if lengths.upper == lengths.low else f"uniform {lengths.low}..{lengths.upper}"


def assumptions(args: argparse.Namespace, scenario, targets) -> list[dict]:
    """What the plan rests on, as rows (assumption, value, source)."""
    rows = []

    def add(name, value, source):
        rows.append({"assumption": name, "value": value, "source": source})

    timing = scenario.timing
    if isinstance(timing, RooflineTiming):
        t, d = timing.target, timing.draft
        given = [f"--{f}" for f in ("target", "draft") if getattr(args, f)] + (["--tp"] if args.tp else [])
        add(
            "pair",
            f"{args.pair}: target {t.model.name} at TP {t.tp}, draft {d.model.name}",
            ", ".join(given) + " given" if given else PAIR_SOURCES.get(args.pair, "given"),
        )
        add(
            "hardware",
            f"target {t.tp}× {t.hardware.name}, draft 1× {d.hardware.name} (SSD: its own device)"
            + (
                "; eager forwards"
                if t.eager
                else "; forwards replayed from CUDA graphs"
                if t.hardware.launch_overhead_us is not None
                else ""
            ),
            "simulator/presets.py: datasheet peaks; efficiencies assumed; per-layer and launch overheads calibrated",
        )
        add("timing", f"roofline of the presets, engine {args.engine}", ENGINE_SOURCES[args.engine])
    else:
        add("pair, hardware", "none: the timing model below stands for them", "--timing / --fit")
        if isinstance(timing, FittedTiming):
            add("timing", "fitted to engine records", f"measured: {' '.join(args.fit)}")
            if timing.build_level:
                add("build level", timing.build_level_text(), f"measured: {' '.join(args.fit)}")
            if timing.levels:
                add("timing level", timing.level_text(), f"measured: {' '.join(args.level)}")
        else:
            add(
                "timing",
                f"constant: T_v {timing.t_verify_ms:g} ms, T_d {timing.t_draft_ms:g} ms",
                "--t-verify-ms, --t-draft-ms (given or defaults)",
            )
    acc = scenario.acceptance
    if args.calibrate:
        add("acceptance", f"i.i.d., α = {acc.alpha:.3f}", f"measured: {args.calibrate}")
    elif isinstance(acc, IidAcceptance):
        add("acceptance", f"i.i.d., α = {acc.alpha:.3g}", alpha_choice(args)[1])
    elif isinstance(acc, PerPositionAcceptance):
        add("acceptance", "per position, α = " + ", ".join(f"{a:g}" for a in acc.alphas), "given")
    else:
        add("acceptance", "replayed records", f"measured: {args.replay}")
    hits = scenario.hits
    if isinstance(hits, PowerLawHit):
        flags = PowerLawHit(args.r, args.scale)
        if args.calibrate and hits != flags:  # --calibrate measured r and scale from SSD rounds
            src = f"measured: {args.calibrate}"
        elif (args.r, args.scale) == (args._defaults["r"], args._defaults["scale"]):
            src = "--r, --scale defaults: assumed, not measured"
        else:
            src = "--r, --scale given"
        add(
            "cache hits",
            f"power law: misses {hits.scale:g}·F^(-{hits.r:g}) per outcome; fan-out rule {args.fanout_rule}",
            src,
        )
    elif isinstance(hits, ConstantHit):
        add("cache hits", f"constant p_hit = {hits.p_hit:g}", "--p-hit " + _source(args, "p_hit"))
    elif isinstance(hits, EmpiricalHit):
        fit = hits.meta.get("power_law") or {}
        shape = f"; power-law fit r = {fit['r']:g} ({fit['r_ci95'][0]:g}..{fit['r_ci95'][1]:g})" if fit else ""
        why = f"measured: {args.calibrate}" if args.calibrate else hit_choice(args, acc.alpha)[1]
        add(
            "cache hits",
            f"measured ranks of the bonus among the draft's guesses{shape}; fan-out rule {args.fanout_rule}",
            why,
        )
    elif isinstance(hits, AlphaHit):
        rate, low, high = hits.interval((3,) * 5)
        add(
            "cache hits",
            f"α-model at α {hits.alpha:.3f}, T {hits.temperature:g} "
            f"(e.g. {rate:.2f}, {low:.2f}-{high:.2f} of outcomes at K 4, F 3); fan-out rule {args.fanout_rule}",
            hits.source,
        )
    if scenario.saguaro is not None:
        add("Saguaro table", f"C in {scenario.saguaro.C[0]:g}..{scenario.saguaro.C[-1]:g}", args.saguaro_table)
    if getattr(args, "miss_policy", None):
        add("SSD miss policy", args.miss_policy, "--miss-policy")
    if args.link_latency_ms is not None or args.link_gb_s:
        link_source = "--link-latency-ms, --link-gb-s given"
    elif isinstance(timing, RooflineTiming):
        link_source = "the draft hardware's interconnect (assumed)"
    else:
        link_source = "fitted" if isinstance(timing, FittedTiming) else "none (constant timing)"
    add(
        "SSD link",
        f"{scenario.link.latency_ms:g} ms, {scenario.link.bandwidth_gb_s:g} GB/s; temperature {args.temperature:g}",
        link_source,
    )
    add(
        "prompt / output",
        f"{_lengths_text(scenario.prompt_len)} / {_lengths_text(scenario.output_len)} tokens",
        "--prompt-len / --output-len",
    )
    add(
        "arrivals",
        f"Poisson, {args.rate:g} requests/s in all (rate / replicas each; {args.check_requests} per "
        f"check); screened in a closed loop at each batch",
        "--rate, --check-requests",
    )
    add("SLO", "; ".join(map(str, targets)), "given")
    add("sizing", f"headroom {args.headroom:g}, objective {args.objective}", "--headroom, --objective")
    add("seed / rounds", f"{scenario.seed} / {scenario.rounds} rounds per screen", "--seed / --rounds")
    return rows


def left_aligned(rows: list[dict]) -> str:
    """A table of text (the assumptions), left-aligned for reading."""
    columns = list(rows[0])
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in columns]
    lines = [[c for c in columns], *([str(r[c]) for c in columns] for r in rows)]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip() for line in lines)
