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
from theory.adaptive import acceptance_estimate, best_K, updated_counts

TIMING_DECAY = 0.8  # weight of the past in the timing means
UNMEASURED_DRAFT_COST = 0.1  # T_d / T_v assumed before both times have been measured once


class Lookahead:
    def __init__(self, spec: SpeculativeConfig):
        self.spec = spec
        self.accepted = np.zeros(0)  # [B] forgotten acceptances per row
        self.rejected = np.zeros(0)  # [B] forgotten rejections per row
        self.draft_ms: float | None = None  # per draft forward
        self.verify_ms: dict[int, float] = {}  # block width K + 1 -> mean verify time

    def admit(self, n: int) -> None:
        self.accepted = np.append(self.accepted, np.zeros(n))
        self.rejected = np.append(self.rejected, np.zeros(n))

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
        return best_K(self.alphas(), draft, verify, K_max=spec.K, K_min=spec.K_min)

    def _verify_ms(self, width: int) -> float:
        if width in self.verify_ms:
            return self.verify_ms[width]
        widths, times = zip(*sorted(self.verify_ms.items()))
        if len(widths) == 1:
            return times[0]
        slope, intercept = np.polyfit(widths, times, 1)
        return max(float(slope * width + intercept), min(times))  # a line fitted on noise may dip below 0

    def drafted(self, forwards: int, ms: float) -> None:
        if forwards:
            self.draft_ms = _mean(self.draft_ms, ms / forwards)

    def observe(self, accepted: list[int], K: int, verify_ms: float) -> None:
        self.accepted, self.rejected = updated_counts(self.accepted, self.rejected, accepted, K)
        self.verify_ms[K + 1] = _mean(self.verify_ms.get(K + 1), verify_ms)


def _mean(old: float | None, new: float) -> float:
    return new if old is None else TIMING_DECAY * old + (1 - TIMING_DECAY) * new
