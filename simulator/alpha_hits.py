"""The hit model in α: where the bonus stands among the draft's guesses, for a pair without measured ranks.

A rank table (simulator.hits) is measured on one pair and stays with it. What the tables of the pairs we can
measure share is carried to any other pair through its acceptance rate α and the temperature T: after a
rejection, F guesses miss the bonus with probability (Def. 11's power law, its scale moving with α and T)

    P(rank ≥ F | rejected) = min(1, exp(a + b·ln(1 − α) + c·T) · F^(−r)),   F ≥ 1,

a draft that agrees with the target more often also ranks the target's token higher when it is wrong. After
all K accepted, the bonus is the draft's first choice with probability α and otherwise ranks as after a
rejection, one place further down (the rule `EmpiricalHit` applies with a measured α; exact at T = 0).

`fit_tables` estimates (a, b, c, r) by maximum likelihood from rank tables (the multinomial of ranks 0..15 and
beyond) and resamples each table's outcomes (bootstrap) for the uncertainty. The shipped fit,
data/alpha_hits.json, comes from the default pair's tables (data/hit_tables.json): `saguaro models hit-tables`
writes both.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from scipy.optimize import minimize

from simulator.hits import EmpiricalHit
from theory.fanout import outcome_probabilities

FIT_FILE = Path(__file__).with_name("data") / "alpha_hits.json"
RANK_BINS = 16  # ranks 0..15 one by one, then "16 or further"
MIN_REJECTIONS = 10  # a table with fewer rejections than this tells too little to weigh
RESAMPLES = 200
LEVEL = 0.9  # the interval stated with every prediction


@dataclass(frozen=True)
class HitParams:
    """ln scale = a + b·ln(1 − α) + c·T; r: the power law's exponent in F."""

    a: float
    b: float
    c: float
    r: float

    def miss_rejected(self, alpha: float, temperature: float, F) -> np.ndarray:
        """P(rank ≥ F | rejected) for F ≥ 0 (F = 0 guesses miss always)."""
        F = np.asarray(F, dtype=float)
        scale = np.exp(self.a + self.b * np.log(max(1.0 - alpha, 1e-6)) + self.c * temperature)
        power = scale * np.power(np.maximum(F, 1.0), -self.r)
        return np.where(F >= 1, np.minimum(1.0, power), 1.0)

    def as_tuple(self) -> tuple[float, float, float, float]:
        return self.a, self.b, self.c, self.r


@dataclass(frozen=True)
class TablePoint:
    """One measured table as the fit sees it: its α, T and the counts of ranks after a rejection."""

    workload: str
    temperature: float
    alpha: float
    counts: tuple[int, ...]  # ranks 0..RANK_BINS-1, then the rest

    @property
    def rejections(self) -> int:
        return int(sum(self.counts))


@dataclass(frozen=True)
class AlphaHitFit:
    """The fitted parameters, the bootstrap's, and what they were fitted to."""

    params: HitParams
    resampled: tuple[HitParams, ...]
    points: tuple[TablePoint, ...]
    source: str
    scatter: float = 0.0  # RMS over the tables of (the model's hit rate − the table's own), K 4, F 3 each

    def to_dict(self) -> dict:
        return {
            "params": self.params.as_tuple(),
            "scatter": self.scatter,
            "resampled": [p.as_tuple() for p in self.resampled],
            "points": [
                {"workload": p.workload, "temperature": p.temperature, "alpha": p.alpha, "counts": list(p.counts)}
                for p in self.points
            ],
            "source": self.source,
            "model": "ln scale = a + b ln(1 - alpha) + c T; miss = scale F^-r",
        }

    @staticmethod
    def from_dict(obj: dict) -> AlphaHitFit:
        try:
            points = tuple(
                TablePoint(
                    p["workload"], float(p["temperature"]), float(p["alpha"]), tuple(int(c) for c in p["counts"])
                )
                for p in obj["points"]
            )
            return AlphaHitFit(
                HitParams(*obj["params"]),
                tuple(HitParams(*p) for p in obj["resampled"]),
                points,
                str(obj["source"]),
                float(obj.get("scatter", 0.0)),
            )
        except (KeyError, TypeError) as err:
            raise ValueError(f"not an α hit-model fit ({err}): expected params, resampled, points, source") from None

    @property
    def alpha_range(self) -> tuple[float, float]:
        alphas = [p.alpha for p in self.points]
        return min(alphas), max(alphas)

    def describe(self) -> str:
        low, high = self.alpha_range
        return (
            f"α-model fitted to {len(self.points)} rank tables of {self.source} "
            f"({sum(p.rejections for p in self.points)} rejections, α {low:.2f}-{high:.2f}, "
            f"T {min(p.temperature for p in self.points):g}-{max(p.temperature for p in self.points):g})"
        )


