"""Which backup to use on a cache miss, and the critical batch size b* (docs/ssd.md §6, Thm 17, Cor. 16).

A neural backup (the draft drafting K tokens just in time) gives more tokens per missed round but costs
T_SD; a fast backup (random tokens, prompt lookup) costs almost nothing but gives fewer tokens. At batch
b a round pays the backup unless all b sequences hit (Cor. 16), so the backup's latency matters more as b
grows. Under the whole-batch miss policy a miss also hands every row the backup's tokens, so the backup's
yield matters more too. The paper's closed form for b* was not recovered; the one below is ours.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from theory._checks import (
    FloatArray,
    IntArray,
    as_int,
    as_nonnegative,
    as_positive,
    as_probability,
)
from theory.glossary import Backup, MissPolicy
from theory.speedup import ssd_speedup


@dataclass(frozen=True)
class BackupOption:
    """One backup's measured cost and yield: `E_miss` tokens per missed round, `T_b` verify-units of time."""

    kind: Backup
    E_miss: float
    T_b: float

    def __post_init__(self) -> None:
        as_positive(self.E_miss, f"E_miss of the {self.kind.value} backup", " (tokens per round; at least 1)")
        as_nonnegative(self.T_b, f"T_b of the {self.kind.value} backup", " (time in units of one verify)")


def backup_speedups(
    p_hit: float,
    E_hit: float,
    T_p: float,
    options: Sequence[BackupOption],
    b: npt.ArrayLike,
    miss_policy: MissPolicy | str = MissPolicy.PER_ROW,
) -> FloatArray:
    """Cor. 16 SSD speedup for each backup at each batch size: shape [len(options), *shape(b)]."""
    if not options:
        raise ValueError("give at least one backup option")
    return np.stack(
        [
            np.asarray(ssd_speedup(p_hit, E_hit, o.E_miss, T_p, o.T_b, b, miss_policy=miss_policy), dtype=np.float64)
            for o in options
        ]
    )


def best_backup(
    p_hit: float,
    E_hit: float,
    T_p: float,
    options: Sequence[BackupOption],
    b: npt.ArrayLike,
    miss_policy: MissPolicy | str = MissPolicy.PER_ROW,
) -> IntArray:
    """Index into `options` of the backup with the highest Cor. 16 speedup at each b. An option displaces the
    best listed before it only if it beats it by more than WIN_MARGIN (ties, rounding's included, go to the
    first listed), so with [neural, fast] this picks fast exactly where `critical_batch_size` says it wins."""
    speeds = backup_speedups(p_hit, E_hit, T_p, options, b, miss_policy)
    best = np.zeros(speeds.shape[1:], dtype=np.int64)
    top = speeds[0]
    for i in range(1, len(options)):
        wins = beats(speeds[i], top)
        best = np.where(wins, i, best)
        top = np.where(wins, speeds[i], top)
    return best


WIN_MARGIN = 1e-12  # "beats" means by more than this share: closer than that, two speedups tie in floating point


def beats(speed: FloatArray, other: FloatArray) -> npt.NDArray[np.bool_]:
    """Where `speed` beats `other` by more than rounding: at a tie (u = 1 exactly, or u a few ulps from 0) two
    speedups evaluate apart by ~1e-16 either way."""
    return np.asarray(speed > other * (1.0 + WIN_MARGIN))


def fast_beats_neural(speeds: FloatArray) -> npt.NDArray[np.bool_]:
    """Where the fast backup's speedup (row 1 of `backup_speedups`) beats the neural one's (row 0)."""
    return beats(speeds[1], speeds[0])


def _fast_wins(
    p_hit: float, E_hit: float, T_p: float, neural: BackupOption, fast: BackupOption, b: int, miss_policy: MissPolicy
) -> bool:
    return bool(fast_beats_neural(backup_speedups(p_hit, E_hit, T_p, [neural, fast], b, miss_policy)))


def _fast_wins_line(
    p: float, E_hit: float, M: float, neural: BackupOption, fast: BackupOption, miss_policy: MissPolicy
) -> tuple[float, float]:
    """(g0, g1) such that, for u = 1 − p_hit^b in (0, 1], the fast backup wins iff g0 + u·g1 > 0."""
    E_n, T_n, E_f, T_f = neural.E_miss, neural.T_b, fast.E_miss, fast.T_b
    if miss_policy is MissPolicy.PER_ROW:
        N_n, N_f = p * E_hit + (1 - p) * E_n, p * E_hit + (1 - p) * E_f
        return M * (N_f - N_n), N_f * T_n - N_n * T_f
    a_n, a_f = E_hit - E_n, E_hit - E_f  # tokens lost per row when the batch falls back
    c_n, c_f = 1 + T_n - M, 1 + T_f - M  # time added to the round when it does
    return E_hit * (T_n - T_f) - M * (E_n - E_f), a_n * c_f - a_f * c_n


