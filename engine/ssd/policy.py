"""The draft's running statistics and the choices made from them: fan-out schedules F^p / F^b,
the budget B, and the backup on a miss (uses theory/, never re-derives it).

- α is estimated separately for rounds whose speculation came from a hit (α_p) and from a backup (α_b),
  as accepted / (accepted + rejections) (the truncated-geometric MLE, engine.metrics).
- r is fitted (theory.powerlaw.fit_r) from hit/miss counts per fan-out value once two fan-outs have data.
- Geometric schedule: Thm 12 (theory.fanout.optimal_fanout), rounded to integers summing to B, until this
  run's outcome ranks are measured (MIN_RANKS of a kind): then the integer schedule that maximises
  Σ_k P(k)·h(F_k) with h the measured hit curve (theory.fanout.separable_fanout). The rank of each verified
  bonus among the draft's guesses is counted apart for the two kinds of outcome: all K accepted (the bonus is
  the target's next token, the guesses the draft's top choices there) and a rejection (the guesses exclude the
  rejected token). They differ most where Def. 11's power law is worst: with scale 1 it gives one guess no hit
  at all, while after all accepted the draft's first choice is the target's bonus about as often as a draft
  token is accepted (0.95-0.98 on HumanEval), and after a rejection the next choice often is too.
- Budget "auto": B scaled by verify_ms / build_ms so building the cache fits in one verify, each build's time
  set against that build's own branches (`built`). Under adaptive K the branches' length changes from round to
  round and the build time grows with branches × length, so what is fitted is the branch tokens B·K; the
  budget of a build whose branches are K long is that over K (with a fixed K: B scaled by verify_ms /
  build_ms). Before any build is timed it is the spec's guesses per outcome (three by default) at the K built.
  Set against a smoothed build time instead, and started from the 27 guesses of K = 8 under adaptive K, the
  first builds (seconds long) kept the smoothed time above the verify for a dozen rounds, and the budget at
  its floor, one guess (measured on Spec-Bench greedy, 2-core CPU: 125-200 ms builds of one branch against
  250 ms verifies, about two rounds in three missing, where a fixed K = 3 built nine branches).
- Backup AUTO: Cor. 16 (theory.backup.best_backup) between the neural and the lookup backup, with the
  measured p_hit, E_hit, E_miss, T_p and T_b.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from engine.config import FanoutSchedule, SpeculativeConfig
from engine.sparse import RANK_DEPTH
from theory.adaptive import acceptance_estimate
from theory.backup import BackupOption, best_backup
from theory.fanout import (
    optimal_fanout,
    outcome_probabilities,
    round_largest_remainder,
    separable_fanout,
    uniform_fanout,
)
from theory.glossary import Backup
from theory.powerlaw import fit_r, miss_rate
from theory.speedup import expected_tokens

DEFAULT_R = 1.0
MIN_BUDGET_PER_OUTCOME = 1
MIN_RANKS = 20  # outcome ranks of a kind before its measured hit curve replaces the power law
RANK_MEMORY = 0.995  # per observation: older ranks fade (half-weight after ~140), as the text changes
ACCEPTED, REJECTED = "accepted", "rejected"  # the two kinds of outcome whose ranks are counted apart


def least_budget(spec: SpeculativeConfig, K: int) -> float:
    """Budget "auto"'s floor per sequence: one guess per outcome for the uniform schedule (fewer would leave the
    likeliest outcome, all accepted, without any), one guess in all for the geometric one, which puts it where
    it hits most (after all accepted, at a high α)."""
    return 1.0 if spec.schedule is FanoutSchedule.GEOMETRIC else MIN_BUDGET_PER_OUTCOME * (K + 1.0)


@dataclass
class Acceptance:
    accepted: int = 0
    rejections: int = 0
    rounds: int = 0
    tokens: int = 0

    def add(self, k: int, K: int) -> None:
        self.accepted += k
        self.rejections += k < K
        self.rounds += 1
        self.tokens += k + 1

    def alpha(self, prior: float = 0.7) -> float:
        """The posterior mean of α (theory.adaptive.acceptance_estimate, the one estimator SD's adaptive K uses
        too), with a prior worth two observations at `prior`: it keeps α off 0 and 1 early on."""
        return float(acceptance_estimate(self.accepted, self.rejections, 2 * prior, 2 * (1 - prior)))

    def mean_tokens(self, default: float) -> float:
        return self.tokens / self.rounds if self.rounds else default


@dataclass
class DraftPolicy:
    spec: SpeculativeConfig
    acceptance: dict[str, Acceptance] = field(default_factory=lambda: defaultdict(Acceptance))
    trials: dict[int, list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0]))  # F -> [hits, n]
    hits: int = 0
    lookups: int = 0
    budget: float = 0.0
    verify_ms: float = 0.0
    build_ms: float = 0.0
    backup_ms: dict[str, float] = field(default_factory=dict)
    r: float = DEFAULT_R
    built_K: tuple[int, int] | None = None  # (outcomes' K, branch length) of the build last measured
    built_tokens: float | None = None  # branch tokens per sequence of that build (None: not told)
    # kind -> weights of the ranks seen (index: rank; the last slot: beyond the kept ranks), fading
    ranks: dict[str, np.ndarray] = field(default_factory=dict)
    ranks_seen: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    _schedules: dict = field(default_factory=dict)  # (after_hit, K, B) -> schedule, until the next observation

    def __post_init__(self) -> None:
        K = self.spec.K
        given = self.spec.fanouts
        if isinstance(self.spec.budget, int):
            self.budget = float(self.spec.budget)
        else:
            self.budget = float(sum(given))
        self.budget = max(self.budget, 0.0)
        self.K = K
        self.per_outcome = self.budget / (K + 1)  # budget "auto" before any build is timed: these guesses per outcome
        self.branch_tokens: float | None = None  # budget "auto": B·(branch length), fitted to the verify time

    def budget_for(self, K: int, length: int) -> float:
        """B for a cache over a speculation of length K whose branches are `length` long."""
        if self.spec.budget != "auto":
            return self.budget
        if self.branch_tokens is None:
            return float(max(self.per_outcome * (K + 1), self.least_budget(K)))
        return float(np.clip(self.branch_tokens / length, self.least_budget(K), 64 * (K + 1)))

    def built(self, K: int, length: int, branches_per_row: float) -> None:
        """The cache just built: over a speculation K long, its branches `length` long, this many a sequence."""
        self.built_K = (K, length)
        self.built_tokens = branches_per_row * length

    def least_budget(self, K: int) -> float:
        return least_budget(self.spec, K)

    # -- observations -------------------------------------------------------------------------
    def observe_round(
        self, source: str, k: int, fanout_k: int | None, hit: bool | None, K: int | None = None, rank: int | None = None
    ) -> None:
        """One sequence-round: its speculation's source ("hit" or a backup), outcome k of its K (default the
        spec's), whether that outcome was found in the cache built with fanout_k guesses for it, and the
        rank of its bonus among the guesses that cache could make (engine.sparse.TopLogits.ranks; None
        or negative: no cache; ≥ the kept depth: beyond it)."""
        K = self.K if K is None else K
        self._schedules.clear()
        if rank is not None and rank >= 0:
            self._observe_rank(ACCEPTED if k == K else REJECTED, rank)
        self.acceptance["hit" if source == "hit" else "backup"].add(k, K)
        self.acceptance[source].add(k, K)
        if hit is not None:
            self.lookups += 1
            self.hits += hit
            if fanout_k:
                t = self.trials[fanout_k]
                t[0] += hit
                t[1] += 1

    def _observe_rank(self, kind: str, rank: int) -> None:
        counts = self.ranks.get(kind)
        if counts is None:
            counts = self.ranks[kind] = np.zeros(RANK_DEPTH + 1)
        counts *= RANK_MEMORY
        counts[min(rank, RANK_DEPTH)] += 1.0
        self.ranks_seen[kind] += 1

    def hit_curve(self, kind: str, cap: int) -> np.ndarray | None:
        """h(F) for F = 0..cap: the share of this kind's outcomes whose bonus ranked below F (was among the
        first F guesses), from the ranks measured; None until MIN_RANKS of them were seen."""
        if self.ranks_seen[kind] < MIN_RANKS:
            return None
        counts = self.ranks[kind]
        below = np.concatenate([[0.0], np.cumsum(counts[:RANK_DEPTH])]) / counts.sum()  # [RANK_DEPTH + 1]
        return below[np.minimum(np.arange(cap + 1), RANK_DEPTH)]

    def observe_times(self, verify_ms: float, build_ms: float, backup: str | None, backup_ms: float) -> None:
        self._schedules.clear()  # r may be refitted below
        smooth = lambda old, new: new if old == 0 else 0.8 * old + 0.2 * new  # noqa: E731
        self.verify_ms = smooth(self.verify_ms, verify_ms)
        if build_ms > 0:
            self.build_ms = smooth(self.build_ms, build_ms)
        if backup is not None:
            self.backup_ms[backup] = smooth(self.backup_ms.get(backup, 0.0), backup_ms)
        if self.spec.budget == "auto" and build_ms > 0 and self.verify_ms > 0:
            # Build time grows about linearly with the branch tokens; aim for 90% of one verify. The build's own
            # time against its own branches (the time of a build is not that of the ones before it).
            K, length = self.built_K or (self.K, self.K)
            asked = self.budget_for(K, length) * length
            built = asked if self.built_tokens is None else self.built_tokens
            target = built * 0.9 * self.verify_ms / build_ms
            floor = self.least_budget(K) * length
            self.branch_tokens = float(np.clip(0.5 * asked + 0.5 * target, floor, 64 * (K + 1) * length))
            self.budget = self.branch_tokens / length
        self._refit_r()

    def _refit_r(self) -> None:
        points = [(F, 1 - h / n) for F, (h, n) in self.trials.items() if n >= 20 and 0 < h < n]
        if len(points) >= 2 and len({F for F, _ in points}) >= 2:
            try:
                fit = fit_r([F for F, _ in points], [m for _, m in points])
            except ValueError:
                return
            if np.isfinite(fit.r) and fit.r > 0:
                self.r = float(min(fit.r, 10.0))

    # -- choices ------------------------------------------------------------------------------
    @property
    def p_hit(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.5

    def schedule(self, after_hit: bool, K: int | None = None, length: int | None = None) -> tuple[int, ...]:
        """F_0..F_K for a row whose current speculation (K long; default the spec's K) came from a hit (F^p)
        or a backup (F^b), for branches `length` long (default K). A given fan-out F_0..F_{K_max} serves a
        shorter K as F_0..F_{K−1} and F_{K_max} for all accepted."""
        kind = self.spec.schedule
        K = self.K if K is None else K
        if kind is FanoutSchedule.GIVEN or (self.spec.budget is None and kind is FanoutSchedule.UNIFORM):
            given = self.spec.fanouts if after_hit or self.spec.fanout_backup is None else self.spec.fanout_backup
            return tuple(given) if K == len(given) - 1 else tuple(given[:K]) + (given[-1],)
        B = int(round(self.budget_for(K, K if length is None else length)))
        if kind is FanoutSchedule.UNIFORM or B == 0:
            return tuple(int(f) for f in uniform_fanout(K, B))
        key = (after_hit, K, B)
        if key not in self._schedules:
            self._schedules[key] = self._geometric(self.acceptance["hit" if after_hit else "backup"].alpha(), K, B)
        return self._schedules[key]

    def _geometric(self, alpha: float, K: int, B: int) -> tuple[int, ...]:
        """Thm 12's schedule until a kind of outcome has a measured hit curve; then the exact integer optimum of
        Σ_k P(k)·h(F_k) with the measured curves (a kind still unmeasured uses the power law's)."""
        accepted, rejected = self.hit_curve(ACCEPTED, B), self.hit_curve(REJECTED, B)
        if accepted is None and rejected is None:
            real = optimal_fanout(alpha, self.r, K, B)
            return tuple(int(f) for f in round_largest_remainder(real, B))
        law = 1.0 - np.asarray(miss_rate(np.arange(B + 1), self.r))  # Def. 11 with scale 1
        curves = [law if rejected is None else rejected] * K + [law if accepted is None else accepted]
        gain = outcome_probabilities(alpha, K)[:, None] * np.stack(curves)  # [K+1, B+1]
        return tuple(int(f) for f in separable_fanout(gain, B))

    def backup(self, batch_size: int) -> Backup:
        """The backup for this round's misses; AUTO picks by Cor. 16 with the measured quantities."""
        if self.spec.backup is not Backup.AUTO:
            return self.spec.backup
        hit_acc = self.acceptance["hit"]
        if hit_acc.rounds < 4 or self.verify_ms <= 0:
            return Backup.NEURAL  # nothing measured yet: the safe choice (Cor. 8)
        E_hit = hit_acc.mean_tokens(float(expected_tokens(hit_acc.alpha(), self.K)))
        neural_E = self.acceptance[Backup.NEURAL.value].mean_tokens(E_hit)
        lookup_E = self.acceptance[Backup.LOOKUP.value].mean_tokens(1.0)
        T_p = self.build_ms / self.verify_ms
        options = [
            BackupOption(
                Backup.NEURAL,
                max(neural_E, 1.0),
                self.backup_ms.get(Backup.NEURAL.value, self.build_ms) / self.verify_ms,
            ),
            BackupOption(
                Backup.LOOKUP, max(lookup_E, 1.0), self.backup_ms.get(Backup.LOOKUP.value, 0.0) / self.verify_ms
            ),
        ]
        return options[int(best_backup(self.p_hit, max(E_hit, 1.0), T_p, options, batch_size))].kind