@functools.cache
def shipped_fit(path: str = str(FIT_FILE)) -> AlphaHitFit:
    """The fit shipped with the simulator (read once, on first use)."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"no α hit-model fit at {file}: run `saguaro models hit-tables` to write it")
    return AlphaHitFit.from_dict(json.loads(file.read_text()))


@dataclass(frozen=True)
class AlphaHit:
    """`HitModel` for a pair at acceptance rate `alpha` and temperature `temperature` (module docstring)."""

    alpha: float
    temperature: float = 0.0
    fit: AlphaHitFit = field(default_factory=shipped_fit, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 0 <= self.alpha < 1:
            raise ValueError(f"the α hit model needs an acceptance rate in [0, 1); got {self.alpha!r}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0; got {self.temperature!r}")

    @property
    def tail_r(self) -> float:
        return self.fit.params.r

    @property
    def source(self) -> str:
        return f"{self.fit.describe()}, at α {self.alpha:.3f}, T {self.temperature:g}"

    def _miss_rejected(self, F, params: HitParams | None = None) -> np.ndarray:
        return (params or self.fit.params).miss_rejected(self.alpha, self.temperature, F)

    def miss(self, k: int, K: int, F, params: HitParams | None = None) -> np.ndarray:
        """P(miss | outcome k of K, F guesses): a rejection's curve for k < K; for k = K the draft's first
        choice with probability α, else the rejection's curve one place down."""
        F = np.asarray(F, dtype=float)
        if k < K:
            return self._miss_rejected(F, params)
        shifted = (1.0 - self.alpha) * self._miss_rejected(np.maximum(F - 1, 0), params)
        return np.where(F >= 1, shifted, 1.0)

    def hit_prob(
        self, fanout: tuple[int, ...], from_cache: bool, draft_sourced: bool = True, params: HitParams | None = None
    ) -> np.ndarray:
        """`HitModel`: P(hit | k), k = 0..K. After a fast backup's speculation (`draft_sourced` False) the
        rejected token was not the draft's first choice: the bonus is that choice with probability α."""
        K = len(fanout) - 1
        out = []
        for k, F in enumerate(fanout):
            if draft_sourced or k == K or F == 0:
                out.append(1.0 - float(self.miss(k, K, F, params)))
            else:
                out.append(self.alpha + (1.0 - self.alpha) * (1.0 - float(self.miss(k, K, F - 1, params))))
        return np.array(out)

    def hit_rate(self, alpha: float, fanout: tuple[int, ...], params: HitParams | None = None) -> float:
        """Σ_k P(k)·P(hit | k, F_k) with i.i.d. acceptance α: the closed forms' p_hit."""
        weights = outcome_probabilities(alpha, len(fanout) - 1)
        return float(np.dot(weights, self.hit_prob(tuple(fanout), True, params=params)))

    def interval(self, fanout: tuple[int, ...], level: float = LEVEL) -> tuple[float, float, float]:
        """(hit rate, low, high): the schedule's hit rate at this α and its bootstrap interval (where the fit
        itself could lie)."""
        rates = [self.hit_rate(self.alpha, fanout, p) for p in self.fit.resampled]
        tail = 100 * (1 - level) / 2
        low, high = np.percentile(rates, [tail, 100 - tail]) if rates else (np.nan, np.nan)
        return self.hit_rate(self.alpha, fanout), float(low), float(high)

    def describe(self, fanout: tuple[int, ...]) -> str:
        """One line for a prediction's inputs: the model, its α and T, this schedule's hit rate, the fit's
        interval and how far single tables stray from the fit."""
        rate, low, high = self.interval(fanout)
        return (
            f"{self.source}: hits {rate:.3f} ({low:.3f}-{high:.3f}, the fit's {LEVEL:.0%} interval; single "
            f"tables stray ±{self.fit.scatter:.3f} RMS from it) at fan-out {'-'.join(map(str, fanout))}"
        )


