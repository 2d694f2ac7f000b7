"""What a strategy is to the decode loop: a proposer of K draft tokens per running sequence.

The loop (engine.decode_loop) owns the target, the batch and every token emitted; a proposer only answers
"what are the next K tokens of each row, and from which q were they drawn?" and hears the outcome. AR
proposes nothing (K = 0: verification is then a plain sampling step), SD drafts in the target's process,
SSD asks its draft worker. Rows are in the loop's order: `admit` appends, `retire` keeps a subset in order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from torch import Tensor

from engine.checks import Checks
from engine.sampling import RowSampling
from engine.sequence import Sequence
from engine.sparse import SparseQ
from engine.verifier import Verification


@dataclass
class Proposal:
    """K draft tokens per row and the distribution each was drawn from: what verification needs."""

    tokens: Tensor  # [B, K] x
    q: Tensor | SparseQ  # [B, K, V], as its support where narrow (a greedy draft's point masses)


@dataclass
class RoundTelemetry:
    """What drafting a round cost and how it went, as the proposer saw it: the loop's recorder reads it after
    the round (`Proposer.last_round`) into the round's record (engine.metrics.RoundRecord, same field names)."""

    draft_ms: float = 0.0  # drafting on the critical path (SSD: the wait for the worker's answer)
    draft_forwards: int = 0  # draft forwards on the critical path
    # SSD only
    hit: list[bool] | None = None  # per row: the speculation came from the cache
    cache_build_ms: float | None = None  # the worker's build of the cache that was just looked up
    branches: int | None = None
    backup: str | None = None  # the backup(s) used for the missed rows
    backup_ms: float | None = None  # the backup's own drafting time (part of draft_ms)
    fanout: list[int] | None = None
    previous_outcome_hit: list[bool | None] | None = None  # per row of the last round: its outcome was cached
    # SD and SSD: per row of the last round, the rank of its bonus among the draft's guesses (None: unknown)
    previous_outcome_rank: list[int | None] | None = None


class Proposer(Protocol):
    name: str  # "ar", "sd" or "ssd": what the round records say
    K: int
    last_round: RoundTelemetry  # the telemetry of the last `propose`

    # What `propose` raises when the proposer is lost; () when it cannot be. A proposer that can be lost also
    # has `fallback(err, what) -> Proposer`: it stops, and returns the proposer that takes its rows over.
    @property
    def faults(self) -> tuple[type[Exception], ...]: ...

    def admit(self, seqs: list[Sequence]) -> None:
        """Rows joining at the end of the batch; each one's newest output token is not yet verified-fed."""

    def prefetch(self, seqs: list[Sequence]) -> None:
        """Prompts the target is about to prefill (they join with `admit` after, unless they finish at once)."""

    def retire(self, keep: list[int]) -> None:
        """Only these rows (indices into the current batch, increasing) go on."""

    def propose(self, rows: RowSampling, checks: Checks | None = None) -> Proposal:
        """The next speculation for every row; sets `last_round` (raises one of `faults`). Its input checks may
        go to `checks`, which the loop reads with the round's outcome."""

    def observe(self, result: Verification, verify_ms: float) -> None:
        """The outcome (k, t*) of the speculation just verified (read on the host already: `result.host()`). Times
        measured on the device during `propose` are read here, and go into `last_round` before it is recorded."""

    def close(self) -> None:
        """Free what the proposer started."""
