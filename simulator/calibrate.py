"""Acceptance and hit models measured from engine records: α by maximum likelihood, r by Def. 11's fit.

- α: each sequence-round is a run of Bernoulli(α) trials stopped at the first rejection or after K
  successes, so α̂ = accepted tokens / (accepted tokens + rejections), pooled over rounds (SD and SSD
  rounds whose speculation came from the draft or the cache; fast-backup rounds are left out).
- r and the scale: an SSD lookup after a round that accepted k used F_k guesses; the miss rate per F
  is fitted with theory.fit_r (needs at least 3 distinct fan-outs with misses). With fewer, the measured
  hit rate becomes a ConstantHit.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from itertools import pairwise

from simulator.acceptance import ConstantHit, IidAcceptance, PowerLawHit
from simulator.records import RoundRecord
from theory import fit_r
from theory.glossary import Backup, Strategy


@dataclass(frozen=True)
class Calibration:
    acceptance: IidAcceptance
    hits: PowerLawHit | ConstantHit | None
    rounds: int
    lookups: int
    miss_by_fanout: dict  # F -> (lookups, misses)


def _alpha(records: list[RoundRecord]) -> tuple[float, int]:
    accepted = rejections = rounds = 0
    for r in records:
        if r.strategy is Strategy.AR or not r.is_decode:
            continue
        for i, k in enumerate(r.accepted):
            from_fast_backup = r.hit is not None and not r.hit[i] and r.backup is not Backup.NEURAL
            if from_fast_backup:
                continue
            accepted += k
            rejections += k < r.K
            rounds += 1
    if accepted + rejections == 0:
        raise ValueError("no SD or SSD decode rounds to measure α from: record a speculative run")
    return accepted / (accepted + rejections), rounds


def _lookups(records: list[RoundRecord]) -> dict[int, list[int]]:
    """F -> [lookups, misses], pairing round T's k with round T+1's hit for the same batch position."""
    counts: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for before, after in pairwise(records):
        same_run = (
            before.batch_size == after.batch_size
            and after.context_len >= before.context_len
            and before.fanout == after.fanout
        )
        both_ssd = before.strategy is after.strategy is Strategy.SSD and before.is_decode and after.is_decode
        if not (same_run and both_ssd):
            continue
        if after.fanout is None or after.hit is None:  # no cache was looked up (a record without them)
            continue
        if len(after.fanout) != before.K + 1:  # adaptive K: not a cache built for `before`'s outcomes
            continue
        for k, hit in zip(before.accepted, after.hit, strict=True):
            F = after.fanout[k]  # the schedule `before`'s outcome was looked up with (simulator.records)
            counts[F][0] += 1
            counts[F][1] += not hit
    return dict(counts)


def calibrate(records: list[RoundRecord]) -> Calibration:
    """Measured α, and the miss model when the records hold SSD rounds."""
    alpha, rounds = _alpha(records)
    counts = _lookups(records)
    lookups = sum(n for n, _ in counts.values())
    hits: PowerLawHit | ConstantHit | None = None
    usable = {F: (n, m) for F, (n, m) in counts.items() if F >= 1 and m > 0}
    if len(usable) >= 3:
        fit = fit_r(list(usable), [m / n for n, m in usable.values()])
        if fit.r > 0:
            hits = PowerLawHit(fit.r, fit.scale)
    if hits is None and lookups:
        hits = ConstantHit(1 - sum(m for _, m in counts.values()) / lookups)
    return Calibration(IidAcceptance(alpha), hits, rounds, lookups, counts)
