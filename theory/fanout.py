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
    `Σ_k P(k)·(1 − miss(F_k))` (Def. 11 miss, capped at 1).

    Why not greedy marginal gain or rounding: the per-outcome gain `P(k)·(1 − min(1, a·F^(−r)))` is concave
    only from F = 1 on; with a = 1 the first guess buys nothing (`1^(−r) = 1`), so the gains are not
    concave and greedy is not exact (it piles the budget on one outcome). A dynamic programme over
    outcomes and budget is exact for any separable objective, in O((K+1)·B²) time. Being the optimum over
    all integer schedules, it is never worse than the uniform schedule or any rounding of the real optimum.
    Ties between equally good schedules go to the one that gives more to the earlier outcomes.
    """
    alpha = float(as_probability(alpha, "alpha", " (pass the per-token acceptance rate)"))
    r = float(as_positive(r, "r", " (power-law exponent of the miss rate)"))
    scale = float(as_positive(scale, "scale", " (the a in miss ≈ a·F^(−r))"))
    K = int(as_int(K, "K", minimum=0))
    B = int(as_int(B, "B", minimum=0))
    weights = outcome_probabilities(alpha, K)  # [K+1]
    f = np.arange(B + 1)  # candidate fan-outs for one outcome
    gain = weights[:, None] * (1.0 - np.asarray(miss_rate(f, r, scale)))  # [K+1, B+1]

    # best[k][c]: the best hit probability of outcomes k..K with budget exactly c; choice[k][c]: F_k there.
    best_next = gain[K].copy()  # the last outcome takes whatever budget is left
    choice = np.zeros((K + 1, B + 1), dtype=np.int64)
    choice[K] = f
    for k in range(K - 1, -1, -1):
        best_here = np.empty(B + 1)
        for c in range(B + 1):
            totals = gain[k, : c + 1] + best_next[c::-1]  # F_k = 0..c, the rest to outcomes k+1..K
            choice[k, c] = c - int(np.argmax(totals[::-1]))  # last maximum: the largest F_k wins ties
            best_here[c] = totals[choice[k, c]]
        best_next = best_here
    F = np.empty(K + 1, dtype=np.int64)
    left = B
    for k in range(K + 1):
        F[k] = choice[k, left]
        left -= F[k]
    return F
