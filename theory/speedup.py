"""Tokens per round and speedups: SD (Leviathan et al. 2023) and SSD (Thm 7, Cor. 8, 9 and 16).

All functions broadcast over numpy arrays. The SSD forms take times in units of one verify forward
(`T_v = 1`), as docs/ssd.md §3 does; the SD forms also accept raw timings.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from theory._checks import (
    FloatOrArray,
    as_distribution,
    as_int,
    as_nonnegative,
    as_positive,
    as_probability,
    scalar_or_array,
)
from theory.glossary import MissPolicy


def expected_tokens(alpha: npt.ArrayLike, K: npt.ArrayLike) -> FloatOrArray:
    """Expected tokens emitted per round, `E(α, K) = (1 − α^(K+1)) / (1 − α) = Σ_{i=0..K} α^i`.

    i.i.d. acceptance with rate α (docs/ssd.md §1): the accepted prefix plus the bonus token.
    Exact limits: α = 1 gives K + 1, α = 0 gives 1, K = 0 gives 1.
    """
    alpha = as_probability(alpha, "alpha", " (pass the per-token acceptance rate 1 − TV(p, q))")
    K = as_int(K, "K", minimum=0)
    # 1 − α^(K+1) cancels badly for α near 1; writing α^(K+1) = exp((K+1)·log1p(α − 1)) keeps full
    # relative precision (α − 1 is exact in floating point for α ≥ 1/2).
    with np.errstate(divide="ignore", invalid="ignore"):
        log_alpha = np.log1p(alpha - 1.0)  # −inf at α = 0, which expm1 maps to −1: E = 1, as it should
        numerator = -np.expm1((K + 1) * log_alpha)
        E = np.where(alpha == 1.0, K + 1.0, numerator / (1.0 - alpha))
    return scalar_or_array(np.asarray(E, dtype=np.float64))


def acceptance_rate(p: npt.ArrayLike, q: npt.ArrayLike) -> FloatOrArray:
    """α = Σ_x min(p(x), q(x)) = 1 − TV(p, q), over the last axis (the vocabulary).

    The probability that a token drawn from q is accepted against p (Leviathan et al. 2023).
    """
    p = as_distribution(p, "p")
    q = as_distribution(q, "q")
    if p.shape[-1] != q.shape[-1]:
        raise ValueError(f"p and q must share the vocabulary (last axis): {p.shape[-1]} != {q.shape[-1]}")
    return scalar_or_array(np.minimum(p, q).sum(axis=-1))


def ar_tokens_per_second(T_ar: npt.ArrayLike) -> FloatOrArray:
    """Autoregressive decoding: one token per target decode step, `1 / T_ar`."""
    T_ar = as_positive(T_ar, "T_ar", " (seconds per target decode step)")
    return scalar_or_array(1.0 / T_ar)


def sd_tokens_per_second(
    alpha: npt.ArrayLike, K: npt.ArrayLike, T_d: npt.ArrayLike, T_v: npt.ArrayLike
) -> FloatOrArray:
    """Synchronous SD: `E(α, K) / (K·T_d + T_v)`; the draft's K tokens and one verify run in series."""
    E = np.asarray(expected_tokens(alpha, K))
    K = as_int(K, "K", minimum=0)
    T_d = as_nonnegative(T_d, "T_d", " (seconds per draft token)")
    T_v = as_positive(T_v, "T_v", " (seconds per verify forward)")
    return scalar_or_array(E / (K * T_d + T_v))


def sd_speedup(
    alpha: npt.ArrayLike,
    K: npt.ArrayLike,
    T_d: npt.ArrayLike,
    T_v: npt.ArrayLike = 1.0,
    T_ar: npt.ArrayLike | None = None,
) -> FloatOrArray:
    """SD tokens/s over AR tokens/s, `E(α, K)·T_ar / (K·T_d + T_v)`.

    In verify units (`T_v = 1`, `T_ar ≈ 1`, the default `T_ar = T_v`) this is `E_SD / (1 + T_SD)` with
    `T_SD = K·T_d / T_v` (docs/ssd.md §1).
    """
    T_ar = T_v if T_ar is None else T_ar
    return scalar_or_array(
        np.asarray(sd_tokens_per_second(alpha, K, T_d, T_v)) / np.asarray(ar_tokens_per_second(T_ar))
    )


