"""How many tokens SD drafts next round: adaptive K from the past only (theory.adaptive).

Per row: forgotten acceptance counts (a round with k of K accepted adds k acceptances and, if k < K, one
rejection), whose Beta posterior mean is the row's α. Per proposer: an exponentially weighted mean of the
draft's time per forward, and of the verify's time per block width K + 1 (from the loop's measured verify
times); a width not yet seen is read off a straight line through the seen ones. The batch shares one K per
round (one target forward verifies every row): the K that maximises the batch's expected tokens per unit
time, Σ_b E(α_b, K) / (K·T_d + T_v(K + 1)).

Everything here is known before the round's draft starts, so the choice cannot bias the verifier
(docs/ssd.md §1: SD is exact for any proposal fixed before verification). With measured times the choice,
hence the seeded outputs, vary from run to run; `SpeculativeConfig.draft_cost` fixes T_d / T_v instead.
"""

from __future__ import annotations

import numpy as np

from engine.config import SpeculativeConfig
from theory.adaptive import acceptance_estimate, best_K, updated_counts, with_observations

TIMING_DECAY = 0.8  # weight of the past in the timing means
WARM_START = 16.0  # observations' worth of the pooled α a new row starts with
REFRESH = 20  # a neighbouring K whose time is older than this many rounds (SSD: builds) is measured again
PROBE = 2  # rounds such a K is run for
UNMEASURED_DRAFT_COST = 0.1  # T_d / T_v assumed before both times have been measured once


class Lookahead:
    def __init__(self, spec: SpeculativeConfig):
        self.spec = spec
        self.accepted = np.zeros(0)  # [B] forgotten acceptances per row
        self.rejected = np.zeros(0)  # [B] forgotten rejections per row
        self.draft_ms: float | None = None  # per draft forward
        self.verify_ms: dict[int, float] = {}  # block width K + 1 -> mean verify time
        self.pooled: tuple[float, float] | None = None  # every row's acceptances and rejections, forgotten alike
        self.n_verified = 0  # rounds verified so far
        self.verified_at: dict[int, int] = {}  # K -> n_verified when a round of K was last verified
        self.asked_at: dict[int, int] = {}  # K -> the count (`_stamps`) when `_refreshed` last asked for it
        self.probe: tuple[int, int] | None = None  # (K, rounds left) of a refresh under way

    def admit(self, n: int) -> None:
        """New rows start from the α of the rows before them (`pooled`), worth WARM_START observations, rather
        than from the prior's ½: from ½ a request spent its first ~10 rounds at K = 1 while its α was learnt."""
        if self.pooled is None:
            start = (0.0, 0.0)
        else:
            alpha = float(acceptance_estimate(*self.pooled))
            start = (alpha * WARM_START, (1.0 - alpha) * WARM_START)
        self.accepted = np.append(self.accepted, np.full(n, start[0]))
        self.rejected = np.append(self.rejected, np.full(n, start[1]))

    def retire(self, keep: list[int]) -> None:
        self.accepted, self.rejected = self.accepted[keep], self.rejected[keep]

    def alphas(self) -> np.ndarray:
        """[B] each row's running α."""
        return np.atleast_1d(acceptance_estimate(self.accepted, self.rejected))

    def choose(self) -> int:
        """K for the next round: the spec's K unless adaptive."""
        spec = self.spec
        if not spec.adaptive:
            return spec.K
        if spec.draft_cost is not None:
            draft, verify = spec.draft_cost, 1.0
        elif self.draft_ms is None or not self.verify_ms:
            draft, verify = UNMEASURED_DRAFT_COST, 1.0
        else:
            draft, verify = self.draft_ms, self._verify_ms
        return self._refreshed(best_K(self.alphas(), draft, verify, K_max=self._K_max(), K_min=spec.K_min))

    def _stamps(self) -> tuple[dict[int, int], int]:
        """When each K's time was last measured, and the count now (SD: its verify, counted in rounds)."""
        return self.verified_at, self.n_verified

    def _refreshed(self, K: int) -> int:
        """K, or once every REFRESH neighbour of K whose time was last measured longer ago than that, so that it
        is measured again (afresh: a time that old is dropped when it comes in). A K timed in a slow moment is
        otherwise never chosen, hence never timed, again: a HumanEval run (int4 target) timed SSD's K = 2 build
        at 172 ms early on, ran K = 1 from then on, and never saw K = 2 build in 115 (its rounds 23% faster per
        token than K = 1's); an SD run kept K = 2 on a stale 128 ms verify of width 4 (it was 108 by then)."""
        if self.spec.draft_cost is not None:
            return K
        if self.probe is not None:  # a probe lasts PROBE rounds: SSD's first build at a new length is not timed
            k, left = self.probe
            self.probe = (k, left - 1) if left > 1 else None
            return k
        stamps, now = self._stamps()
        K_max = self._K_max()
        stale = [
            k
            for k in (K - 1, K + 1)
            if self.spec.K_min <= k <= K_max and k in stamps and now - max(stamps[k], self.asked_at.get(k, 0)) > REFRESH
        ]
        if not stale:
            return K
        k = min(stale, key=stamps.get)
        self.asked_at[k] = now
        self.probe = (k, PROBE - 1) if PROBE > 1 else None
        return k

    def _K_max(self) -> int:
        """The longest K worth considering: one past the longest K verified, so K climbs a step at a time and
        each block width is timed before the next (past the widths measured the verify is read off a line, flat
        from one width, while on a CPU it grows with the block). With fixed times (`draft_cost`) nothing is
        measured and every K up to the spec's is open."""
        spec = self.spec
        if spec.draft_cost is not None:
            return spec.K
        known = max((width - 1 for width in self.verify_ms), default=spec.K_min)
        return max(spec.K_min, min(spec.K, known + 1))

    def _verify_ms(self, width: int) -> float:
        return read_off(self.verify_ms, width)

    def drafted(self, forwards: int, ms: float) -> None:
        if forwards:
            self.draft_ms = decayed_mean(self.draft_ms, ms / forwards)

    def observe(self, accepted: list[int], K: int, verify_ms: float) -> None:
        if self.n_verified - self.verified_at.get(K, self.n_verified) > REFRESH:  # an old time: start afresh
            self.verify_ms.pop(K + 1, None)
        self.n_verified += 1
        self.verified_at[K] = self.n_verified
        self.accepted, self.rejected = updated_counts(self.accepted, self.rejected, accepted, K)
        pooled = with_observations(*(self.pooled or (0.0, 0.0)), np.sum(accepted), np.sum(np.asarray(accepted) < K))
        self.pooled = (float(pooled[0]), float(pooled[1]))
        self.verify_ms[K + 1] = decayed_mean(self.verify_ms.get(K + 1), verify_ms)


def decayed_mean(old: float | None, new: float) -> float:
    """The exponentially weighted mean after `new` (TIMING_DECAY the weight of the past; `new` alone at first)."""
    return new if old is None else TIMING_DECAY * old + (1 - TIMING_DECAY) * new


def read_off(table: dict[int, float], x: int) -> float:
    """A measured time at x, or read off a straight line through the measured ones."""
    if x in table:
        return table[x]
    xs, times = zip(*sorted(table.items()), strict=False)
    if len(xs) == 1:
        return times[0]
    slope, intercept = np.polyfit(xs, times, 1)
    return max(float(slope * x + intercept), min(times))  # a line fitted on noise may dip below 0
