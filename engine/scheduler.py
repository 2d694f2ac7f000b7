"""Admission: which waiting requests join the running batch at the next step.

First come, first served, within two limits: the most sequences in flight (`max_num_seqs`) and the most
prompt tokens prefilled in one step (`max_prefill_tokens`). A prompt longer than the prefill limit is
prefilled alone (it would otherwise never start). Requests join between rounds, so a long prefill delays
one round of the running sequences, not their whole generation.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from engine.sequence import Sequence


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int | None = None  # None: no limit (generate() runs all its prompts as one batch)
    max_prefill_tokens: int | None = None  # None: no limit
    max_waiting: int | None = None  # None: no limit; else submit() beyond it raises QueueFull

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_prefill_tokens", "max_waiting"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{name} must be an integer >= 1 (or None for no limit), got {value!r}")


class Scheduler:
    def __init__(self, config: SchedulerConfig):
        self.config = config
        self.waiting: deque[Sequence] = deque()

    def admit(self, running: int) -> list[Sequence]:
        """Pop the requests that join now, given `running` sequences in flight."""
        c = self.config
        joined: list[Sequence] = []
        tokens = 0
        while self.waiting:
            if c.max_num_seqs is not None and running + len(joined) >= c.max_num_seqs:
                break
            size = len(self.waiting[0].prompt_ids)
            if joined and c.max_prefill_tokens is not None and tokens + size > c.max_prefill_tokens:
                break
            joined.append(self.waiting.popleft())
            tokens += size
        return joined
