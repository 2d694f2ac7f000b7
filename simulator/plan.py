"""Capacity planning: the cheapest (or fastest) configuration that meets a latency target at an arrival rate.

1. Screen: simulate every grid point in a closed loop at its batch size (the replica's full load) and
   keep those whose latency metric meets the target there. A replica then serves
   capacity = tokens/s ÷ mean output tokens requests per second.
   A metric with no sample (e.g. TPOT when no request finished) does not meet any target.
2. Size: replicas = ⌈rate / (capacity · headroom)⌉ (headroom < 1 keeps queues short).
3. Check: the best few by the objective are simulated in an open loop (Poisson arrivals at rate / replicas
   per replica); a replica is added until the target holds there too. The checked figures justify the plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from theory.latency import METRICS

from simulator.metrics import PERCENTILES, SimResult
from simulator.run import simulate
from simulator.scenario import Grid, Scenario

OBJECTIVES = ("accelerators", "latency")


@dataclass(frozen=True)
class LatencyTarget:
    """E.g. LatencyTarget("itl", 99, 50.0): inter-token latency at p99 of at most 50 ms.

    `metric` is one of theory.latency's: ttft, tpot, itl (per streamed chunk: one gap per speculative round),
    e2el.
    """

    metric: str = "itl"
    percentile: int = 99
    ms: float = 100.0

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"latency metric must be one of {', '.join(METRICS)}; got {self.metric!r}")
        if self.percentile not in PERCENTILES:
            raise ValueError(f"percentile must be one of {PERCENTILES}; got {self.percentile}")
        if not self.ms > 0:
            raise ValueError(f"the latency target must be > 0 ms; got {self.ms}")

    def of(self, result: SimResult) -> float:
        """The metric's percentile in ms (NaN when the run has no sample of it)."""
        return getattr(result, f"{self.metric}_ms")[f"p{self.percentile}"]

    def met_by(self, latency_ms: float) -> bool:
        return latency_ms <= self.ms  # NaN (no sample) meets nothing

    def __str__(self) -> str:
        return f"{self.metric} p{self.percentile} <= {self.ms:g} ms"


@dataclass(frozen=True)
class Candidate:
    settings: dict
    point: dict  # the grid point (Scenario.config's arguments)
    screened: SimResult  # closed loop at the batch size
    latency_ms: float  # the target metric in the closed loop
    capacity_per_s: float  # requests per second one replica serves at full load
    replicas: int
    accelerators: int
    checked: SimResult | None = None  # open loop at rate / replicas, if checked
    checked_latency_ms: float | None = None

    @property
    def meets_target(self) -> bool:
        return self.checked is not None


@dataclass(frozen=True)
class PlanResult:
    target: LatencyTarget
    rate_per_s: float
    best: Candidate | None
    candidates: tuple[Candidate, ...]  # screened points that met the target at full load, best first
    rejected: tuple[tuple[dict, float], ...]  # (settings, latency) of points that missed it at full load


def _rank(objective: str):
    if objective == "latency":
        return lambda c: (c.latency_ms, c.accelerators)
    return lambda c: (c.accelerators, c.latency_ms)


def plan(scenario: Scenario, grid: Grid, rate_per_s: float, target: LatencyTarget,
         objective: str = "accelerators", headroom: float = 0.85, check_top: int = 3,
         check_requests: int = 300) -> PlanResult:
    """Screen the grid, size each feasible point for `rate_per_s` and check the best ones in an open loop."""
    if not rate_per_s > 0:
        raise ValueError(f"the arrival rate must be > 0 requests per second; got {rate_per_s}")
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}; got {objective!r}")
    if not 0 < headroom <= 1:
        raise ValueError(f"headroom is the fraction of a replica's capacity to plan for, in (0, 1]; got {headroom}")
    if scenario.output_len is None:
        raise ValueError("planning needs finite output lengths (requests must finish)")
    closed = replace(scenario, rate_per_s=None, requests=None)
    mean_output = scenario.output_len.mean
    feasible, rejected = [], []
    for point in grid.points():
        config = closed.config(**point)
        result = simulate(config)
        settings = {**result.settings, "C": point["C"]}
        latency = target.of(result)
        if not target.met_by(latency):
            rejected.append((settings, latency))
            continue
        capacity = result.tokens_per_s / mean_output
        replicas = max(1, math.ceil(rate_per_s / (capacity * headroom)))
        feasible.append(Candidate(settings, point, result, latency, capacity, replicas,
                                  replicas * config.accelerators))
    feasible.sort(key=_rank(objective))
    checked = [_check(closed, c, rate_per_s, target, check_requests) for c in feasible[:check_top]]
    passed = sorted((c for c in checked if c.meets_target), key=_rank(objective))
    best = passed[0] if passed else None
    rest = [c for c in feasible if c not in feasible[:check_top]]
    return PlanResult(target, rate_per_s, best, tuple(sorted(checked, key=_rank(objective)) + rest),
                      tuple(rejected))


def _check(closed: Scenario, candidate: Candidate, rate_per_s: float, target: LatencyTarget,
           requests: int, max_extra: int = 8) -> Candidate:
    """Open-loop check at rate / replicas per replica; add replicas until the target holds (or give up)."""
    per_replica_devices = candidate.accelerators // candidate.replicas
    for replicas in range(candidate.replicas, candidate.replicas + max_extra + 1):
        open_loop = replace(closed, rate_per_s=rate_per_s / replicas, requests=requests, rounds=10**9)
        config = open_loop.config(**candidate.point)
        result = simulate(config)
        latency = target.of(result)
        if target.met_by(latency):
            return replace(candidate, replicas=replicas, accelerators=replicas * per_replica_devices,
                           checked=result, checked_latency_ms=latency)
    return candidate
