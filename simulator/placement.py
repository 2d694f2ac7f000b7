"""Where SSD pays: SSD with the draft on hardware of its own against AR and SD with everything for the target.

Given N devices (GPUs, or a CPU's cores), SSD keeps one for its draft worker and runs the target on the rest;
AR and SD put the target on all N (SD's draft beside it). Each side is simulated at its best K (and SSD at its
auto budget), as the engine's K and budget "auto" settle; the SLO's targets say which may run, and the fastest
that meets them wins. On GPU presets "on N" means tensor parallelism at the largest degree up to N that the
model's heads allow (TP 5 for Llama-3.1-70B does not exist: it runs at TP 4); on a CPU it means N threads.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from simulator.feasibility import problems, tp_problems
from simulator.hardware import Deployment
from simulator.metrics import SimResult
from simulator.plan import LatencyTarget, missed
from simulator.run import simulate
from simulator.scenario import AUTO, Scenario
from simulator.timing import RooflineTiming
from theory.glossary import Backup, Strategy


@dataclass(frozen=True)
class Option:
    """One placement of one strategy: how it is simulated and where it runs, in words."""

    strategy: Strategy
    where: str
    scenario: Scenario


@dataclass(frozen=True)
class Outcome:
    option: Option
    point: dict | None  # the resolved configuration (None: it cannot run)
    result: SimResult | None
    missed: tuple[LatencyTarget, ...] = ()
    reason: str = ""  # why it cannot run

    @property
    def tokens_per_s(self) -> float:
        return self.result.decode_tokens_per_s if self.result is not None else math.nan

    @property
    def meets(self) -> bool:
        return self.result is not None and not self.missed


def largest_tp(deployment: Deployment, devices: int) -> int | None:
    """The largest tensor-parallel degree up to `devices` the model's heads and the devices' memory allow."""
    for tp in range(devices, 0, -1):
        if tp_problems(deployment.model, tp):
            continue
        try:
            Deployment(deployment.model, deployment.hardware, tp, deployment.eager)
        except ValueError:
            return None  # too little memory at this degree, so at any smaller one
        return tp
    return None


def preset_options(base: Scenario, devices: int) -> list[Option]:
    """SSD (target on devices − 1, draft on one), SD and AR (target on all `devices`) for a roofline scenario."""
    timing = base.timing
    if not isinstance(timing, RooflineTiming):
        raise ValueError("preset placements need roofline timing (--pair and --hardware presets)")
    if devices < 2:
        raise ValueError(f"SSD's draft needs a device of its own: give --devices 2 or more, got {devices}")
    name = timing.target.hardware.name
    out = []
    for strategy, share in ((Strategy.SSD, devices - 1), (Strategy.SD, devices), (Strategy.AR, devices)):
        tp = largest_tp(timing.target, share)
        if tp is None:
            raise ValueError(f"{timing.target.model.name} fits on no {share} × {name}: give more --devices")
        target = replace(timing.target, tp=tp)
        spare = share - tp
        where = f"target on {tp} × {name}" + (f" ({spare} idle: TP {share} does not divide the heads)" if spare else "")
        where += (
            ", draft on its own" if strategy is Strategy.SSD else ", draft beside it" if strategy is Strategy.SD else ""
        )
        out.append(Option(strategy, where, replace(base, timing=replace(timing, target=target), target_devices=tp)))
    return out


def compare(options: Sequence[Option], batch: int, targets: Sequence[LatencyTarget] = ()) -> list[Outcome]:
    """Each option at its best K (SSD: budget auto, neural backup), closed loop at `batch`."""
    out = []
    for option in options:
        closed = replace(option.scenario, rate_per_s=None, requests=None)
        point: dict[str, Any] = {
            "strategy": option.strategy,
            "K": 0 if option.strategy is Strategy.AR else AUTO,
            "budget": AUTO if option.strategy is Strategy.SSD else 0,
            "backup": Backup.NEURAL,
            "batch": batch,
            "C": 1.0,
        }
        point = closed.resolve(point)[0]
        config = closed.config(**point)
        found = problems(config)
        if found:
            out.append(Outcome(option, None, None, reason="; ".join(found)))
            continue
        result = simulate(config)
        out.append(Outcome(option, point, result, missed(targets, result)))
    return out


def winner(outcomes: Sequence[Outcome]) -> Outcome | None:
    """The fastest outcome that meets every target (None: none does)."""
    meeting = [o for o in outcomes if o.meets]
    return max(meeting, key=lambda o: o.tokens_per_s) if meeting else None