SETTLE_STEPS = 4096  # how far past the closed form's b* the boundary search may step


def critical_batch_size(
    p_hit: float,
    E_hit: float,
    T_p: float,
    neural: BackupOption,
    fast: BackupOption,
    b_max: int | None = None,
    miss_policy: MissPolicy | str = MissPolicy.PER_ROW,
) -> int | None:
    """b*: the smallest batch size at which the fast backup's Cor. 16 speedup beats the neural one's.

    None if it never does (or not by `b_max`). Our derivation, not the paper's. Write u = 1 − p_hit^b (the
    chance that some row misses), M = max(1, T_p), and for backup j = neural (n), fast (f) its tokens E_j
    and time T_j. The speedup of j is N_j / D_j; fast wins iff N_f·D_n − N_n·D_f > 0, which for both
    miss policies reduces to a condition linear in u, g(u) = g0 + u·g1 > 0:

    - per-row: N_j = p_hit·E_hit + (1 − p_hit)·E_j (independent of b), D_j = M + u·T_j, so
      g0 = M·(N_f − N_n), g1 = N_f·T_n − N_n·T_f.
    - whole-batch: N_j = E_hit − u·a_j with a_j = E_hit − E_j, D_j = M + u·c_j with c_j = 1 + T_j − M;
      N_f·D_n − N_n·D_f = u·[E_hit·(T_n − T_f) − M·(E_n − E_f)] + u²·(a_n·c_f − a_f·c_n), and
      dividing by u > 0 gives g0 = E_hit·(T_n − T_f) − M·(E_n − E_f), g1 = a_n·c_f − a_f·c_n.

    As b grows u rises from 1 − p_hit towards 1. "Wins" is by more than WIN_MARGIN, evaluated on the speedups
    themselves, so the b these give is then settled by evaluating them.
    - g(1 − p_hit) > 0: the fast backup already wins at b = 1 (or, where the speedups still tie in floating
      point at u a few ulps from 0, at the first b where they part).
    - otherwise, g1 ≤ 0: it never wins (g does not rise with u).
    - otherwise it wins once u > u* = −g0 / g1, i.e. p_hit^b < 1 − u*; never if u* ≥ 1, else
      b* = ⌊ln(1 − u*) / ln p_hit⌋ + 1.
    For p_hit = 1 (u ≡ 0: no row ever misses, a tie) and p_hit = 0 (u ≡ 1) the answer at b = 1 holds
    at every b. Typical per-row case: fast backup gives fewer tokens (g0 < 0) and is quicker (g1 > 0), so
    b* is finite; under whole-batch a fast backup that yields far fewer tokens may never win.
    """
    p = float(as_probability(p_hit, "p_hit"))
    b_max = None if b_max is None else int(as_int(b_max, "b_max", minimum=1))
    M = max(1.0, float(as_nonnegative(T_p, "T_p", " (cache-build time in units of one verify)")))
    E_hit = float(as_positive(E_hit, "E_hit", " (tokens per round after a hit)"))
    miss_policy = MissPolicy(miss_policy)
    g0, g1 = _fast_wins_line(p, E_hit, M, neural, fast, miss_policy)

    def wins(b: int) -> bool:
        return _fast_wins(p, E_hit, T_p, neural, fast, b, miss_policy)

    # Evaluate b = 1 directly rather than through g, so that near-ties agree with `backup_speedups`.
    if wins(1):
        b_star: int | None = 1
    elif p in (0.0, 1.0):  # u is constant
        b_star = None
    elif (line_wins_at_1 := g0 + (1.0 - p) * g1 > 0) or (g1 > 0 and g0 + g1 > 0):
        # The line says fast wins at b = 1 (yet the speedups, evaluated at u = 1 − p_hit a few ulps from 0
        # when p_hit is next to 1, still tie: found by Hypothesis), or from u* = −g0 / g1 on.
        b_star = 1 if line_wins_at_1 else math.floor(math.log(1.0 + g0 / g1) / math.log(p)) + 1
        if b_max is not None and b_star > b_max + 1:
            return None
        if b_star < 2**52:  # beyond that an off-by-one is below float resolution anyway
            # The logs round; settle the boundary by evaluating the speedups themselves.
            while b_star > 1 and wins(b_star - 1):
                b_star -= 1
            # Near a tie (g0 + g1 barely above 0) the evaluated speedups may never part as the formula says;
            # step up at most SETTLE_STEPS (and never past b_max) rather than for ever.
            last = b_star + SETTLE_STEPS if b_max is None else min(b_max + 1, b_star + SETTLE_STEPS)
            while not wins(b_star):
                b_star += 1
                if b_star > last:
                    return None
    else:  # g stays ≤ 0 for every u < 1
        b_star = None
    if b_star is not None and b_max is not None and b_star > b_max:
        return None
    return b_star
