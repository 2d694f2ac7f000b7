"""The round records, kept beside the decode loop: what the loop measured (engine.decode_loop) and what the
proposer reports of its own drafting (`Proposer.last_round`, engine.strategies.base.RoundTelemetry) become one
`RoundRecord` per prefill or round (engine.metrics).

A decode round's record is held until the next round has told how its outcome stood against the draft's
guesses (SSD: whether it was in the cache; SD and SSD: the bonus's rank), then handed on; `release` hands it
on with whatever it has been told so far (no next round will come).
"""

from __future__ import annotations

from collections.abc import Callable

from engine.metrics import RoundRecord
from engine.strategies.base import RoundTelemetry


class RoundRecorder:
    def __init__(self) -> None:
        self.records: list[RoundRecord] | None = None  # round records are kept here while this is a list
        self.on_record: Callable[[RoundRecord], None] | None = None  # and handed to this, once complete
        self.count = 0  # records made (prefills and rounds): the next one's `round`
        self._held: RoundRecord | None = None  # the last decode record, until the next round fills in its outcome

    @property
    def active(self) -> bool:
        """Whether anyone takes the records (kept in `records` or handed to `on_record`): the proposers measure
        what only the records report (each outcome's rank among the draft's guesses) only then."""
        return self.records is not None or self.on_record is not None

    def prefill(
        self,
        strategy: str,
        K: int,
        rows: int,
        tokens: int,
        verify_ms: float,
        draft_ms: float,
        round_ms: float,
        context_len: int = 0,
    ) -> None:
        """A prefill (chunk) of `rows` joining prompts, the longest slice `tokens` long, after `context_len`
        prompt tokens fed in earlier chunks (0 for a prompt prefilled whole)."""
        self._add(
            RoundRecord(
                strategy=strategy,
                round=self.count,
                batch_size=rows,
                K=K,
                context_len=context_len,
                accepted=[0] * rows,
                emitted=[1] * rows,
                draft_ms=draft_ms,
                verify_ms=verify_ms,
                round_ms=round_ms,
                draft_forwards=0,
                phase="prefill",
                tokens=tokens,
            )
        )

    def decode(
        self,
        strategy: str,
        K: int,
        context_len: int,
        accepted: list[int],
        emitted: list[int],
        verify_ms: float,
        round_ms: float,
        prompt_index: list[int],
        telemetry: RoundTelemetry,
    ) -> None:
        """A decode round over len(accepted) rows; `telemetry` is its proposer's own account of the drafting.
        The telemetry's outcome of the round before fills in that round's held record, which goes on."""
        t = telemetry
        record = RoundRecord(
            strategy=strategy,
            round=self.count,
            batch_size=len(accepted),
            K=K,
            context_len=context_len,
            accepted=accepted,
            emitted=emitted,
            draft_ms=t.draft_ms,
            verify_ms=verify_ms,
            round_ms=round_ms,
            draft_forwards=t.draft_forwards,
            hit=t.hit,
            cache_build_ms=t.cache_build_ms,
            branches=t.branches,
            backup=t.backup,
            wait_ms=t.draft_ms if t.hit is not None else None,
            fanout=t.fanout,
            backup_ms=t.backup_ms,
            prompt_index=prompt_index,
        )
        held = self._held
        if held is not None:
            if t.previous_outcome_hit is not None and held.hit is not None:
                held.outcome_hit = t.previous_outcome_hit
            if t.previous_outcome_rank is not None and len(t.previous_outcome_rank) == held.batch_size:
                held.outcome_rank = t.previous_outcome_rank
        self.release()
        self._add(record, hold=K > 0)

    def _add(self, record: RoundRecord, hold: bool = False) -> None:
        """Keep the record (in `records` at once) and hand it to `on_record`; with `hold`, only once the next
        round has told how its outcome stood against the draft's guesses (`release` forces it)."""
        self.count += 1
        if self.records is not None:
            self.records.append(record)
        if hold:
            self._held = record
        elif self.on_record is not None:
            self.on_record(record)

    def release(self) -> None:
        """Hand a held decode record to `on_record` now, with whatever it has been told so far."""
        held, self._held = self._held, None
        if held is not None and self.on_record is not None:
            self.on_record(held)
