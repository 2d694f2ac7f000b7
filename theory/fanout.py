"""Where to spend the cache budget: outcome probabilities, the optimal fan-out of Thm 12, integer schedules.

The cache holds `F_k` guesses of the bonus token for each outcome k = 0..K (k draft tokens accepted),
with `Σ_k F_k = B`. Under the power-law miss model (Def. 11, `theory.powerlaw`) the probability that
the next speculation is in the cache is `Σ_k P(k)·(1 − miss(F_k))`.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from theory._checks import FloatArray, IntArray, as_float, as_int, as_positive, as_probability
from theory.powerlaw import miss_rate

# Relative gap below which `integer_fanout` counts two schedules (or two steps) as equally good. Exact ties
# (equally likely outcomes; equal steps such as 0.2·a/(9·10) = 0.16·a/(8·9)) come out of floating point a
# few ulps (~1e-16) apart; a slack of 1e-14 lets the tie rule see them and costs at most 3e-14 relative in hit.
TIE = 1e-14


def outcome_probabilities(alpha: npt.ArrayLike, K: int) -> FloatArray:
    """P(k) for k = 0..K under i.i.d. acceptance: `α^k(1 − α)` for k < K, `α^K` for k = K. Shape [..., K+1].

    The distribution of the verify outcome's k (Thm 12's weights); it sums to 1 over the last axis.
    """
    alpha = as_probability(alpha, "alpha", " (pass the per-token acceptance rate)")
    K = int(as_int(K, "K", minimum=0))
    k = np.arange(K + 1)  # [K+1]
    powers = alpha[..., None] ** k  # [..., K+1]; 0**0 = 1, so α = 0 puts all mass on k = 0
    return np.where(k < K, powers * (1.0 - alpha[..., None]), powers)


def expected_hit_probability(
    F: npt.ArrayLike, alpha: npt.ArrayLike, r: npt.ArrayLike, scale: npt.ArrayLike = 1.0
) -> FloatArray | float:
    """Modelled hit probability of a schedule, `Σ_k P(k)·(1 − miss(F_k))` (Thm 12's objective).

    `F` has shape [..., K+1] (one fan-out per outcome k = 0..K, real or integer); `alpha`, `r` and `scale`
    broadcast against its leading axes. `miss` is Def. 11's power law capped at 1, so F_k = 0 (no guess)
    and, with scale 1, F_k = 1 contribute no hit.
    """
    F = as_float(F, "F")
    if F.ndim == 0:
        raise ValueError("F must be a schedule: one fan-out per outcome k = 0..K (shape [..., K+1])")
    weights = outcome_probabilities(alpha, F.shape[-1] - 1)  # [..., K+1]
    r = np.asarray(r, dtype=np.float64)[..., None]
    scale = np.asarray(scale, dtype=np.float64)[..., None]
    hit = weights * (1.0 - np.asarray(miss_rate(F, r, scale)))
    total = hit.sum(axis=-1)
    return total[()] if total.ndim == 0 else total


def optimal_fanout(alpha: npt.ArrayLike, r: npt.ArrayLike, K: int, B: npt.ArrayLike) -> FloatArray:
    """Thm 12's real-valued optimum: `F_k ∝ P(k)^(1/(1+r))`, scaled so `Σ_k F_k = B`. Shape [..., K+1].

    Minimising `Σ_k P(k)·F_k^(−r)` subject to `Σ_k F_k = B` (Lagrange: `r·P(k)·F_k^(−r−1) = λ`) gives
    `F_k = F_0·α^(k/(1+r))` for k < K and `F_K = F_0·α^(K/(1+r))·(1 − α)^(−1/(1+r))`: a geometric
    series capped by a larger all-accepted entry. Outcomes with P(k) = 0 (α = 0 or α = 1) get nothing.
    The relaxation ignores the cap miss ≤ 1, so entries below 1 are what the Lagrange optimum says, not
    what the integer optimum (`integer_fanout`) will do.
    """
    r = as_positive(r, "r", " (power-law exponent of the miss rate)")
    B = as_positive(B, "B", " (the cache budget Σ_k F_k)")
    weights = outcome_probabilities(alpha, K) ** (1.0 / (1.0 + r[..., None]))  # [..., K+1]
    return B[..., None] * weights / weights.sum(axis=-1, keepdims=True)


def uniform_fanout(K: int, B: int) -> IntArray:
    """The reference engine's default: B spread evenly over the K+1 outcomes (remainder to the first ones)."""
    K = int(as_int(K, "K", minimum=0))
    B = int(as_int(B, "B", minimum=0))
    F = np.full(K + 1, B // (K + 1), dtype=np.int64)
    F[: B % (K + 1)] += 1
    return F


def round_largest_remainder(F: npt.ArrayLike, B: int) -> IntArray:
    """Round a real schedule to integers that sum exactly to B: floor, then +1 to the largest remainders.

    Ties between equal remainders go to the lower k. `F` must be ≥ 0 and sum to B (as `optimal_fanout`'s does).
    """
    F = as_float(F, "F")
    B = int(as_int(B, "B", minimum=0))
    if F.ndim != 1 or np.any(F < 0) or not np.isclose(F.sum(), B):
        raise ValueError("F must be one non-negative schedule summing to B (e.g. optimal_fanout's output)")
    floors = np.floor(F).astype(np.int64)
    missing = B - int(floors.sum())
    # Stable sort of the negated remainders: largest first, ties by lower k.
    order = np.argsort(-(F - floors), kind="stable")
    floors[order[:missing]] += 1
    return floors


def integer_fanout(alpha: float, r: float, K: int, B: int, scale: float = 1.0) -> IntArray:
    """The exact integer optimum of Thm 12's problem: integers F_k ≥ 0 with `Σ_k F_k = B` that maximise
    `Σ_k P(k)·h(F_k)`, `h(F) = 1 − miss(F) = 1 − min(1, a·F^(−r))` (Def. 11, capped at 1).

    Why not plain greedy or rounding: h is 0 up to a threshold c (the first F with a·F^(−r) < 1; c = 2 for
    a = 1, where one guess buys nothing) and concave only from c on, so greedy is not exact. The search:
    (1) budget below c on an outcome is wasted and a share of an outcome with P(k) = 0 buys nothing, while h
    strictly increases from c, so an optimum gives each outcome 0 or at least c, and nothing where P(k) = 0;
    (2) all outcomes share one h, so by the rearrangement inequality the m outcomes with a share are the m
    most likely; (3) given those, with c each, the other B − m·c guesses go to the B − m·c largest steps
    `P(k)·(h(F+1) − h(F))`, F ≥ c, which decrease in F (`_spread` finds the cut-off step exactly, without a
    loop over guesses); (4) the best of these schedules over m is the optimum. Cost O(K²·64) whatever B
    (milliseconds at B = 10^6), where the dynamic programme `integer_fanout_dp` takes O((K+1)·B²).

    Ties between equally good schedules go to the one that gives more to the earlier outcomes (the
    lexicographically largest; with no outcome able to reach c, all of B goes to k = 0). Exact ties come out of
    floating point a few ulps apart, so "equally good" allows a relative slack TIE: equally likely outcomes and
    steps within TIE of the cut-off are filled in order of k, and of the schedules over m within TIE of the
    best the largest is taken. Guaranteed: the hit probability is within 3·TIE (relative) of the optimum, so
    equal to the dynamic programme's to 1e-12, and the schedule is the exact optimum whenever no other schedule
    comes that close; exact ties follow the tie rule (the programme's float sums sometimes break them).
    """
    alpha = float(as_probability(alpha, "alpha", " (pass the per-token acceptance rate)"))
    r = float(as_positive(r, "r", " (power-law exponent of the miss rate)"))
    scale = float(as_positive(scale, "scale", " (the a in miss ≈ a·F^(−r))"))
    K = int(as_int(K, "K", minimum=0))
    B = int(as_int(B, "B", minimum=0))
    weights = outcome_probabilities(alpha, K)  # [K+1]
    nothing_hits = np.zeros(K + 1, dtype=np.int64)
    nothing_hits[0] = B  # every schedule scores 0: the tie rule gives all to k = 0
    first = _first_useful_fanout(r, scale, B)
    if first is None:
        return nothing_hits
    ranked = [k for k in np.argsort(-weights, kind="stable") if weights[k] > 0]  # ties: the lower k first
    shares = np.arange(1, min(len(ranked), B // first) + 1)  # [M]: m = 1..M outcomes get a share
    rank = np.full(K + 1, K + 1)
    rank[ranked] = np.arange(len(ranked))
    sharing = rank[None, :] < shares[:, None]  # [M, K+1]: row m − 1 marks the m most likely outcomes
    extra = _spread(np.where(sharing, weights, 0.0), r, scale, first, B - shares * first)  # [M, K+1]
    F = np.where(sharing, first + extra, 0)  # [M, K+1]: the best schedule with m shares
    # Compared as misses, Σ P(k)·a·F^(−r) keeps the relative precision that 1 − miss would round away.
    miss = np.where(sharing, weights * scale * np.maximum(F, 1).astype(np.float64) ** -r, weights).sum(axis=1)
    slack = TIE * (weights.sum() - miss.min())  # TIE relative to the best hit probability
    return np.array(max(map(tuple, F[miss <= miss.min() + slack])), dtype=np.int64)


def _first_useful_fanout(r: float, scale: float, B: int) -> int | None:
    """c: the smallest F in 1..B whose modelled miss is below 1 (floor(a^(1/r)) + 1), or None if there is none.

    Settled by `miss_rate` itself, so the threshold is the one the objective uses, to the last bit.
    """
    with np.errstate(over="ignore"):  # a^(1/r) may overflow: then no F ≤ B hits
        guess = min(float(B), np.floor(np.power(scale, 1.0 / r)) + 1.0)
    F = max(1, int(guess))
    while F > 1 and miss_rate(F - 1, r, scale) < 1.0:
        F -= 1
    while F <= B and miss_rate(F, r, scale) >= 1.0:
        F += 1
    return F if F <= B else None


def _step_gain(P: FloatArray, F: npt.ArrayLike, r: float, scale: float) -> FloatArray:
    """What guess F + 1 adds to an outcome's hit, `P·a·(F^(−r) − (F+1)^(−r))`, for F ≥ c (miss below its cap).

    Written as `P·a·F^(−r)·(1 − (1 + 1/F)^(−r))`: the difference of two nearly equal powers would cancel.
    """
    F = np.asarray(F, dtype=np.float64)
    return P * scale * F**-r * -np.expm1(-r * np.log1p(1.0 / F))


def _steps_at_least(level: FloatArray, P: FloatArray, r: float, scale: float, first: int, extra: IntArray) -> IntArray:
    """How many of each outcome's steps from F = c, c+1, … add at least `level` (counted up to `extra`).

    Shapes: level and extra [M], P [M, n] (0 where an outcome has no share: no steps); returns [M, n].
    The step from F adds P·h'(ξ) for some ξ in (F, F+1), and h'(x) = a·r·x^(−r−1) decreases; with x where
    P·h'(x) = level, every step from F ≤ x − 1 adds more than `level` and every step from F ≥ x less. So only
    the steps from floor(x) − 1 and floor(x) are in doubt; evaluating floor(x) − 2 .. floor(x) + 1 also
    covers the rounding of x, far below 1 (and consecutive steps differ by a relative ~(r+1)/F, far above
    rounding, so the evaluated steps decrease as they should).
    """
    level = level[:, None]  # [M, 1]
    positive = level > 0
    with np.errstate(over="ignore", divide="ignore"):  # x = inf for a tiny level, 0 where P·a·r is 0
        x = np.exp((np.log(scale * r * P) - np.log(np.where(positive, level, 1.0))) / (r + 1.0))  # [M, n]
    x = np.where(positive, x, np.inf)  # level 0: every step counts
    base = np.clip(np.floor(x), first - 1, (first + extra + 1)[:, None]).astype(np.int64)  # [M, n]
    count = np.zeros(P.shape, dtype=np.int64)
    for offset in (-2, -1, 0, 1):  # increasing F: the last step that still adds `level` sets the count
        F = base + offset
        adds = (P > 0) & (F >= first) & (_step_gain(P, np.maximum(F, first), r, scale) >= level)
        count = np.where(adds, F - first + 1, count)
    return np.minimum(count, extra[:, None])


def _spread(P: FloatArray, r: float, scale: float, first: int, extra: IntArray) -> IntArray:
    """Guesses beyond c for each outcome with a share: the `extra` largest steps, ties to the lower k.

    Shapes: P [M, K+1] (one row per number of shares; 0 for no share), extra [M]; returns [M, K+1]. The
    cut-off λ of a row is its extra-th largest step: the largest float with at least `extra` steps ≥ λ.
    Non-negative floats order like their bit patterns, so bisecting those (≤ 64 rounds, all rows at once)
    finds it exactly. Steps above λ are all taken; steps within TIE of λ (ties, up to rounding) fill what is
    left in order of k.
    """

    def at_least(level: FloatArray) -> IntArray:
        return _steps_at_least(level, P, r, scale, first, extra)

    largest = _step_gain(P, first, r, scale).max(axis=1)  # [M]; an outcome's steps decrease: its first is largest
    low = np.zeros(extra.shape, dtype=np.int64)  # bits of a level with at least `extra` steps at or above it
    high = largest.view(np.int64) + 1  # bits of a level with fewer (none)
    while np.any(high - low > 1):
        middle = (low + high) // 2
        enough = at_least(middle.view(np.float64)).sum(axis=1) >= extra
        low, high = np.where(enough, middle, low), np.where(enough, high, middle)
    cut = low.view(np.float64)  # [M]
    above = at_least(np.nextafter(cut * (1 + TIE), np.inf))  # fewer than `extra`: all taken
    tied = at_least(cut * (1 - TIE)) - above  # together with `above`, at least `extra`
    left = extra - above.sum(axis=1)  # [M]
    before = np.cumsum(tied, axis=1) - tied  # tied steps of the lower k
    return above + np.minimum(tied, np.maximum(0, left[:, None] - before))


def separable_fanout(gain: npt.ArrayLike, B: int, larger_first: bool = False) -> IntArray:
    """The integer schedule F_0..F_K with `Σ_k F_k = B` that maximises `Σ_k gain[k, F_k]`, for any gains
    `gain` [K+1, cap+1] (an outcome's value at F = 0..cap guesses; measured hit curves need not be concave, so
    no greedy): a dynamic programme over outcomes and budget, exact, in O((K+1)·B·cap) time, vectorised over
    the budget.

    Ties: among equally good shares of outcome k, the smallest (the rest goes to the later outcomes), or the
    largest with `larger_first`. ValueError when no schedule spends B (B > (K+1)·cap)."""
    gain = np.asarray(gain, dtype=np.float64)
    if gain.ndim != 2 or gain.shape[1] == 0:
        raise ValueError(f"gain must be [K+1, cap+1] (one row of values per outcome), got shape {gain.shape}")
    B = int(as_int(B, "B", minimum=0))
    K, cap = gain.shape[0] - 1, gain.shape[1] - 1
    if B > (K + 1) * cap:
        raise ValueError(f"no schedule of {K + 1} outcomes with at most {cap} guesses each spends B = {B}")
    f = np.arange(cap + 1)
    # best_next[c]: the best total of outcomes k+1..K with budget exactly c (-inf: more than they can take)
    best_next = np.full(B + 1, -np.inf)
    best_next[: min(B, cap) + 1] = gain[K, : min(B, cap) + 1]
    choice = np.zeros((K + 1, B + 1), dtype=np.int64)
    choice[K, : min(B, cap) + 1] = f[: min(B, cap) + 1]
    c = np.arange(B + 1)
    rest = c[:, None] - f[None, :]  # [B+1, cap+1]: budget left to outcomes k+1..K when F_k = f
    for k in range(K - 1, -1, -1):
        totals = np.where(rest >= 0, gain[k][None, :] + best_next[np.maximum(rest, 0)], -np.inf)  # [B+1, cap+1]
        i = cap - np.argmax(totals[:, ::-1], axis=1) if larger_first else np.argmax(totals, axis=1)
        choice[k] = i
        best_next = totals[c, i]
    F = np.empty(K + 1, dtype=np.int64)
    left = B
    for k in range(K + 1):
        F[k] = choice[k, left]
        left -= F[k]
    return F


def integer_fanout_dp(alpha: float, r: float, K: int, B: int, scale: float = 1.0) -> IntArray:
    """The reference `integer_fanout` is checked against (tests, benchmarks/fanout.py): a dynamic programme
    over outcomes and budget, exact for any separable objective, in O((K+1)·B²) time. Ties: larger F_k first.
    """
    weights = outcome_probabilities(alpha, K)  # [K+1]
    f = np.arange(B + 1)  # candidate fan-outs for one outcome
    gain = weights[:, None] * (1.0 - np.asarray(miss_rate(f, r, scale)))  # [K+1, B+1]
    return separable_fanout(gain, B, larger_first=True)
