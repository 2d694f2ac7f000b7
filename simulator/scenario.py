"""A study's fixed part (timing, acceptance, workload shape, devices) and the knobs swept over it.

`Scenario.config(strategy, K, budget, backup, batch, C)` builds one `SimConfig`; `sweep` runs a grid.
The fan-out schedule for a budget B comes from theory: Thm 12's exact integer optimum for the power-law
miss model ("geometric", the default) or the reference engine's even spread ("uniform").
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from theory import Backup, MissPolicy, Strategy, integer_fanout
from theory import uniform_fanout as theory_uniform_fanout

from simulator.acceptance import (
    AcceptanceModel,
    HitModel,
    IidAcceptance,
    PerPositionAcceptance,
    PowerLawHit,
    Replay,
    Source,
)
from simulator.hits import EmpiricalHit, best_schedule, measured
from simulator.link import LinkSpec
from simulator.metrics import SimResult
from simulator.run import Policy, SimConfig, simulate
from simulator.timing import TimingModel
from simulator.workload import ClosedLoop, Lengths, OpenLoop

FANOUT_RULES = ("geometric", "uniform")


@dataclass(frozen=True)
class SaguaroTable:
    """How Saguaro's constant C moves acceptance and the miss model, from measured points (linear in C).

    Each point: C, α (per-token acceptance at that C), and the power-law miss model's r and scale.
    Smaller C: more hits, lower α (Thm 15). Measure the points with the engine (or theory.saguaro_position
    on sampled p, q) for your model pair and temperature.
    """

    C: tuple[float, ...]
    alpha: tuple[float, ...]
    r: tuple[float, ...]
    scale: tuple[float, ...]

    def __post_init__(self) -> None:
        n = len(self.C)
        if n == 0 or any(len(v) != n for v in (self.alpha, self.r, self.scale)):
            raise ValueError("a Saguaro table needs the same number (>= 1) of C, alpha, r and scale values")
        if any(not 0 < c <= 1 for c in self.C) or list(self.C) != sorted(set(self.C)):
            raise ValueError(f"table C values must be distinct, increasing and in (0, 1]; got {list(self.C)}")

    def at(self, C: float) -> tuple[float, float, float]:
        """(α, r, scale) at C, interpolated linearly; C outside the table is refused."""
        if not self.C[0] <= C <= self.C[-1]:
            raise ValueError(f"C = {C} lies outside the Saguaro table's range {self.C[0]}..{self.C[-1]}: "
                             f"measure that C or sweep inside the range")
        return tuple(float(np.interp(C, self.C, values)) for values in (self.alpha, self.r, self.scale))


@dataclass(frozen=True)
class Scenario:
    timing: TimingModel
    acceptance: AcceptanceModel | Replay = field(default_factory=lambda: IidAcceptance(0.8))
    hits: HitModel = field(default_factory=measured)  # the measured table (spec_bench, T = 0, C = 1)
    saguaro: SaguaroTable | None = None
    fanout_rule: str = "geometric"
    miss_policy: MissPolicy = MissPolicy.PER_ROW  # SSD at batch > 1 when some rows miss
    prompt_len: Lengths = Lengths(128)
    output_len: Lengths | None = Lengths(256)
    rate_per_s: float | None = None  # None: closed loop at the batch size
    link: LinkSpec = field(default_factory=LinkSpec)
    draft_probs_bytes: float = 0.0
    target_devices: int = 1
    draft_devices: int = 1
    rounds: int = 5_000
    requests: int | None = None
    seed: int = 0
    prefill_overlap: bool = True  # SSD's worker prefills joiners while the target does (SimConfig)

    def __post_init__(self) -> None:
        if self.fanout_rule not in FANOUT_RULES:
            raise ValueError(f"fanout_rule must be one of {', '.join(FANOUT_RULES)}; got {self.fanout_rule!r}")
        object.__setattr__(self, "miss_policy", MissPolicy(self.miss_policy))
        if self.rate_per_s is not None and self.output_len is None:
            raise ValueError("an open loop (rate_per_s) needs finite output lengths")

    def models_at(self, C: float) -> tuple[AcceptanceModel | Replay, HitModel]:
        """Acceptance and hit models at Saguaro constant C (C = 1 without a table: the scenario's own)."""
        if self.saguaro is None:
            if C != 1.0:
                raise ValueError("sweeping C needs a Saguaro table (C -> alpha, r, scale); pass --saguaro-table")
            return self.acceptance, self.hits
        alpha, r, scale = self.saguaro.at(C)
        acceptance = self.acceptance
        if isinstance(acceptance, IidAcceptance):
            acceptance = replace(acceptance, alpha=alpha, alpha_cache=None)
        else:
            acceptance = IidAcceptance(alpha)
        return acceptance, PowerLawHit(r=r, scale=scale)

    def fanout(self, K: int, budget: int, C: float = 1.0) -> tuple[int, ...]:
        if budget < 1:
            raise ValueError(f"the fan-out budget B must be >= 1; got {budget}")
        acceptance, hits = self.models_at(C)
        if self.fanout_rule == "uniform" or not isinstance(hits, (PowerLawHit, EmpiricalHit)):
            return tuple(int(f) for f in theory_uniform_fanout(K, budget))
        if isinstance(acceptance, IidAcceptance):
            alpha = acceptance.rate(Source.CACHE)
        elif isinstance(acceptance, PerPositionAcceptance):  # Thm 12 assumes one α: use the mean rate
            alpha = float(np.mean(acceptance.alphas_cache or acceptance.alphas))
        else:
            return tuple(int(f) for f in theory_uniform_fanout(K, budget))
        if isinstance(hits, EmpiricalHit):
            return best_schedule(hits, alpha, K, budget)
        return tuple(int(f) for f in integer_fanout(alpha, hits.r, K, budget, hits.scale))

    def config(self, strategy: Strategy, K: int = 4, budget: int = 12, backup: Backup = Backup.NEURAL,
               batch: int = 1, C: float = 1.0) -> SimConfig:
        strategy = Strategy(strategy)
        acceptance, hits = self.models_at(C)
        fanout = self.fanout(K, budget, C) if strategy is Strategy.SSD else None
        policy = Policy(strategy, K=K if strategy is not Strategy.AR else 0, fanout=fanout,
                        backup=backup if strategy is Strategy.SSD else Backup.NEURAL,
                        miss_policy=self.miss_policy)
        if self.rate_per_s is None:
            workload = ClosedLoop(batch, self.prompt_len, self.output_len)
        else:
            workload = OpenLoop(self.rate_per_s, batch, self.prompt_len, self.output_len)
        return SimConfig(
            policy=policy, timing=self.timing, acceptance=acceptance,
            hits=hits if strategy is Strategy.SSD else None, workload=workload, link=self.link,
            draft_probs_bytes=self.draft_probs_bytes, target_devices=self.target_devices,
            draft_devices=self.draft_devices, rounds=self.rounds, requests=self.requests, seed=self.seed,
            prefill_overlap=self.prefill_overlap,
        )


@dataclass(frozen=True)
class Grid:
    """The values swept; AR ignores K, budget, backup and C, SD ignores budget and backup."""

    strategies: tuple[Strategy, ...] = (Strategy.SSD,)
    K: tuple[int, ...] = (4,)
    budget: tuple[int, ...] = (12,)
    backup: tuple[Backup, ...] = (Backup.NEURAL,)
    batch: tuple[int, ...] = (1,)
    C: tuple[float, ...] = (1.0,)

    def points(self) -> list[dict]:
        seen, out = set(), []
        for s, K, B, bk, b, C in itertools.product(self.strategies, self.K, self.budget, self.backup,
                                                  self.batch, self.C):
            s = Strategy(s)
            point = {"strategy": s, "K": 0 if s is Strategy.AR else K,
                     "budget": B if s is Strategy.SSD else 0,
                     "backup": Backup(bk) if s is Strategy.SSD else Backup.NEURAL,
                     "batch": b, "C": C if s is not Strategy.AR else 1.0}
            key = tuple(point.values())
            if key not in seen:
                seen.add(key)
                out.append(point)
        return out


def sweep(scenario: Scenario, grid: Grid, progress: Callable[[int, int], None] | None = None
          ) -> list[tuple[dict, SimResult]]:
    """Simulate every point of the grid (same seed: common random numbers across points). `progress(done,
    total)` is called after each point."""
    results = []
    points = grid.points()
    for point in points:
        config = scenario.config(**point)
        result = simulate(config)
        settings = {**result.settings, "C": point["C"]}
        results.append((settings, replace(result, settings=settings)))
        if progress is not None:
            progress(len(results), len(points))
    return results
