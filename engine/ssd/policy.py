"""The draft's running statistics and the choices made from them: fan-out schedules F^p / F^b,
the budget B, and the backup on a miss (uses theory/, never re-derives it).

- α is estimated separately for rounds whose speculation came from a hit (α_p) and from a backup (α_b),
  as accepted / (accepted + rejections) (the truncated-geometric MLE, engine.metrics).
- r is fitted (theory.powerlaw.fit_r) from hit/miss counts per fan-out value once two fan-outs have data.
- Geometric schedule: Thm 12 (theory.fanout.optimal_fanout), rounded to integers summing to B.
- Budget "auto": B scaled by verify_ms / build_ms (smoothed) so building the cache fits in one verify.
  Under adaptive K the branches' length changes from round to round and the build time grows with
  branches × length, so what is fitted is the branch tokens B·K; the budget of a build whose branches are
  K long is that over K (with a fixed K the same rule as before).
- Backup AUTO: Cor. 16 (theory.backup.best_backup) between the neural and the lookup backup, with the
  measured p_hit, E_hit, E_miss, T_p and T_b.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from engine.config import FanoutSchedule, SpeculativeConfig
from theory.backup import BackupOption, best_backup
from theory.fanout import optimal_fanout, round_largest_remainder, uniform_fanout
from theory.glossary import Backup
from theory.powerlaw import fit_r
from theory.speedup import expected_tokens

DEFAULT_R = 1.0
MIN_BUDGET_PER_OUTCOME = 1


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
        n = self.accepted + self.rejections
        return (self.accepted + 2 * prior) / (n + 2)  # a little prior keeps α off 0 and 1 early on

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

    def __post_init__(self) -> None:
        K = self.spec.K
        given = self.spec.fanouts
        if isinstance(self.spec.budget, int):
            self.budget = float(self.spec.budget)
        else:
            self.budget = float(sum(given))
        self.budget = max(self.budget, 0.0)
        self.K = K
        self.branch_tokens = self.budget * K  # budget "auto": B·(branch length), fitted to the verify time

    def budget_for(self, K: int, length: int) -> float:
        """B for a cache over a speculation of length K whose branches are `length` long."""
        if self.spec.budget != "auto":
            return self.budget
        return float(np.clip(self.branch_tokens / length, MIN_BUDGET_PER_OUTCOME * (K + 1), 64 * (K + 1)))

    # -- observations -------------------------------------------------------------------------
    def observe_round(self, source: str, k: int, fanout_k: int | None, hit: bool | None, K: int | None = None
                      ) -> None:
        """One sequence-round: its speculation's source ("hit" or a backup), outcome k of its K (default the
        spec's), and whether that outcome was found in the cache built with fanout_k guesses for it."""
        K = self.K if K is None else K
        self.acceptance["hit" if source == "hit" else "backup"].add(k, K)
        self.acceptance[source].add(k, K)
        if hit is not None:
            self.lookups += 1
            self.hits += hit
            if fanout_k:
                t = self.trials[fanout_k]
                t[0] += hit
                t[1] += 1

    def observe_times(self, verify_ms: float, build_ms: float, backup: str | None, backup_ms: float) -> None:
        smooth = lambda old, new: new if old == 0 else 0.8 * old + 0.2 * new  # noqa: E731
        self.verify_ms = smooth(self.verify_ms, verify_ms)
        if build_ms > 0:
            self.build_ms = smooth(self.build_ms, build_ms)
        if backup is not None:
            self.backup_ms[backup] = smooth(self.backup_ms.get(backup, 0.0), backup_ms)
        if self.spec.budget == "auto" and self.build_ms > 0 and self.verify_ms > 0:
            # Build time grows about linearly with the branch tokens; aim for 90% of one verify.
            K, length = self.built_K or (self.K, self.K)
            tokens = self.budget_for(K, length) * length
            target = tokens * 0.9 * self.verify_ms / self.build_ms
            floor = MIN_BUDGET_PER_OUTCOME * (K + 1) * length
            self.branch_tokens = float(np.clip(0.5 * tokens + 0.5 * target, floor, 64 * (K + 1) * length))
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
        alpha = self.acceptance["hit" if after_hit else "backup"].alpha()
        real = optimal_fanout(alpha, self.r, K, B)
        return tuple(int(f) for f in round_largest_remainder(real, B))

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
            BackupOption(Backup.NEURAL, max(neural_E, 1.0), self.backup_ms.get(Backup.NEURAL.value, self.build_ms) / self.verify_ms),
            BackupOption(Backup.LOOKUP, max(lookup_E, 1.0), self.backup_ms.get(Backup.LOOKUP.value, 0.0) / self.verify_ms),
        ]
        return options[int(best_backup(self.p_hit, max(E_hit, 1.0), T_p, options, batch_size))].kind
