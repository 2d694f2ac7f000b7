"""Adaptive speculation length: which K maximises tokens per unit time, and the α it is chosen from.

One SD round drafts K tokens (K·T_d) and verifies K + 1 positions in one target forward (T_v(K + 1));
under i.i.d. acceptance it emits E(α, K) = (1 − α^(K+1)) / (1 − α) tokens (theory.speedup). So

    tokens per unit time(K) = Σ_b E(α_b, K) / (K·T_d + T_v(K + 1))

over the b rows of a batch that share one K (one forward serves them all). `best_K` maximises it by
brute force over K_min..K_max; the sizes are tiny (K_max ≲ 16), so there is nothing to approximate.

Exactness (docs/ssd.md §1): SD is exact for any proposal whose length is fixed before the round's
verification, so a K chosen from past rounds only (their outcomes and timings) leaves the output
distribution unchanged; so does stopping the draft early on the draft's own probabilities.

α estimate: a Beta(a₀, b₀) posterior mean over exponentially forgotten counts. A round with k of K
accepted is a truncated geometric observation: k acceptances, plus one rejection when k < K. The prior
(`PRIOR_ACCEPTED`, `PRIOR_REJECTED` = ½, ½: mean ½, the weight of one observation) keeps the first rounds
away from the extremes the plain ratio gives (with no rejections the ratio says α = 1; with none at all it is
undefined); forgetting lets K follow an acceptance that drifts within a sequence (code vs. prose, a topic
change). The past is forgotten per observation (`DECAY` per accepted or rejected draft token: an effective
memory of about 1 / (1 − DECAY) = 50 of them), not per round: forgotten per round (0.9), a run at K = 1 kept
about 10 observations against K = 4's 40, so the prior (then 1, 1) held its α down (at most 11/12 for a
draft that is always right) and short K looked best because K was short (HumanEval, int4 target: SD and SSD
with K = "auto" ran K = 1 in ~90% of their rounds, 9% and 3% slower than K = 3 fixed).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from theory._checks import as_int, as_nonnegative, as_positive, as_probability
from theory.speedup import expected_tokens

PRIOR_ACCEPTED = 0.5  # Beta prior a₀: pseudo-acceptances
PRIOR_REJECTED = 0.5  # Beta prior b₀: pseudo-rejections
DECAY = 0.98  # weight of the past counts after each new observation (an accepted or a rejected draft token)


def acceptance_estimate(
    accepted: npt.ArrayLike,
    rejected: npt.ArrayLike,
    prior_accepted: float = PRIOR_ACCEPTED,
    prior_rejected: float = PRIOR_REJECTED,
) -> float | npt.NDArray[np.float64]:
    """Posterior mean of α, `(a₀ + accepted) / (a₀ + b₀ + accepted + rejected)` (counts may be fractional,
    as forgotten counts are)."""
    accepted = as_nonnegative(accepted, "accepted", " (accepted draft tokens, possibly decayed)")
    rejected = as_nonnegative(rejected, "rejected", " (rejections, possibly decayed)")
    a0 = as_positive(prior_accepted, "prior_accepted")
    b0 = as_positive(prior_rejected, "prior_rejected")
    alpha = (a0 + accepted) / (a0 + b0 + accepted + rejected)
    return alpha[()] if alpha.ndim == 0 else alpha


def updated_counts(
    accepted: npt.ArrayLike, rejected: npt.ArrayLike, k: npt.ArrayLike, K: int, decay: float = DECAY
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """The counts after one more round in which k of K draft tokens were accepted (per row): the old counts are
    forgotten by `decay` per observation of this round (k acceptances and, if k < K, one rejection)."""
    accepted = as_nonnegative(accepted, "accepted")
    rejected = as_nonnegative(rejected, "rejected")
    K = int(as_int(K, "K", minimum=0))
    k = as_int(k, "k", minimum=0)
    if np.any(k > K):
        raise ValueError(f"k (accepted this round) must lie in 0..K = 0..{K}, got {k}")
    return with_observations(accepted, rejected, k, (k < K).astype(np.float64), decay)


def with_observations(
    accepted: npt.ArrayLike,
    rejected: npt.ArrayLike,
    new_accepted: npt.ArrayLike,
    new_rejected: npt.ArrayLike,
    decay: float = DECAY,
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """The counts after `new_accepted` acceptances and `new_rejected` rejections more, the old counts forgotten by
    `decay` per new observation (per row, or pooled over rows: engine.strategies.lookahead)."""
    decay = float(as_probability(decay, "decay", " (weight the past counts keep per observation)"))
    new_a, new_r = np.asarray(new_accepted, dtype=np.float64), np.asarray(new_rejected, dtype=np.float64)
    kept = decay ** (new_a + new_r)
    return kept * np.asarray(accepted) + new_a, kept * np.asarray(rejected) + new_r


def round_rate(alpha: npt.ArrayLike, K: int, draft_ms: float, verify_ms: float | Callable[[int], float]) -> float:
    """Σ_b E(α_b, K) / (K·T_d + T_v(K + 1)): expected tokens per ms of a round of K over the rows α_b.

    `verify_ms` is T_v as one number, or as a function of the block width K + 1 (the verify forward
    grows with the tokens it scores once the target stops being memory-bound).
    """
    K = int(as_int(K, "K", minimum=0))
    draft_ms = float(as_nonnegative(draft_ms, "draft_ms", " (time of one draft token)"))
    T_v = verify_ms(K + 1) if callable(verify_ms) else verify_ms
    T_v = float(as_positive(T_v, "verify_ms", " (time of one verify forward)"))
    tokens = float(np.sum(expected_tokens(alpha, K)))
    return tokens / (K * draft_ms + T_v)


def best_K(
    alpha: npt.ArrayLike,
    draft_ms: float,
    verify_ms: float | Callable[[int], float],
    K_max: int,
    K_min: int = 1,
) -> int:
    """The K in K_min..K_max that maximises `round_rate` (the smallest such K on a tie).

    `alpha` is one acceptance rate or one per row of a batch that shares the round; the times may be in any
    one unit (ms, or verify units with `verify_ms = 1`). Higher α never gives a smaller K: E(α, K+1)/E(α, K)
    grows with α while the round time does not depend on α.
    """
    alpha = as_probability(alpha, "alpha", " (per-token acceptance rate)")
    K_min = int(as_int(K_min, "K_min", minimum=0))
    K_max = int(as_int(K_max, "K_max", minimum=K_min))
    rates = [round_rate(alpha, K, draft_ms, verify_ms) for K in range(K_min, K_max + 1)]
    return K_min + int(np.argmax(rates))


def miss_share(p_hit: float, batch_size: int) -> float:
    """The share of SSD rounds that pay the backup's drafting: 1 − p_hit^b (Cor. 16: a batch of b
    independent rows takes the fast path only when every row hits).

    SSD with adaptive K (engine.strategies.lookahead.SSDLookahead) uses `best_K` with the draft's time per
    token scaled by this share: on a hit the K tokens were drafted during the last verify, off the critical
    path; on a miss the backup drafts them just in time (the neural backup: K·T_d, as SD). The cache build
    itself is kept inside one verify by budget "auto", so it adds nothing to the round.
    """
    p_hit = float(as_probability(p_hit, "p_hit", " (probability that a row's outcome is in the cache)"))
    b = int(as_int(batch_size, "batch_size", minimum=1))
    return 1.0 - p_hit**b


def heuristic_K(K: int, all_accepted: bool, K_min: int = 1) -> int:
    """transformers' "heuristic" assisted-generation schedule, for comparison: K + 2 after a round in which
    every draft token was accepted, K − 1 otherwise (not below K_min). It looks at neither α's size nor
    the timings, only at the last round."""
    return K + 2 if all_accepted else max(K_min, K - 1)
