"""The draft worker's per-batch state (engine.ssd.draft_worker): its rows, in the target's order, and the
speculation it sent last with what building that speculation's cache needs."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from engine.sampling import Keys
from engine.sampling_params import SamplingParams
from engine.sparse import TopLogits


@dataclass
class Rows:
    """Per-row state of the batch the worker drafts for, in the target's row order."""

    seq_ids: list[int] = field(default_factory=list)
    contexts: list[list[int]] = field(default_factory=list)  # committed tokens (lookup backup)
    params: list[SamplingParams] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)  # each request's seed (keyed random numbers)

    def keep(self, rows: list[int]) -> Rows:
        return Rows(*([getattr(self, f)[i] for i in rows] for f in ("seq_ids", "contexts", "params", "seeds")))

    def __add__(self, other: Rows) -> Rows:
        return Rows(
            self.seq_ids + other.seq_ids,
            self.contexts + other.contexts,
            self.params + other.params,
            self.seeds + other.seeds,
        )

    def keys(self, rows: list[int] | None = None, ahead: list[int] | int = 0) -> Keys:
        """Keyed random numbers for these rows (default: all), at the position of each one's next token (the
        length of its committed context) plus `ahead`."""
        rows = range(len(self.seq_ids)) if rows is None else rows
        ahead = [ahead] * len(rows) if isinstance(ahead, int) else ahead
        positions = [len(self.contexts[b]) + a for b, a in zip(rows, ahead, strict=True)]
        return Keys.of([self.seeds[b] for b in rows], positions)


@dataclass
class Current:
    """The speculation last sent and what building its cache needs."""

    tokens: Tensor  # [n, K] x, on the worker's device
    listed: list[list[int]]  # x on the host
    ranking: TopLogits  # [n, K, M] the draft's best tokens at x's positions where known (worker's device)
    known: list[bool]  # rows whose ranking is known (hit or neural backup)
    sources: list[str]  # "hit" or the backup's name, per row
    tails: list[list[int]]  # tokens not yet fed to the draft, per row