def ssd_speedup(
    p_hit: npt.ArrayLike,
    E_hit: npt.ArrayLike,
    E_miss: npt.ArrayLike,
    T_p: npt.ArrayLike,
    T_b: npt.ArrayLike,
    b: npt.ArrayLike = 1,
    T_ar: npt.ArrayLike = 1.0,
    *,
    miss_policy: MissPolicy | str = MissPolicy.PER_ROW,
) -> FloatOrArray:
    """SSD speedup over AR per sequence (Thm 7; batch form Cor. 16), times in units of one verify.

    With M = max(1, T_p) (the round stretches when the cache build outlasts the verify) and s = p_hit^b
    (all b independent rows hit):

        per-row:      [p_hit·E_hit + (1 − p_hit)·E_miss] · T_ar / [M + (1 − s)·T_b]
        whole-batch:  [s·E_hit + (1 − s)·E_miss] · T_ar / [s·M + (1 − s)·(1 + T_b)]

    `MissPolicy.PER_ROW` (this engine): the build always runs to its end, then the missed rows share one
    backup whenever any row missed; each row emits its own hit or miss tokens. `MissPolicy.WHOLE_BATCH`
    (the reference engine): a miss in any row abandons the build as soon as the outcome arrives (the
    cache keys are known before the tree decode) and backs up every row, so either all rows hit or the
    round takes 1 + T_b and every row emits backup tokens.

    Both equal the paper's form [p_hit·E_hit + (1 − p_hit)·E_miss] / [s·M + (1 − s)·(1 + T_b)] when
    b = 1 and T_p ≤ 1. The paper's form takes its denominator from the whole-batch policy (a miss drops
    the build at the end of the verify) and its numerator from the per-row one (hit rows keep their
    cached tokens). When T_p > 1 this mix is wrong for both: at b = 1 it charges a miss round 1 + T_b,
    whereas an engine that finishes its build (this one) pays M + T_b; at b > 1 it credits hit rows with
    cache tokens from a build it has dropped, so whenever M > 1 + T_b its per-sequence speed rises with
    b (more rounds skip the long build) although no sequence gets faster.
    """
    p_hit = as_probability(p_hit, "p_hit", " (the probability that the verify outcome is in the cache)")
    E_hit = as_positive(E_hit, "E_hit", " (expected tokens per round after a hit; at least 1)")
    E_miss = as_positive(E_miss, "E_miss", " (expected tokens per round after a miss; at least 1)")
    T_p = as_nonnegative(T_p, "T_p", " (cache-build time in units of one verify)")
    T_b = as_nonnegative(T_b, "T_b", " (backup time in units of one verify)")
    b = as_int(b, "b (batch size)", minimum=1)
    T_ar = as_positive(T_ar, "T_ar", " (AR decode step in units of one verify; about 1)")
    miss_policy = MissPolicy(miss_policy)
    all_hit = p_hit**b
    stretched = np.maximum(1.0, T_p)
    if miss_policy is MissPolicy.PER_ROW:
        tokens = p_hit * E_hit + (1.0 - p_hit) * E_miss
        time = stretched + (1.0 - all_hit) * T_b
    else:
        tokens = all_hit * E_hit + (1.0 - all_hit) * E_miss
        time = all_hit * stretched + (1.0 - all_hit) * (1.0 + T_b)
    return scalar_or_array(tokens * T_ar / time)


def ssd_over_sd_neural(
    p_hit: npt.ArrayLike,
    E_hit: npt.ArrayLike,
    E_sd: npt.ArrayLike,
    T_sd: npt.ArrayLike,
    T_p: npt.ArrayLike = 1.0,
    b: npt.ArrayLike = 1,
    *,
    miss_policy: MissPolicy | str = MissPolicy.PER_ROW,
) -> FloatOrArray:
    """speedup_SSD / speedup_SD with the draft itself as backup (`T_b = T_SD`, `E_miss = E_SD`), Cor. 8.

    Cor. 8: if `T_p ≤ 1` and `E_hit ≥ E_SD` (same draft, same acceptance) this is ≥ 1, i.e. SSD is never
    slower than SD, and > 1 once `p_hit > 0` and `T_SD > 0`: under either miss policy the round then takes
    `1 + (1 − p_hit^b)·T_SD`, never more than SD's `1 + T_SD`, and emits at least E_SD tokens per row.
    It holds at any batch size. With `T_p > 1` the per-row policy pays the stretched build on every round
    and can fall behind SD.
    """
    T_sd = as_nonnegative(T_sd, "T_sd", " (K·T_d / T_v, the draft time per round in verify units)")
    ssd = np.asarray(ssd_speedup(p_hit, E_hit, E_sd, T_p, T_sd, b, miss_policy=miss_policy))
    sd = np.asarray(E_sd, dtype=np.float64) / (1.0 + T_sd)
    return scalar_or_array(ssd / sd)


def ssd_over_sd_ceiling(E_hit: npt.ArrayLike, E_sd: npt.ArrayLike, T_sd: npt.ArrayLike) -> FloatOrArray:
    """Cor. 9 ceiling: `speedup_SSD / speedup_SD ≤ (1 + T_SD)·E_hit / E_SD`.

    The most SSD can gain is the hidden draft time times any change in tokens per round. It bounds every
    backup whose `E_miss ≤ E_hit`, because the SSD round never takes less than one verify.
    """
    E_hit = as_positive(E_hit, "E_hit", " (expected tokens per round after a hit)")
    E_sd = as_positive(E_sd, "E_sd", " (expected tokens per SD round)")
    T_sd = as_nonnegative(T_sd, "T_sd", " (K·T_d / T_v)")
    return scalar_or_array((1.0 + T_sd) * E_hit / E_sd)
