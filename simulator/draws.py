"""Per-round random outcomes, drawn fast: accepted counts (the verifier) and cache hits (the draft worker).

`TableDraws` samples from an acceptance model and a hit model. Uniforms are drawn from a seeded numpy
Generator in blocks and turned into outcomes for every source at once (common random numbers: two runs
that differ only in policy see the same luck), so a round costs a few list look-ups in Python.
`ReplayDraws` replays the outcomes of recorded engine rounds instead.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from simulator.acceptance import AcceptanceModel, HitModel, Source
from simulator.records import RoundRecord

BLOCK = 8192  # uniforms drawn per refill


class Draws(Protocol):
    def accepted(self, from_cache: list[bool]) -> list[int]:
        """k per sequence; `from_cache[i]`: sequence i's speculation came from the cache (else the backup)."""
        ...

    def hits(self, from_cache: list[bool], accepted: list[int]) -> list[bool]:
        """Whether each sequence's next speculation is in the cache, given this round's source and k."""
        ...


class TableDraws:
    """Outcomes sampled from the models' probability tables, one block of uniforms at a time."""

    def __init__(
        self,
        acceptance: AcceptanceModel,
        hits: HitModel | None,
        K: int,
        miss_source: Source,
        fanout: tuple[int, ...] | None,
        fanout_backup: tuple[int, ...] | None,
        rng: np.random.Generator,
    ) -> None:
        self._rng = rng
        self._cdf = {
            True: np.cumsum(acceptance.pmf(K, Source.CACHE)),
            False: np.cumsum(acceptance.pmf(K, miss_source)),
        }
        for cdf in self._cdf.values():
            cdf[-1] = 1.0  # rounding must not leave a gap above the last k
        self._hit_prob = None
        if hits is not None and fanout is not None:
            self._hit_prob = {
                True: hits.hit_prob(fanout, True).tolist(),
                False: hits.hit_prob(
                    fanout_backup or fanout, False, draft_sourced=miss_source is Source.DRAFT
                ).tolist(),
            }
        self._k_cache: list[int] = []
        self._k_miss: list[int] = []
        self._k_next = 0
        self._u_hit: list[float] = []
        self._h_next = 0

    def _refill_accepted(self) -> None:
        u = self._rng.random(BLOCK)
        # k = number of CDF steps at or below u: inverse-CDF sampling of both sources from one uniform
        self._k_cache = np.searchsorted(self._cdf[True], u, side="right").tolist()
        self._k_miss = np.searchsorted(self._cdf[False], u, side="right").tolist()
        self._k_next = 0

    def accepted(self, from_cache: list[bool]) -> list[int]:
        n = len(from_cache)
        if self._k_next + n > len(self._k_cache):
            self._refill_accepted()
        i = self._k_next
        self._k_next = i + n
        if n == 1:
            return [self._k_cache[i] if from_cache[0] else self._k_miss[i]]
        kc, km = self._k_cache, self._k_miss
        return [kc[i + j] if c else km[i + j] for j, c in enumerate(from_cache)]

    def hits(self, from_cache: list[bool], accepted: list[int]) -> list[bool]:
        if self._hit_prob is None:
            raise ValueError("SSD needs a hit model and a fan-out schedule")
        n = len(from_cache)
        if self._h_next + n > len(self._u_hit):
            self._u_hit = self._rng.random(BLOCK).tolist()
            self._h_next = 0
        i = self._h_next
        self._h_next = i + n
        u, prob = self._u_hit, self._hit_prob
        return [u[i + j] < prob[c][k] for j, (c, k) in enumerate(zip(from_cache, accepted, strict=True))]


class ReplayDraws:
    """Outcomes replayed from recorded rounds, in order, cycling at the end.

    Round i's accepted counts come from record i; the hits that decide round i+1's sources come from
    record i+1's `hit`. A simulated batch larger than a record's wraps around that record's sequences.
    """

    def __init__(self, records: list[RoundRecord]) -> None:
        rows = [r for r in records if r.is_decode]
        if not rows:
            raise ValueError("replay needs decode-phase records")
        self._accepted = [list(r.accepted) for r in rows]
        self._hit = [list(r.hit) if r.hit is not None else None for r in rows]
        self._k_row = 0
        self._h_row = 1 % len(rows)

    @staticmethod
    def _take(row: list, n: int) -> list:
        return row[:n] if n <= len(row) else [row[j % len(row)] for j in range(n)]

    def accepted(self, from_cache: list[bool]) -> list[int]:
        row = self._accepted[self._k_row]
        self._k_row = (self._k_row + 1) % len(self._accepted)
        return self._take(row, len(from_cache))

    def hits(self, from_cache: list[bool], accepted: list[int]) -> list[bool]:
        row = self._hit[self._h_row]
        self._h_row = (self._h_row + 1) % len(self._hit)
        if row is None:
            raise ValueError("replaying SSD needs SSD records (with 'hit'); these came from another strategy")
        return self._take(row, len(from_cache))
