"""Capacity planning: the cheapest (or fastest) configuration that meets latency targets at an arrival rate.

0. Feasibility: a grid point that cannot run (context window, tensor parallelism, memory per device:
   simulator.feasibility) is dropped with its reason; if none can run, `plan` raises ValueError.
1. Screen: simulate every other point in a closed loop at its batch size (the replica's full load) and
   keep those that meet every target there. A replica then serves
   capacity = tokens/s ÷ mean output tokens requests per second.
   A metric with no sample (e.g. TPOT when no request finished) does not meet any target.
2. Size: replicas = ⌈rate / (capacity · headroom)⌉ (headroom < 1 keeps queues short).
3. Check: the best few by the objective are simulated in an open loop (Poisson arrivals at rate / replicas
   per replica); a replica is added until every target holds there too. The checked figures justify the plan.

The targets form the SLO; the first is the primary one (the "latency" objective ranks by it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from simulator.feasibility import problems, requests_per_s
from simulator.metrics import PERCENTILES, SimResult
from simulator.run import simulate
from simulator.scenario import Grid, Scenario
from theory.latency import METRICS

OBJECTIVES = ("accelerators", "latency")
EXTRA_REPLICAS = 8  # an open-loop check adds up to this many replicas before it gives up


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
        return latency_ms(result, self.metric, self.percentile)

    def met_by(self, latency_ms: float) -> bool:
        return latency_ms <= self.ms  # NaN (no sample) meets nothing

    def __str__(self) -> str:
        return f"{self.metric} p{self.percentile} <= {self.ms:g} ms"


def latency_ms(result: SimResult, metric: str, percentile: int) -> float:
    """One latency metric of a run at a percentile, ms (NaN without a sample)."""
    return getattr(result, f"{metric}_ms")[f"p{percentile}"]


def missed(targets: Sequence[LatencyTarget], result: SimResult) -> tuple[LatencyTarget, ...]:
    """The targets `result` does not meet."""
    return tuple(t for t in targets if not t.met_by(t.of(result)))


def shortfall(targets: Sequence[LatencyTarget], result: SimResult) -> float:
    """How far `result` is from the SLO: the largest latency / limit over the targets (≤ 1: met; no sample: inf)."""
    ratios = [t.of(result) / t.ms for t in targets]
    return max(math.inf if math.isnan(r) else r for r in ratios)


@dataclass(frozen=True)
class Candidate:
    settings: dict
    point: dict  # the grid point (Scenario.config's arguments)
    screened: SimResult  # closed loop at the batch size
    latency_ms: float  # the primary target's metric in the closed loop
    capacity_per_s: float  # requests per second one replica serves at full load
    replicas: int
    accelerators: int
    checked: SimResult | None = None  # open loop at rate / replicas: the passing check, or the last one tried
    checked_latency_ms: float | None = None
    passed: bool = False  # every target held in the open-loop check

    @property
    def meets_target(self) -> bool:
        return self.passed


@dataclass(frozen=True)
class Infeasible:
    """A grid point that cannot run as asked, and why (simulator.feasibility)."""

    settings: dict
    reason: str


@dataclass(frozen=True)
class PlanResult:
    targets: tuple[LatencyTarget, ...]  # the SLO; the first is the primary target
    rate_per_s: float
    best: Candidate | None
    candidates: tuple[Candidate, ...]  # screened points that met every target at full load, best first
    rejected: tuple[Candidate, ...]  # screened points that missed a target at full load (sized, never checked)
    infeasible: tuple[Infeasible, ...] = ()  # points that cannot run at all (not simulated)

    @property
    def target(self) -> LatencyTarget:
        return self.targets[0]

    @property
    def closest(self) -> Candidate | None:
        """With no plan, the point nearest to meeting the SLO: by its open-loop check among those checked,
        else by its full-load figures."""
        if self.best is not None:
            return None
        checked = [(c, c.checked) for c in self.candidates if c.checked is not None]
        if checked:
            return min(checked, key=lambda pair: (shortfall(self.targets, pair[1]), pair[0].accelerators))[0]
        return min(self.rejected, key=lambda c: (shortfall(self.targets, c.screened), c.accelerators), default=None)


def _rank(objective: str):
    if objective == "latency":
        return lambda c: (c.latency_ms, c.accelerators)
    return lambda c: (c.accelerators, c.latency_ms)


def _targets(target: LatencyTarget | Sequence[LatencyTarget]) -> tuple[LatencyTarget, ...]:
    targets = (target,) if isinstance(target, LatencyTarget) else tuple(target)
    if not targets:
        raise ValueError("give at least one latency target (e.g. LatencyTarget('itl', 99, 50.0))")
    metrics = [t.metric for t in targets]
    if len(set(metrics)) != len(metrics):
        raise ValueError(f"one target per latency metric; got {', '.join(map(str, targets))}")
    return targets


def plan(
    scenario: Scenario,
    grid: Grid,
    rate_per_s: float,
    target: LatencyTarget | Sequence[LatencyTarget],
    objective: str = "accelerators",
    headroom: float = 0.85,
    check_top: int = 3,
    check_requests: int = 300,
    progress: Callable[[int, int], None] | None = None,
) -> PlanResult:
    """Drop the grid's infeasible points, screen the rest, size those that meet every target for `rate_per_s`
    and check the best ones in an open loop. `progress(done, total)` is called after each simulation step
    (each screened point, then each open-loop check)."""
    targets = _targets(target)
    if not rate_per_s > 0:
        raise ValueError(f"the arrival rate must be > 0 requests per second; got {rate_per_s}")
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}; got {objective!r}")
    if not 0 < headroom <= 1:
        raise ValueError(f"headroom is the fraction of a replica's capacity to plan for, in (0, 1]; got {headroom}")
    if scenario.output_len is None:
        raise ValueError("planning needs finite output lengths (requests must finish)")
    closed = replace(scenario, rate_per_s=None, requests=None)
    feasible: list[Candidate] = []
    rejected: list[Candidate] = []
    infeasible: list[Infeasible] = []
    points = grid.points()
    steps = len(points) + check_top

    def step(done: int) -> None:
        if progress is not None:
            progress(done, steps)

    for i, point in enumerate(points):
        step(i)
        point = closed.resolve(point)[0]  # K / budget "auto" settled as the engine would (inside the step's progress)
        config = closed.config(**point)
        found = problems(config)
        if found:
            infeasible.append(Infeasible({**config.settings(), "C": point["C"]}, "; ".join(found)))
            continue
        result = simulate(config)
        capacity = requests_per_s(result, scenario.output_len)
        replicas = max(1, math.ceil(rate_per_s / (capacity * headroom))) if capacity > 0 else 1
        candidate = Candidate(
            {**result.settings, "C": point["C"]},
            point,
            result,
            targets[0].of(result),
            capacity,
            replicas,
            replicas * config.accelerators,
        )
        (rejected if missed(targets, result) else feasible).append(candidate)
    if len(infeasible) == len(points):
        first = infeasible[0]
        where = " ".join(f"{k}={v}" for k, v in first.settings.items())
        several = f"none of the {len(points)} configurations can run; the first, {where}: " if len(points) > 1 else ""
        raise ValueError(several + first.reason)
    feasible.sort(key=_rank(objective))
    checked = []
    for i, candidate in enumerate(feasible[:check_top]):
        step(len(points) + i)
        checked.append(_check(closed, candidate, rate_per_s, targets, check_requests))
    step(steps)
    passed = sorted((c for c in checked if c.meets_target), key=_rank(objective))
    best = passed[0] if passed else None
    rest = feasible[check_top:]
    return PlanResult(
        targets,
        rate_per_s,
        best,
        tuple(sorted(checked, key=_rank(objective)) + rest),
        tuple(rejected),
        tuple(infeasible),
    )


def _check(
    closed: Scenario,
    candidate: Candidate,
    rate_per_s: float,
    targets: tuple[LatencyTarget, ...],
    requests: int,
    max_extra: int = EXTRA_REPLICAS,
) -> Candidate:
    """Open-loop check at rate / replicas per replica; add replicas until every target holds, or give up after
    `max_extra` more (the candidate then carries its last check, at its sized replica count, with passed False)."""
    per_replica_devices = candidate.accelerators // candidate.replicas
    if max_extra < 0:
        raise ValueError(f"max_extra is how many replicas the check may add, >= 0; got {max_extra}")
    last: tuple[int, SimResult] | None = None
    for replicas in range(candidate.replicas, candidate.replicas + max_extra + 1):
        open_loop = replace(closed, rate_per_s=rate_per_s / replicas, requests=requests, rounds=10**9)
        result = simulate(open_loop.config(**candidate.point))
        if not missed(targets, result):
            return replace(
                candidate,
                replicas=replicas,
                accelerators=replicas * per_replica_devices,
                checked=result,
                checked_latency_ms=targets[0].of(result),
                passed=True,
            )
        last = replicas, result
    assert last is not None  # the loop ran at least once (max_extra >= 0)
    replicas, result = last
    return replace(
        candidate,
        replicas=replicas,
        accelerators=replicas * per_replica_devices,
        checked=result,
        checked_latency_ms=targets[0].of(result),
    )
