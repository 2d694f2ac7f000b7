"""The empirical hit model: P(hit | k, F) measured from where the verified bonus stood among the draft's guesses.

SD and SSD round records carry `outcome_rank`: for each row, the rank of its bonus t* in the draft's
ranking at the outcome's position (after a rejection at k+1: the draft's logits there, the rejected token
x_{k+1} left out; after all K accepted: the draft's logits after x_K). A fan-out F_k holds the outcome iff
rank < F_k, so one run's ranks answer "what would any schedule have hit", SD runs included.

`RankCounts` is one histogram of ranks; `EmpiricalHit` keeps one per rejection position and one for the
all-accepted outcome, and plugs into the simulator as a `HitModel` and into the closed forms through
`hit_rate`. Ranks beyond `KEPT` are extrapolated with the power law of Def. 11 fitted to the measured
miss curve (`fit_power_law`, with a bootstrap interval for r).

Rounds whose speculation came from a fast backup (random tokens, prompt lookup) are left out: their
tokens were not the draft's, so where the bonus falls in the draft's ranking differs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from simulator.records import RoundRecord
from theory import fit_r
from theory.fanout import outcome_probabilities, separable_fanout
from theory.glossary import Backup

KEPT = 256  # ranks counted one by one; beyond, the fitted power law
MIN_PER_POSITION = 30  # fewer rejections at a position than this: use all positions' rejections


@dataclass(frozen=True)
class RankCounts:
    """counts[i]: outcomes whose bonus had rank i (i < len(counts)); beyond: outcomes ranked further down."""

    counts: tuple[int, ...]
    beyond: int = 0

    def __post_init__(self) -> None:
        if len(self.counts) > KEPT or any(c < 0 for c in self.counts) or self.beyond < 0:
            raise ValueError(f"rank counts must be at most {KEPT} non-negative numbers and a non-negative rest")

    @staticmethod
    def of(ranks: list[int]) -> RankCounts:
        counts = np.bincount([r for r in ranks if r < KEPT], minlength=KEPT).astype(int)
        return RankCounts(tuple(int(c) for c in counts), sum(r >= KEPT for r in ranks))

    def __add__(self, other: RankCounts) -> RankCounts:
        a, b = np.zeros(KEPT, dtype=int), np.zeros(KEPT, dtype=int)
        a[: len(self.counts)] = self.counts
        b[: len(other.counts)] = other.counts
        return RankCounts(tuple(int(c) for c in a + b), self.beyond + other.beyond)

    @property
    def total(self) -> int:
        return sum(self.counts) + self.beyond

    def miss(self, F: np.ndarray) -> np.ndarray:
        """Measured P(rank ≥ F) for F ≤ KEPT (NaN without data)."""
        F = np.asarray(F, dtype=int)
        if self.total == 0:
            return np.full(F.shape, np.nan)
        below = np.concatenate([[0], np.cumsum(np.asarray(self.counts, dtype=float))])  # below[F] = #rank < F
        below = np.pad(below, (0, KEPT + 1 - below.size), mode="edge")
        return 1.0 - below[np.minimum(F, KEPT)] / self.total


@dataclass(frozen=True)
class EmpiricalHit:
    """P(hit | k, F_k) from measured ranks: rejected[j] for a rejection at position j+1, all_accepted for k = K.

    For a simulated K other than the measured one: outcome k < K uses position k+1's rejections if they
    were measured (else all positions' together); outcome K, below the measured K, position K+1's α and
    rejections (`miss`), and above it the measured all-accepted ranks. `tail_r` and
    `tail_scale` extend the miss curve beyond KEPT ranks: miss(F) = miss(KEPT)·(KEPT/F)^tail_r.
    """

    rejected: tuple[RankCounts, ...]
    all_accepted: RankCounts
    tail_r: float = 1.0
    source: str = "records"
    meta: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not self.rejected or self.pooled_rejected.total == 0 or self.all_accepted.total == 0:
            raise ValueError(
                "the empirical hit model needs measured ranks after rejections and after all-accepted "
                "rounds: record an SD or SSD run with the engine (round records carry outcome_rank)"
            )

    @property
    def pooled_rejected(self) -> RankCounts:
        total = RankCounts(())
        for counts in self.rejected:
            total = total + counts
        return total

    def _rejected_at(self, k: int) -> RankCounts:
        """The ranks after a rejection at position k+1 (all positions' together where it has too few)."""
        if k < len(self.rejected) and self.rejected[k].total >= MIN_PER_POSITION:
            return self.rejected[k]
        return self.pooled_rejected

    def _counts(self, k: int, K: int) -> RankCounts:
        return self.all_accepted if k == K else self._rejected_at(k)

    def _agreement(self, i: int) -> float | None:
        """The measured α at position i+1 (the draft's first choice accepted there), where the table has it."""
        alphas = self.meta.get("alpha") or []
        return float(alphas[i]) if i < len(alphas) and np.isfinite(alphas[i]) else None

    def _miss_of(self, counts: RankCounts, F: np.ndarray) -> np.ndarray:
        near = counts.miss(np.minimum(F, KEPT).astype(int))
        far = counts.miss(np.array(KEPT)) * (KEPT / np.maximum(F, KEPT)) ** self.tail_r
        return np.where(F <= KEPT, near, far)

    def miss(self, k: int, K: int, F: np.ndarray) -> np.ndarray:
        """P(miss | outcome k of K, fan-out F) for F ≥ 0 (any size: the tail is the power law).

        All K accepted with K below the measured K: the bonus stands at position K+1, which the measured
        rounds drafted. There the target's token was the draft's first choice with the measured α_{K+1}
        (accepted), and otherwise ranks as after a rejection there, one place further down (the rejected
        first choice left out of the recorded rank): P(miss) = (1 − α_{K+1})·P(rank ≥ F − 1 | rejected at
        K+1). Exact at T = 0, an approximation at T > 0 (as after a fast backup). The measured all-accepted
        ranks stand one position further on; on the default pair at T = 0 they put K 2's all-accepted hit
        at F 1 at 0.964 where its SSD runs hit 0.942 and 0.932 (α_3 0.947)."""
        F = np.asarray(F, dtype=float)
        agree = self._agreement(K) if k == K < len(self.rejected) else None
        if agree is None:
            return self._miss_of(self._counts(k, K), F)
        shifted = (1.0 - agree) * self._miss_of(self._rejected_at(K), np.maximum(F - 1, 0))
        return np.where(F >= 1, shifted, 1.0)

    def hit_prob(self, fanout: tuple[int, ...], from_cache: bool, draft_sourced: bool = True) -> np.ndarray:
        """`HitModel`: P(hit | k) for k = 0..K under the schedule (the same table after a neural backup round).

        After a fast backup's speculation (`draft_sourced` False) the rejected token was not the draft's first
        choice, so a rejection says nothing against it: the bonus is the draft's first choice with the draft's
        agreement α_1 (the rate its first guess is accepted), and otherwise ranks as after a rejection, one
        place further down: P(hit | k < K) = α_1 + (1 − α_1)·P(rank < F_k − 1 | rejected). Exact at T = 0
        (accepted ⇔ the draft's first choice is the target's), an approximation at T > 0. In the default pair's
        runs at T = 0, K 4, F_0 = 1, the next lookup after a random / lookup backup hit 0.862 (188 outcomes) /
        0.845 (97), where the rejection table alone says 0.70 and this 0.885. Without a measured α_1 (a table
        without `alpha`) the rejection table is used as it is."""
        K = len(fanout) - 1
        agree = self._agreement(0)
        out = []
        for k, F in enumerate(fanout):
            if draft_sourced or k == K or agree is None or F == 0:
                out.append(1.0 - float(self.miss(k, K, np.array(F))))
            else:
                out.append(agree + (1.0 - agree) * (1.0 - float(self.miss(k, K, np.array(F - 1)))))
        return np.array(out)

    def hit_rate(self, alpha: float, fanout: tuple[int, ...]) -> float:
        """Σ_k P(k)·P(hit | k, F_k) with i.i.d. acceptance α: the closed forms' p_hit."""
        weights = outcome_probabilities(alpha, len(fanout) - 1)
        return float(np.dot(weights, self.hit_prob(tuple(fanout), True)))

    # -- storage --------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        def pack(c: RankCounts) -> dict:
            counts = list(c.counts)
            while counts and counts[-1] == 0:
                counts.pop()
            return {"counts": counts, "beyond": c.beyond}

        return {
            "rejected": [pack(c) for c in self.rejected],
            "all_accepted": pack(self.all_accepted),
            "tail_r": self.tail_r,
            "source": self.source,
            **self.meta,
        }

    @staticmethod
    def from_dict(obj: dict, source: str | None = None) -> EmpiricalHit:
        try:
            unpack = lambda d: RankCounts(tuple(int(c) for c in d["counts"]), int(d["beyond"]))  # noqa: E731
            rejected = tuple(unpack(d) for d in obj["rejected"])
            meta = {k: v for k, v in obj.items() if k not in ("rejected", "all_accepted", "tail_r", "source")}
            return EmpiricalHit(
                rejected,
                unpack(obj["all_accepted"]),
                float(obj.get("tail_r", 1.0)),
                source or obj.get("source", "table"),
                meta,
            )
        except (KeyError, TypeError) as err:
            raise ValueError(f"not a rank table ({err}): expected rejected, all_accepted, tail_r") from None


def is_draft_sourced(record: RoundRecord, row: int) -> bool:
    """The row's speculation was the draft's own (SD, a cache hit, or the neural backup)."""
    if record.hit is None or record.hit[row]:
        return True
    return Backup.NEURAL in record.backups and len(record.backups) == 1


def outcome_ranks(records: list[RoundRecord]) -> tuple[int, dict[int, list[int]], list[int]]:
    """K, the ranks after a rejection by position (k → ranks) and the all-accepted ranks, from SD/SSD records."""
    Ks = {r.K for r in records if r.is_decode and r.outcome_rank is not None}
    if len(Ks) > 1:
        raise ValueError(f"these records mix K = {sorted(Ks)}: measure one K at a time (split the file by K)")
    if not Ks:
        raise ValueError("no round records with 'outcome_rank': record an SD or SSD run with this engine version")
    K = Ks.pop()
    rejected: dict[int, list[int]] = {k: [] for k in range(K)}
    accepted_all: list[int] = []
    for r in records:
        if not r.is_decode or r.outcome_rank is None:
            continue
        for row, (k, rank) in enumerate(zip(r.accepted, r.outcome_rank, strict=True)):
            if rank is None or not is_draft_sourced(r, row):
                continue
            (accepted_all if k == K else rejected[k]).append(rank)
    return K, rejected, accepted_all


def from_records(records: list[RoundRecord], source: str = "records", seed: int = 0) -> EmpiricalHit:
    """The empirical hit model of these rounds, with the tail fitted as a power law (r with its interval)."""
    K, rejected, accepted_all = outcome_ranks(records)
    counts = tuple(RankCounts.of(rejected[k]) for k in range(K))
    all_accepted = RankCounts.of(accepted_all)
    fit = fit_power_law(rejected, accepted_all, K, seed=seed)
    meta = {
        "K": K,
        "outcomes": sum(len(v) for v in rejected.values()) + len(accepted_all),
        "alpha": [round(a, 4) for a in alpha_per_position(records)],
    }
    if fit:
        meta["power_law"] = fit
    return EmpiricalHit(counts, all_accepted, fit["r"] if fit else 1.0, source, meta)


def fit_power_law(
    rejected: dict[int, list[int]], accepted_all: list[int], K: int, seed: int = 0, resamples: int = 200
) -> dict | None:
    """Def. 11 fitted to the pooled miss curve at F = 1..min(64, where misses run out): r and scale by
    log-log least squares (theory.fit_r), r's 95% interval by resampling outcomes (bootstrap)."""
    ranks = np.array([r for v in rejected.values() for r in v] + list(accepted_all))
    if ranks.size < 20:
        return None
    F = np.arange(1, 65)
    F = F[[(ranks >= f).sum() >= 5 for f in F]]
    if F.size < 3:
        return None
    curve = lambda rs: np.array([(rs >= f).mean() for f in F])  # noqa: E731
    fit = fit_r(F, curve(ranks))
    rng = np.random.default_rng(seed)
    rs = []
    for _ in range(resamples):
        sample = curve(rng.choice(ranks, ranks.size))
        if np.all(sample > 0):
            rs.append(fit_r(F, sample).r)
    low, high = np.percentile(rs, [2.5, 97.5]) if rs else (fit.r_ci[0], fit.r_ci[1])
    return {
        "r": round(fit.r, 4),
        "scale": round(fit.scale, 4),
        "r_ci95": [round(float(low), 4), round(float(high), 4)],
        "fanouts": [int(F[0]), int(F[-1])],
        "outcomes": int(ranks.size),
    }


def alpha_per_position(records: list[RoundRecord], draft_sourced: bool = True) -> list[float]:
    """Measured α_i = P(x_i accepted | x_1..x_{i−1} accepted), i = 1..K, over draft-sourced rows (with
    `draft_sourced` False: over the rows a fast backup proposed, e.g. the lookup's own rates); NaN where a
    position was never reached."""
    reached: dict[int, int] = {}
    passed: dict[int, int] = {}
    K = 0
    for r in records:
        if not r.is_decode or r.K == 0:
            continue
        K = max(K, r.K)
        for row, k in enumerate(r.accepted):
            if is_draft_sourced(r, row) != draft_sourced:
                continue
            for i in range(min(k + 1, r.K)):
                reached[i] = reached.get(i, 0) + 1
                passed[i] = passed.get(i, 0) + (i < k)
    return [passed.get(i, 0) / reached[i] if reached.get(i) else float("nan") for i in range(K)]


# -- the shipped tables ---------------------------------------------------------------------------
TABLES = Path(__file__).with_name("data") / "hit_tables.json"


def load_tables(path: str | Path = TABLES) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no hit table at {path}")
    return json.loads(path.read_text())


def measured(
    workload: str = "spec_bench", temperature: float = 0.0, C: float = 1.0, path: str | Path = TABLES
) -> EmpiricalHit:
    """The shipped table for the default pair: the entry of `workload` nearest in temperature, then C."""
    tables = load_tables(path)
    entries = [e for e in tables["entries"] if e["workload"] == workload]
    if not entries:
        names = sorted({e["workload"] for e in tables["entries"]})
        raise ValueError(f"no measured hit table for workload {workload!r}; measured: {', '.join(names)}")
    best = min(entries, key=lambda e: (abs(e["temperature"] - temperature), abs(e["C"] - C)))
    where = f"measured: {tables.get('pair', 'default pair')}, {workload}, T={best['temperature']:g}, C={best['C']:g}"
    return EmpiricalHit.from_dict(best["model"], source=where)


class RankedMisses(Protocol):
    """What `best_schedule` reads of a hit model: the miss curve of outcome k's F guesses and the power-law tail
    beyond the measured ranks (EmpiricalHit here, and simulator.alpha_hits.AlphaHit)."""

    @property
    def tail_r(self) -> float: ...

    def miss(self, k: int, K: int, F: np.ndarray) -> np.ndarray: ...


def _tail_split(model: RankedMisses, weights: np.ndarray, B: int) -> tuple[int, ...]:
    """More budget than KEPT guesses per outcome: every outcome is in its concave tail; split ∝ P(k)^(1/(1+r))."""
    share = weights ** (1.0 / (1.0 + model.tail_r))
    real = B * share / share.sum()
    out = np.floor(real).astype(int)
    out[np.argsort(-(real - out))[: B - int(out.sum())]] += 1
    return tuple(int(x) for x in out)


def best_schedule(model: RankedMisses, alpha: float, K: int, B: int) -> tuple[int, ...]:
    """The integer schedule F_0..F_K (Σ = B) with the highest `model.hit_rate(alpha, F)`: an exact dynamic
    programme over outcomes and budget (the measured gains need not be concave, so no greedy).

    O(K·B·min(B, KEPT)): beyond KEPT guesses an outcome's gain follows the fitted power law, which is
    concave, so larger shares are settled by splitting what is left in proportion to Thm 12's real optimum.
    """
    if K < 0 or B < 0:
        raise ValueError(f"K and B must be >= 0; got K={K}, B={B}")
    weights = outcome_probabilities(alpha, K)  # [K+1]
    cap = min(B, KEPT)
    if B > cap * (K + 1):
        return _tail_split(model, weights, B)  # no schedule within KEPT per outcome spends B: skip the programme
    F = np.arange(cap + 1)
    gain = np.stack([weights[k] * (1.0 - model.miss(k, K, F)) for k in range(K + 1)])  # [K+1, cap+1]
    return tuple(int(f) for f in separable_fanout(gain, B))
