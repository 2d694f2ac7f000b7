"""Saguaro sampling (Def. 14) and its exact per-position hit probability and acceptance rate (Thm 15).

Everything here is computed in closed form from the target `p` and draft `q` at one position (numpy
vectors over the vocabulary, batched over leading axes), never simulated.

Sets, in this project's convention (docs/ssd.md §2 step 2 and §5; engine/sampling.py agrees):
- rank: tokens ordered by decreasing q, ties broken by the lower token id (a stable sort of −q).
- T_n: the n best-ranked tokens of q.
- Saguaro set: T_{F+1}, the F cached guesses plus the token usually drafted; σ scales it by C.
- Guesses after rejecting the drafted token x: G(x) = the F best-ranked tokens of q other than x.
  So G(x) = T_{F+1} \\ {x} if x ∈ T_F, and G(x) = T_F otherwise. G uses q's ranking, not σ's.

Does σ keep q's ranking? Within T_{F+1} and within the rest, yes (each part is scaled by one factor).
Across the boundary, not for C < 1: a scaled token with C·q(a) < q(b) falls below an unscaled b, and
two tokens tied in q at the boundary stop being tied. With C = 1, or when T_{F+1} is the whole
vocabulary (the scaling cancels), σ = q. The cache ranks by the draft's own logits, i.e. by q.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from theory._checks import (
    FloatArray,
    FloatOrArray,
    as_distribution,
    as_int,
    as_saguaro_constant,
    scalar_or_array,
)


def _ranks(q: FloatArray) -> np.ndarray:
    """rank[..., t] = position of token t when q is sorted by decreasing probability, ties by lower id."""
    order = np.argsort(-q, axis=-1, kind="stable")  # [..., V]; stable, so equal q keep id order
    ranks = np.empty_like(order)
    np.put_along_axis(ranks, order, np.arange(q.shape[-1]), axis=-1)
    return ranks  # [..., V]


def saguaro_q(q: npt.ArrayLike, n_top: int, C: npt.ArrayLike) -> FloatArray:
    """Saguaro sampling σ_{F,C} (Def. 14) applied to the draft distribution q, shape [..., V].

    The weights of q's `n_top` best-ranked tokens (ties to the lower id) are multiplied by C and the row is
    renormalised, so σ(a)/σ(b) = C·q(a)/q(b) for a in the top set and b outside it. The project passes
    n_top = F + 1. `C` ∈ (0, 1] broadcasts over the leading axes; C = 1 returns q. (Not: "scale the top set
    to C·q and hand the freed mass to the rest"; that shrinks the ratio by more than C.)
    """
    q = as_distribution(q, "q")
    n_top = int(as_int(n_top, "n_top (F + 1 in this project)", minimum=0))
    C = as_saguaro_constant(C)[..., None]  # [..., 1]
    weights = np.where(_ranks(q) < n_top, C * q, q)  # [..., V]
    return weights / weights.sum(axis=-1, keepdims=True)


@dataclass(frozen=True)
class SaguaroPosition:
    """Exact per-position quantities of Saguaro sampling (each has the leading shape of p and q).

    sigma: the distribution the draft token is sampled from (and verified against), [..., V].
    acceptance: α = Σ_x min(p(x), σ(x)), the probability the drafted token is accepted.
    reject: P(reject) = 1 − α.
    hit_and_reject: P(the drafted token is rejected and the bonus t* is among the guesses G(x)).
    hit_given_reject: hit_and_reject / reject; NaN where reject = 0 (σ = p: no bonus is ever drawn here).
    bonus_in_saguaro_set: P(t* ∈ T_{F+1} | reject), the residual mass on the scaled set (Thm 15's quantity:
        non-increasing in C). It bounds hit_given_reject from above; NaN where reject = 0.
    """

    sigma: FloatArray
    acceptance: FloatOrArray
    reject: FloatOrArray
    hit_and_reject: FloatOrArray
    hit_given_reject: FloatOrArray
    bonus_in_saguaro_set: FloatOrArray


def saguaro_position(p: npt.ArrayLike, q: npt.ArrayLike, F: int, C: npt.ArrayLike = 1.0) -> SaguaroPosition:
    """Exact acceptance and cache-hit probability at one position under Saguaro sampling σ_{F+1,C}.

    The process (docs/ssd.md §1, §2): the draft token x ~ σ; it is accepted with probability
    min(1, p(x)/σ(x)); on rejection the bonus t* ~ r ∝ max(0, p − σ); the cache hit iff t* ∈ G(x).
    So P(hit, reject) = Σ_x max(0, σ(x) − p(x))·r(G(x)). The residual r is the same for every x and
    vanishes on any x that can be rejected (σ(x) > p(x)), so r(T_{F+1} \\ {x}) = r(T_{F+1}) there and
        P(hit, reject) = r(T_{F+1})·Σ_{x∈T_F} max(0, σ − p)(x) + r(T_F)·Σ_{x∉T_F} max(0, σ − p)(x),
    an O(V log V) computation (the sort).

    Thm 15 (smaller C, more hits) holds exactly for `bonus_in_saguaro_set`: lowering C raises σ off the
    scaled set and lowers it on it, so the residual mass moves onto the scaled set. It does NOT hold in
    general for `hit_given_reject` under this project's guess sets: a smaller C also drafts low-ranked
    tokens more often, and rejecting one of those leaves the (F+1)-th token unguessed. Counterexample:
    p = [0.1, 0.1, 0.8], q = [0.1, 0.5, 0.4], F = 1 gives hit_given_reject 1.0 at C = 1 but 0.8125 at
    C = 0.5 (tests/theory/test_saguaro.py).
    """
    p = as_distribution(p, "p")
    q = as_distribution(q, "q")
    if p.shape[-1] != q.shape[-1]:
        raise ValueError(f"p and q must share the vocabulary (last axis): {p.shape[-1]} != {q.shape[-1]}")
    F = int(as_int(F, "F (fan-out: the number of guesses)", minimum=0))
    sigma = saguaro_q(q, F + 1, C)  # [..., V]
    p, sigma = np.broadcast_arrays(p, sigma)
    ranks = _ranks(np.broadcast_to(q, sigma.shape))  # [..., V]
    in_top_F, in_top_F1 = ranks < F, ranks < F + 1

    excess = np.maximum(0.0, sigma - p)  # [..., V], P(draft x and reject it) per x
    deficit = np.maximum(0.0, p - sigma)  # [..., V], unnormalised residual
    reject = excess.sum(axis=-1)  # = Σ deficit = 1 − α; summing the excess avoids 1 − (1 − ε) cancellation
    residual_total = deficit.sum(axis=-1)
    # Both sums are 1 − α in exact arithmetic; rounding can leave one of them a stray 1e-17, so a
    # position counts as "can reject" only when both are positive.
    can_reject = (reject > 0) & (residual_total > 0)
    safe_total = np.where(can_reject, residual_total, 1.0)
    r_top_F = np.where(in_top_F, deficit, 0.0).sum(axis=-1) / safe_total
    r_top_F1 = np.where(in_top_F1, deficit, 0.0).sum(axis=-1) / safe_total
    reject_in_top = np.where(in_top_F, excess, 0.0).sum(axis=-1)
    hit_and_reject = np.where(can_reject, r_top_F1 * reject_in_top + r_top_F * (reject - reject_in_top), 0.0)
    safe_reject = np.where(can_reject, reject, 1.0)
    # Clip: the ratio of two rounded sums can poke past 1 by an ulp.
    hit_given_reject = np.where(can_reject, np.clip(hit_and_reject / safe_reject, 0.0, 1.0), np.nan)
    bonus_in_saguaro_set = np.where(can_reject, np.minimum(r_top_F1, 1.0), np.nan)
    return SaguaroPosition(
        sigma=sigma,
        acceptance=scalar_or_array(np.minimum(p, sigma).sum(axis=-1)),
        reject=scalar_or_array(reject),
        hit_and_reject=scalar_or_array(hit_and_reject),
        hit_given_reject=scalar_or_array(hit_given_reject),
        bonus_in_saguaro_set=scalar_or_array(bonus_in_saguaro_set),
    )


def all_accepted_hit_probability(p: npt.ArrayLike, q: npt.ArrayLike, F: int) -> FloatOrArray:
    """P(hit | all K accepted): the bonus t* ~ p_{K+1} and the guesses are the top F of q_{K+1} (ranked as
    above, nothing excluded), so the hit probability is p's mass on q's top F. No Saguaro factor: no
    draft token is sampled at position K+1 in this round.
    """
    p = as_distribution(p, "p")
    q = as_distribution(q, "q")
    if p.shape[-1] != q.shape[-1]:
        raise ValueError(f"p and q must share the vocabulary (last axis): {p.shape[-1]} != {q.shape[-1]}")
    F = int(as_int(F, "F (fan-out: the number of guesses)", minimum=0))
    p, q = np.broadcast_arrays(p, q)
    return scalar_or_array(np.where(_ranks(q) < F, p, 0.0).sum(axis=-1))