# -- fitting ----------------------------------------------------------------------------------------------
def table_points(tables: dict, min_rejections: int = MIN_REJECTIONS) -> list[TablePoint]:
    """The entries of a hit-table file the fit uses: Saguaro off (C = 1), each prompt set's tasks where the
    table has them (disjoint, and spread in α) else the whole set, with at least `min_rejections` rejections."""
    entries = [e for e in tables["entries"] if float(e["C"]) == 1.0]
    with_tasks = {(e["workload"].split("/")[0], e["temperature"]) for e in entries if "/" in e["workload"]}
    points = []
    for e in entries:
        if "/" not in e["workload"] and (e["workload"], e["temperature"]) in with_tasks:
            continue
        model = EmpiricalHit.from_dict(e["model"])
        rejected = model.pooled_rejected
        if rejected.total < min_rejections:
            continue
        alphas = [a for a in e["model"].get("alpha", []) if a == a]
        if not alphas:
            continue
        counts = np.zeros(RANK_BINS + 1, dtype=int)
        kept = np.asarray(rejected.counts[:RANK_BINS], dtype=int)
        counts[: kept.size] = kept
        counts[RANK_BINS] = rejected.total - int(kept.sum())
        points.append(
            TablePoint(e["workload"], float(e["temperature"]), float(np.mean(alphas)), tuple(int(c) for c in counts))
        )
    return points


def _negative_log_likelihood(theta: np.ndarray, points: list[TablePoint], counts: np.ndarray) -> float:
    params = HitParams(*theta)
    if not params.r > 0:
        return np.inf
    F = np.arange(1, RANK_BINS + 1)
    total = 0.0
    for point, n in zip(points, counts, strict=True):
        at_least = np.concatenate([[1.0], params.miss_rejected(point.alpha, point.temperature, F)])  # P(rank ≥ i)
        probs = np.append(at_least[:-1] - at_least[1:], at_least[-1])  # rank i < RANK_BINS, then the rest
        total -= float(np.dot(n, np.log(np.clip(probs, 1e-12, 1.0))))
    return total


def _maximize(points: list[TablePoint], counts: np.ndarray, start: np.ndarray) -> HitParams:
    result = minimize(
        _negative_log_likelihood,
        start,
        args=(points, counts),
        method="Nelder-Mead",
        options={"maxiter": 4000, "xatol": 1e-5, "fatol": 1e-7},
    )
    return HitParams(*(float(v) for v in result.x))


def fit_tables(tables: dict, source: str, resamples: int = RESAMPLES, seed: int = 0) -> AlphaHitFit:
    """Maximum-likelihood (a, b, c, r) over the tables' points, and `resamples` refits on the tables drawn
    again with replacement, each table's outcomes too (the interval: how far another pair's tables, measured as
    ours were, could put the fit)."""
    points = table_points(tables)
    if len(points) < 3 or len({round(p.alpha, 2) for p in points}) < 2:
        raise ValueError(
            "the α hit model needs rank tables at three or more settings, at two α or more: "
            "measure SD runs on more prompt sets (saguaro models hit-tables)"
        )
    counts = np.array([p.counts for p in points], dtype=float)
    best = _maximize(points, counts, np.array([0.0, 0.3, 0.0, 0.5]))
    rng = np.random.default_rng(seed)
    resampled: list[HitParams] = []
    while len(resampled) < resamples:
        chosen = rng.integers(0, len(points), len(points))
        if len({round(points[i].alpha, 2) for i in chosen}) < 2:
            continue  # one α alone cannot place the slope in α
        drawn = np.array(
            [rng.multinomial(int(counts[i].sum()), counts[i] / counts[i].sum()) for i in chosen], dtype=float
        )
        resampled.append(_maximize([points[i] for i in chosen], drawn, np.array(best.as_tuple())))
    return AlphaHitFit(best, tuple(resampled), tuple(points), source, _scatter(tables, points, best))


def _scatter(tables: dict, points: list[TablePoint], params: HitParams, fanout: tuple[int, ...] = (3,) * 5) -> float:
    """RMS over the fitted tables of the model's hit rate minus the table's own, for one schedule."""
    models = {
        (e["workload"], float(e["temperature"])): EmpiricalHit.from_dict(e["model"])
        for e in tables["entries"]
        if float(e["C"]) == 1.0
    }
    gaps = []
    for point in points:
        table = models[(point.workload, point.temperature)]
        schedule = fanout[: len(table.rejected)] + (fanout[-1],)
        model = AlphaHit(point.alpha, point.temperature, AlphaHitFit(params, (), (), ""))
        gaps.append(model.hit_rate(point.alpha, schedule) - table.hit_rate(point.alpha, schedule))
    return float(np.sqrt(np.mean(np.square(gaps))))
