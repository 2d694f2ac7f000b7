"""Which acceptance rate and which cache-hit model a simulation or plan takes when the flags leave them open,
and why (the reason goes into the printed assumptions and the JSON inputs).

- α: --alpha if given; else a pair preset's own (`simulator.presets.PAIR_ALPHA`, fitted to the pair's published
  SD figure); else the default pair's measured α (the mean over positions of its rank table for --hit-table at
  --temperature); else 0.8, assumed.
- hits (--hit-model auto): a measured rank table belongs to the pair it was measured on. The default pair's
  (simulator/data/hit_tables.json) is taken where that pair is simulated: --pair qwen-coder on the presets, or
  a calibration of this machine (--fit, `saguaro calibrate` runs the default pair unless told otherwise);
  anywhere else the α-model at that α and --temperature (simulator.alpha_hits), with its interval.
"""

from __future__ import annotations

import argparse

import numpy as np

DEFAULT_PAIR = "qwen-coder"
ASSUMED_ALPHA = 0.8


def measured_pair(args: argparse.Namespace) -> bool:
    """The default pair, whose rank tables were measured, is the one simulated."""
    if getattr(args, "fit", None) or getattr(args, "level", None):
        return True
    if getattr(args, "timing", "roofline") == "constant":
        return False
    return args.pair == DEFAULT_PAIR and not args.target and not args.draft


def alpha_choice(args: argparse.Namespace) -> tuple[float, str]:
    """(α, where it comes from)."""
    from simulator.hits import measured
    from simulator.presets import PAIR_ALPHA

    if args.alpha is not None:
        return args.alpha, "--alpha given"
    if getattr(args, "timing", "roofline") != "constant" and not args.target and not args.draft:
        if args.pair in PAIR_ALPHA and not getattr(args, "fit", None):
            return PAIR_ALPHA[args.pair], (
                f"fitted to {args.pair}'s published SD figure (saguaro validate paper, simulator.presets.PAIR_ALPHA)"
            )
        if measured_pair(args):
            table = measured(args.hit_table, args.temperature)
            alphas = [a for a in table.meta.get("alpha", []) if a == a]
            if alphas:
                return float(np.mean(alphas)), f"{table.source} (mean over positions)"
    return ASSUMED_ALPHA, "--alpha default: assumed, not measured"


def hit_choice(args: argparse.Namespace, alpha: float):
    """(hit model, where it comes from) for --hit-model and the pair simulated (module docstring)."""
    from simulator import ConstantHit, PowerLawHit
    from simulator.alpha_hits import AlphaHit
    from simulator.hits import measured

    kind = args.hit_model
    if kind == "powerlaw":
        return PowerLawHit(args.r, args.scale), "--hit-model powerlaw"
    if kind == "constant":
        return ConstantHit(args.p_hit), "--hit-model constant"
    Cs = getattr(args, "C", None) or [1.0]
    if kind == "measured" or (kind == "auto" and measured_pair(args)):
        table = measured(args.hit_table, args.temperature, Cs[0] if len(Cs) == 1 else 1.0)
        why = (
            "measured on this pair" if measured_pair(args) else "--hit-model measured: applied to this pair on purpose"
        )
        return table, f"{table.source} ({why})"
    model = AlphaHit(min(alpha, 0.999), args.temperature)
    return model, f"{model.source} (no rank table was measured on this pair)"
