"""Which backup to use on a cache miss, and the critical batch size b* (docs/ssd.md §6, Thm 17, Cor. 16).

A neural backup (the draft drafting K tokens just in time) gives more tokens per missed round but costs
T_SD; a fast backup (random tokens, prompt lookup) costs almost nothing but gives fewer tokens. At batch
b the whole batch waits for the backup unless all b sequences hit (Cor. 16), so the backup's latency
matters more as b grows. The paper's closed form for b* was not recovered; the one below is ours.
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
from theory.glossary import Backup
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
    p_hit: float, E_hit: float, T_p: float, options: Sequence[BackupOption], b: npt.ArrayLike
) -> FloatArray:
    """Cor. 16 SSD speedup for each backup at each batch size: shape [len(options), *shape(b)]."""
    if not options:
        raise ValueError("give at least one backup option")
    return np.stack(
        [np.asarray(ssd_speedup(p_hit, E_hit, o.E_miss, T_p, o.T_b, b), dtype=np.float64) for o in options]
    )


def best_backup(
    p_hit: float, E_hit: float, T_p: float, options: Sequence[BackupOption], b: npt.ArrayLike
) -> IntArray:
    """Index into `options` of the backup with the highest Cor. 16 speedup at each b (ties: first listed)."""
    return np.argmax(backup_speedups(p_hit, E_hit, T_p, options, b), axis=0)


def _fast_wins(p_hit: float, E_hit: float, T_p: float, neural: BackupOption, fast: BackupOption, b: int) -> bool:
    speeds = backup_speedups(p_hit, E_hit, T_p, [neural, fast], b)
    return bool(speeds[1] > speeds[0])


def critical_batch_size(
    p_hit: float,
    E_hit: float,
    T_p: float,
    neural: BackupOption,
    fast: BackupOption,
    b_max: int | None = None,
) -> int | None:
    """b*: the smallest batch size at which the fast backup's Cor. 16 speedup beats the neural one's.

    None if it never does (or not by `b_max`). Our derivation, not the paper's: write s = p_hit^b,
    M = max(1, T_p), N_j = p_hit·E_hit + (1 − p_hit)·E_miss_j and D_j = s·M + (1 − s)(1 + T_b_j) for
    j = neural (n), fast (f). Fast wins iff N_f·D_n > N_n·D_f, i.e. iff

        g(s) = G + s·(A − G) > 0,   A = M·(N_f − N_n),   G = N_f·(1 + T_b_n) − N_n·(1 + T_b_f),

    a condition linear in s. As b grows s falls from p_hit towards 0, so g moves from g(p_hit) to G.
    - g(p_hit) > 0: the fast backup already wins at b = 1.
    - otherwise, G ≤ 0: it never wins (g ≤ 0 on the whole segment).
    - otherwise (G > 0 ≥ g(p_hit)): it wins once s < s* = G / (G − A), i.e. for b > ln s* / ln p_hit, so
      b* = ⌊ln s* / ln p_hit⌋ + 1.
    For p_hit = 1 (s ≡ 1) the sign of A decides at every b, for p_hit = 0 (s ≡ 0) that of G.
    Typical: fast backup gives fewer tokens (A < 0) and is quicker (G > 0), so b* is finite.
    """
    p = float(as_probability(p_hit, "p_hit"))
    b_max = None if b_max is None else int(as_int(b_max, "b_max", minimum=1))
    M = max(1.0, float(as_nonnegative(T_p, "T_p", " (cache-build time in units of one verify)")))
    E_hit = float(as_positive(E_hit, "E_hit", " (tokens per round after a hit)"))
    N_n = p * E_hit + (1 - p) * neural.E_miss
    N_f = p * E_hit + (1 - p) * fast.E_miss
    A = M * (N_f - N_n)
    G = N_f * (1 + neural.T_b) - N_n * (1 + fast.T_b)

    # Evaluate b = 1 directly rather than through g, so that near-ties agree with `backup_speedups`.
    if _fast_wins(p, E_hit, T_p, neural, fast, 1):
        b_star: int | None = 1
    elif p in (0.0, 1.0) or G <= 0:  # s is constant, or g stays ≤ 0 as s falls
        b_star = None
    else:
        b_star = math.floor(math.log(G / (G - A)) / math.log(p)) + 1
        if b_max is not None and b_star > b_max + 1:
            return None
        if b_star < 2**52:  # beyond that an off-by-one is below float resolution anyway
            # The logs round; settle the boundary by evaluating the speedups themselves.
            while b_star > 1 and _fast_wins(p, E_hit, T_p, neural, fast, b_star - 1):
                b_star -= 1
            while not _fast_wins(p, E_hit, T_p, neural, fast, b_star):
                b_star += 1
    if b_star is not None and b_max is not None and b_star > b_max:
        return None
    return b_star
