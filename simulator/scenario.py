"""A study's fixed part (timing, acceptance, workload shape, devices) and the knobs swept over it.

`Scenario.config(strategy, K, budget, backup, batch, C)` builds one `SimConfig`; `sweep` runs a grid.
The fan-out schedule for a budget B comes from theory: Thm 12's exact integer optimum for the power-law
miss model ("geometric", the default) or the reference engine's even spread ("uniform").

K and the budget may be "auto", as the engine's are (`Scenario.resolve` settles them before a point is built):
- budget "auto": the engine sizes SSD's cache so that its build takes about `BUILD_SHARE` of one verify, at
  least its floor (`engine.ssd.policy.least_budget`): one guess per outcome (K + 1) for the uniform
  schedule, one guess in all for the geometric one. Here: the largest B from that floor up whose build
  (batch·B branches, at the workload's mean context) the timing model puts within that share of SSD's
  verify, else the floor. With the floor at K + 1 for both, the int4 target's HumanEval run at K 3 of
  2026-12-02 00:49 (reports/2026-12-cpu-lowbit-vs-llamacpp) was predicted at budget 4 where the engine ran
  one guess (0-0-0-1): −33% on its tokens/s;
- K "auto": the engine picks, round by round, the K with the most tokens per unit time from the running α
  and the timings it measured. With α and the timings holding still that settles on one K, so here each K in
  1..`AUTO_K_MAX` (with its own auto budget) is simulated and the fastest in decode tokens/s is kept. The
  engine's transients (its first rounds, the probes of a neighbouring K) are not modelled.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from simulator.acceptance import (
    AcceptanceModel,
    HitModel,
    IidAcceptance,
    PerPositionAcceptance,
    PowerLawHit,
    Replay,
    Source,
)
from simulator.alpha_hits import AlphaHit
from simulator.hits import EmpiricalHit, best_schedule
from simulator.link import LinkSpec
from simulator.metrics import SimResult
from simulator.run import Policy, SimConfig, simulate
from simulator.timing import TimingModel
from simulator.workload import ClosedLoop, Lengths, OpenLoop, check_shared_prefix
from theory import Backup, MissPolicy, Strategy, integer_fanout
from theory import uniform_fanout as theory_uniform_fanout

FANOUT_RULES = ("geometric", "uniform")
AUTO = "auto"  # K or budget chosen as the engine's K="auto" / budget="auto" would (module docstring)
AUTO_K_MAX = 8  # engine.config.AUTO_K_MAX: the largest K the engine's K="auto" may choose
BUILD_SHARE = 0.9  # engine.ssd.policy: budget "auto" aims the cache build at this share of one verify


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
            raise ValueError(
                f"C = {C} lies outside the Saguaro table's range {self.C[0]}..{self.C[-1]}: "
                f"measure that C or sweep inside the range"
            )
        alpha, r, scale = (float(np.interp(C, self.C, values)) for values in (self.alpha, self.r, self.scale))
        return alpha, r, scale


def default_hits(acceptance: AcceptanceModel | Replay) -> HitModel | None:
    """The α-model at the acceptance's α (its mean over positions for per-position rates); None for replayed
    records, which carry their own hits."""
    if isinstance(acceptance, IidAcceptance):
        return AlphaHit(min(acceptance.rate(Source.CACHE), 0.999))
    if isinstance(acceptance, PerPositionAcceptance):
        return AlphaHit(min(float(np.mean(acceptance.alphas_cache or acceptance.alphas)), 0.999))
    return None


@dataclass(frozen=True)
class Scenario:
    timing: TimingModel
    acceptance: AcceptanceModel | Replay = field(default_factory=lambda: IidAcceptance(0.8))
    # None: the α-model at the acceptance's α (simulator.alpha_hits; T = 0). A measured rank table
    # (simulator.hits.measured, from_records) belongs to the pair it was measured on: pass it for that pair.
    hits: HitModel | None = None
    saguaro: SaguaroTable | None = None
    fanout_rule: str = "geometric"
    miss_policy: MissPolicy = MissPolicy.PER_ROW  # SSD at batch > 1 when some rows miss
    prompt_len: Lengths = Lengths(128)
    output_len: Lengths | None = Lengths(256)
    rate_per_s: float | None = None  # None: closed loop at the batch size
    shared_prefix: float = 0.0  # the fraction of each prompt its requests share (simulator.workload)
    link: LinkSpec = field(default_factory=LinkSpec)
    draft_probs_bytes: float = 0.0
    target_devices: int = 1
    draft_devices: int = 1
    rounds: int = 5_000
    requests: int | None = None
    seed: int = 0
    prefill_overlap: bool = True  # SSD's worker prefills joiners while the target does (SimConfig)

    def __post_init__(self) -> None:
        check_shared_prefix(self.shared_prefix)
        if self.fanout_rule not in FANOUT_RULES:
            raise ValueError(f"fanout_rule must be one of {', '.join(FANOUT_RULES)}; got {self.fanout_rule!r}")
        object.__setattr__(self, "miss_policy", MissPolicy(self.miss_policy))
        if self.hits is None:
            object.__setattr__(self, "hits", default_hits(self.acceptance))
        if self.rate_per_s is not None and self.output_len is None:
            raise ValueError("an open loop (rate_per_s) needs finite output lengths")

    def models_at(self, C: float) -> tuple[AcceptanceModel | Replay, HitModel | None]:
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
        if self.fanout_rule == "uniform" or not isinstance(hits, (PowerLawHit, EmpiricalHit, AlphaHit)):
            return tuple(int(f) for f in theory_uniform_fanout(K, budget))
        if isinstance(acceptance, IidAcceptance):
            alpha = acceptance.rate(Source.CACHE)
        elif isinstance(acceptance, PerPositionAcceptance):  # Thm 12 assumes one α: use the mean rate
            alpha = float(np.mean(acceptance.alphas_cache or acceptance.alphas))
        else:
            return tuple(int(f) for f in theory_uniform_fanout(K, budget))
        if isinstance(hits, (EmpiricalHit, AlphaHit)):
            return best_schedule(hits, alpha, K, budget)
        return tuple(int(f) for f in integer_fanout(alpha, hits.r, K, budget, hits.scale))

    def mean_context(self) -> int:
        """The context a decode round sees on average: the prompt and half the output (of 256 when endless)."""
        output = self.output_len.mean if self.output_len is not None else 256.0
        return max(1, round(self.prompt_len.mean + output / 2))

    def least_budget(self, K: int) -> int:
        """Budget "auto"'s floor, as the engine's (`engine.ssd.policy.least_budget`): one guess per outcome
        for the uniform schedule, one in all for the geometric one."""
        return 1 if self.fanout_rule == "geometric" else K + 1

    def auto_budget(self, K: int, batch: int = 1) -> int:
        """Budget "auto" at this K and batch (module docstring): at least the floor (K + 1 for the uniform
        schedule, 1 for the geometric one), at most 64·(K + 1)."""
        context = self.mean_context()
        timing = self.timing.for_strategy(Strategy.SSD) if hasattr(self.timing, "for_strategy") else self.timing
        share = BUILD_SHARE * timing.verify_ms(batch, K + 1, context)
        floor, cap = self.least_budget(K), 64 * (K + 1)
        fits = lambda B: self.timing.cache_build_ms(batch, K, batch * B, context) <= share  # noqa: E731
        if not fits(floor + 1):
            return floor
        low, high = floor + 1, cap  # fits(low); the build grows with B, so bisect for the last B that fits
        if fits(high):
            return high
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if fits(mid) else (low, mid)
        return low

    def resolve(self, point: dict) -> tuple[dict, str | None]:
        """The point with K and budget "auto" settled (module docstring), and a line saying what was chosen
        (None when nothing was "auto")."""
        strategy = Strategy(point["strategy"])
        K, budget = point["K"], point.get("budget", 0)
        if strategy is Strategy.AR or (K != AUTO and budget != AUTO):
            return point, None

        def at(k: int) -> dict:
            chosen = {**point, "K": k}
            if strategy is Strategy.SSD and budget == AUTO:
                chosen["budget"] = self.auto_budget(k, point["batch"])
            return chosen

        if K != AUTO:
            chosen = at(K)
            return chosen, f"{strategy.value} K {K} batch {point['batch']}: budget auto -> {chosen['budget']}"
        if isinstance(self.acceptance, Replay):
            raise ValueError(
                "K auto simulates every K, and replayed records hold one: give an acceptance model "
                "(--alpha, --alpha-per-position or --calibrate) instead of --replay"
            )
        closed = replace(self, rate_per_s=None)  # the engine chooses K from its rounds, not from the arrivals
        candidates = [at(k) for k in range(1, AUTO_K_MAX + 1)]
        speeds = [simulate(closed.config(**c)).decode_tokens_per_s for c in candidates]
        best = int(np.argmax(speeds))
        chosen = candidates[best]
        tried = ", ".join(f"{c['K']}: {v:.3g}" for c, v in zip(candidates, speeds, strict=True))
        budget_note = f", budget auto -> {chosen['budget']}" if budget == AUTO and strategy is Strategy.SSD else ""
        return chosen, (
            f"{strategy.value} batch {point['batch']}: K auto -> {chosen['K']}{budget_note} "
            f"(decode tokens/s by K: {tried})"
        )

    def config(
        self,
        strategy: Strategy,
        K: int = 4,
        budget: int = 12,
        backup: Backup = Backup.NEURAL,
        batch: int = 1,
        C: float = 1.0,
    ) -> SimConfig:
        strategy = Strategy(strategy)
        acceptance, hits = self.models_at(C)
        fanout = self.fanout(K, budget, C) if strategy is Strategy.SSD else None
        policy = Policy(
            strategy,
            K=K if strategy is not Strategy.AR else 0,
            fanout=fanout,
            backup=backup if strategy is Strategy.SSD else Backup.NEURAL,
            miss_policy=self.miss_policy,
        )
        workload: ClosedLoop | OpenLoop
        if self.rate_per_s is None:
            workload = ClosedLoop(batch, self.prompt_len, self.output_len, self.shared_prefix)
        elif self.output_len is not None:
            workload = OpenLoop(self.rate_per_s, batch, self.prompt_len, self.output_len, self.shared_prefix)
        else:
            raise ValueError("an open loop (rate_per_s) needs finite output lengths")
        return SimConfig(
            policy=policy,
            timing=self.timing,
            acceptance=acceptance,
            hits=hits if strategy is Strategy.SSD else None,
            workload=workload,
            link=self.link,
            draft_probs_bytes=self.draft_probs_bytes,
            target_devices=self.target_devices,
            draft_devices=self.draft_devices,
            rounds=self.rounds,
            requests=self.requests,
            seed=self.seed,
            prefill_overlap=self.prefill_overlap,
        )


@dataclass(frozen=True)
class Grid:
    """The values swept; AR ignores K, budget, backup and C, SD ignores budget and backup. K and budget may
    hold "auto" (`Scenario.resolve`)."""

    strategies: tuple[Strategy, ...] = (Strategy.SSD,)
    K: tuple[int | str, ...] = (4,)
    budget: tuple[int | str, ...] = (12,)
    backup: tuple[Backup, ...] = (Backup.NEURAL,)
    batch: tuple[int, ...] = (1,)
    C: tuple[float, ...] = (1.0,)

    def points(self) -> list[dict]:
        seen, out = set(), []
        for s, K, B, bk, b, C in itertools.product(
            self.strategies, self.K, self.budget, self.backup, self.batch, self.C
        ):
            s = Strategy(s)
            point = {
                "strategy": s,
                "K": 0 if s is Strategy.AR else K,
                "budget": B if s is Strategy.SSD else 0,
                "backup": Backup(bk) if s is Strategy.SSD else Backup.NEURAL,
                "batch": b,
                "C": C if s is not Strategy.AR else 1.0,
            }
            key = tuple(point.values())
            if key not in seen:
                seen.add(key)
                out.append(point)
        return out


def sweep(
    scenario: Scenario, grid: Grid, progress: Callable[[int, int], None] | None = None, points: list[dict] | None = None
) -> list[tuple[dict, SimResult]]:
    """Simulate every point of the grid, or the `points` given (already resolved), with the same seed: common
    random numbers across points. `progress(done, total)` is called after each point."""
    results = []
    if points is None:
        points = [scenario.resolve(point)[0] for point in grid.points()]
    for point in points:
        config = scenario.config(**point)
        result = simulate(config)
        settings = {**result.settings, "C": point["C"]}
        results.append((settings, replace(result, settings=settings)))
        if progress is not None:
            progress(len(results), len(points))
    return results
