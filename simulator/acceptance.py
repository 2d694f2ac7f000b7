"""Acceptance and hit models: how many draft tokens a round accepts, and whether the cache holds the outcome.

Each model is a small frozen dataclass that turns a policy into probability tables; simulator.draws
samples from the tables. Where a speculation came from decides its acceptance (`Source`): the SSD cache,
the draft model itself (SD, and SSD's neural backup), or a fast backup (random tokens, prompt lookup).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Protocol

import numpy as np

from theory.glossary import Backup
from theory.powerlaw import miss_rate


class Source(str, Enum):
    """Who produced the speculation being verified."""

    CACHE = "cache"  # SSD hit: pre-drafted during the previous verify
    DRAFT = "draft"  # the draft model just in time: SD, or SSD's neural backup
    RANDOM = "random"
    LOOKUP = "lookup"

    @staticmethod
    def of_backup(backup: Backup) -> Source:
        if backup is Backup.AUTO:
            raise ValueError("backup 'auto' must be resolved to neural, random or lookup before simulating")
        return {Backup.NEURAL: Source.DRAFT, Backup.RANDOM: Source.RANDOM, Backup.LOOKUP: Source.LOOKUP}[backup]


def _check_alpha(name: str, alpha: float | None, optional: bool = True) -> None:
    if alpha is None and optional:
        return
    if alpha is None or not 0 <= alpha <= 1:
        raise ValueError(f"{name} is a per-token acceptance rate and must lie in [0, 1]; got {alpha!r}")


def truncated_geometric(alpha: float, K: int) -> np.ndarray:
    """P(k accepted), k = 0..K, when each draft token is accepted independently with rate α."""
    return position_pmf([alpha] * K, K)


def position_pmf(alphas: list[float] | tuple[float, ...], K: int) -> np.ndarray:
    """P(k accepted), k = 0..K, when position i (1-based) is accepted with rate α_i given all before it were."""
    pmf = np.zeros(K + 1)
    survive = 1.0
    for k in range(K):
        pmf[k] = survive * (1.0 - alphas[k])
        survive *= alphas[k]
    pmf[K] = survive
    return pmf


class AcceptanceModel(Protocol):
    def pmf(self, K: int, source: Source) -> np.ndarray:
        """P(k draft tokens accepted), k = 0..K, for a speculation from `source`."""
        ...


@dataclass(frozen=True)
class IidAcceptance:
    """i.i.d. per-token acceptance (Leviathan et al.): rate `alpha` for the draft model's tokens.

    `alpha_cache`: for speculations from the SSD cache (None: same as `alpha`; lower under Saguaro C < 1).
    `alpha_lookup`: prompt-lookup backup (must be given to simulate that backup); random tokens: `alpha_random`.
    """

    alpha: float
    alpha_cache: float | None = None
    alpha_random: float = 0.0
    alpha_lookup: float | None = None

    def __post_init__(self) -> None:
        _check_alpha("alpha", self.alpha, optional=False)
        for name in ("alpha_cache", "alpha_random", "alpha_lookup"):
            _check_alpha(name, getattr(self, name))

    def rate(self, source: Source) -> float:
        if source is Source.CACHE:
            return self.alpha if self.alpha_cache is None else self.alpha_cache
        if source is Source.RANDOM:
            return self.alpha_random
        if source is Source.LOOKUP:
            if self.alpha_lookup is None:
                raise ValueError("the lookup backup needs its acceptance rate: set alpha_lookup (--alpha-lookup)")
            return self.alpha_lookup
        return self.alpha

    def pmf(self, K: int, source: Source) -> np.ndarray:
        return truncated_geometric(self.rate(source), K)


@dataclass(frozen=True)
class PerPositionAcceptance:
    """Acceptance that changes along the speculation: position i is accepted with `alphas[i-1]` given the rest.

    Measured per-position rates usually fall with i. `alphas_cache` (None: same) for cache speculations;
    fast backups keep i.i.d. rates (`alpha_random`, `alpha_lookup`), unless `alphas_lookup` gives the lookup's
    own per-position rates: a looked-up continuation tends to hold for all K or fail at once (the default
    pair's lookup at K 4 took all four in 38% of its rounds, where i.i.d. at its α gives 13%).
    """

    alphas: tuple[float, ...]
    alphas_cache: tuple[float, ...] | None = None
    alpha_random: float = 0.0
    alpha_lookup: float | None = None
    alphas_lookup: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if not self.alphas:
            raise ValueError("alphas needs one acceptance rate per draft position (at least one)")
        for i, a in enumerate(self.alphas + (self.alphas_cache or ())):
            _check_alpha(f"alphas[{i}]", a, optional=False)
        if self.alphas_cache is not None and len(self.alphas_cache) != len(self.alphas):
            raise ValueError("alphas_cache must have as many positions as alphas")
        _check_alpha("alpha_random", self.alpha_random)
        _check_alpha("alpha_lookup", self.alpha_lookup)
        for i, a in enumerate(self.alphas_lookup or ()):
            _check_alpha(f"alphas_lookup[{i}]", a, optional=False)

    def pmf(self, K: int, source: Source) -> np.ndarray:
        if source is Source.LOOKUP and self.alphas_lookup:
            last = self.alphas_lookup[-1]  # positions beyond the measured ones keep the last measured rate
            return position_pmf(tuple(self.alphas_lookup) + (last,) * max(0, K - len(self.alphas_lookup)), K)
        if source in (Source.RANDOM, Source.LOOKUP):
            rate = IidAcceptance(0.0, alpha_random=self.alpha_random, alpha_lookup=self.alpha_lookup).rate(source)
            return truncated_geometric(rate, K)
        alphas = self.alphas_cache if source is Source.CACHE and self.alphas_cache else self.alphas
        if K > len(alphas):
            raise ValueError(f"K = {K} needs {K} per-position rates; only {len(alphas)} given")
        return position_pmf(alphas, K)


class HitModel(Protocol):
    def hit_prob(self, fanout: tuple[int, ...], from_cache: bool, draft_sourced: bool = True) -> np.ndarray:
        """P(the next speculation is in the cache | k accepted now), k = 0..K.

        `fanout` is the schedule used while verifying this round (F^p after a hit, F^b after a backup round).
        `draft_sourced` is False when this round's speculation came from a fast backup (random tokens, prompt
        lookup): a token it proposed and the target rejected was not the draft's first choice.
        """
        ...


@dataclass(frozen=True)
class ConstantHit:
    """Every outcome is in the cache with the same probability, independently: the closed forms' assumption."""

    p_hit: float
    p_hit_backup: float | None = None  # after a backup round (None: same)

    def __post_init__(self) -> None:
        for name in ("p_hit", "p_hit_backup"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= 1:
                raise ValueError(f"{name} is a probability and must lie in [0, 1]; got {value!r}")

    def hit_prob(self, fanout: tuple[int, ...], from_cache: bool, draft_sourced: bool = True) -> np.ndarray:
        p = self.p_hit if from_cache or self.p_hit_backup is None else self.p_hit_backup
        return np.full(len(fanout), p)


@dataclass(frozen=True)
class PowerLawHit:
    """Def. 11: with F_k guesses for outcome k the bonus is missed with probability min(1, a·F_k^(−r)).

    `r`, `scale` for rounds verifying a cache speculation; `r_backup`, `scale_backup` (None: same) after a
    backup round, whose acceptance (and so bonus distribution) differs.
    """

    r: float
    scale: float = 1.0
    r_backup: float | None = None
    scale_backup: float | None = None

    def __post_init__(self) -> None:
        for name in ("r", "scale", "r_backup", "scale_backup"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0 (power law miss ≈ scale·F^(−r)); got {value!r}")

    def hit_prob(self, fanout: tuple[int, ...], from_cache: bool, draft_sourced: bool = True) -> np.ndarray:
        r = self.r if from_cache or self.r_backup is None else self.r_backup
        scale = self.scale if from_cache or self.scale_backup is None else self.scale_backup
        return 1.0 - np.asarray(miss_rate(np.asarray(fanout, dtype=float), r, scale), dtype=float)


@dataclass(frozen=True)
class Replay:
    """Replay the accepted counts and hits of recorded engine rounds (simulator.records) instead of sampling."""

    records: tuple  # tuple[RoundRecord, ...], decode rounds in order

    def __post_init__(self) -> None:
        if not any(getattr(r, "is_decode", False) for r in self.records):
            raise ValueError("Replay needs at least one decode-phase record (read them with read_records)")
