"""Admission: which waiting requests join the running batch at the next step.

First come, first served, within two limits: the most sequences in flight (`max_num_seqs`) and the most
prompt tokens prefilled in one step (`max_prefill_tokens`). A group of prompts that fits the prefill budget is
prefilled in one step; a prompt longer than the budget is admitted alone and prefilled in chunks of at most that
many tokens, one chunk a step between the rounds of the running sequences (engine.decode_loop), so a long
prompt delays each round by at most one chunk, however long it is.

Memory adds limits, `MemoryLimit`s: SSD's draft worker (a speculation cache per sequence) and a budget for the
target's KV cache (engine.llm's kv_cache_memory). A request joins only if the memory it would take under each (at
its full length, prompt + max_new_tokens) still fits beside the sequences in flight; one sequence always may run,
alone.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from engine.sequence import Sequence

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int | None = None  # None: no limit (generate() runs all its prompts as one batch)
    max_prefill_tokens: int | None = None  # prompt tokens fed a step (chunked prefill); None: no limit
    max_waiting: int | None = None  # None: no limit; else submit() beyond it (and the free rows) raises QueueFull

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_prefill_tokens", "max_waiting"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{name} must be an integer >= 1 (or None for no limit), got {value!r}")


@dataclass(frozen=True)
class MemoryLimit:
    """Memory that sequences in flight may take together, and what one takes (engine.ssd.memory)."""

    available_bytes: int
    bytes_per_sequence: Callable[[Sequence], int]
    what: str  # who holds that memory, for the log line

    def __post_init__(self) -> None:
        if self.available_bytes < 1:
            raise ValueError(f"available_bytes must be >= 1, got {self.available_bytes}")


class Scheduler:
    def __init__(self, config: SchedulerConfig):
        self.config = config
        self.waiting: deque[Sequence] = deque()
        self.limits: list[MemoryLimit] = []
        self.held: list[Sequence] = []  # admitted under the memory limits, counted until they finish
        self.held_back = False  # memory has kept a request waiting (said once in the log)

    @property
    def memory(self) -> MemoryLimit | None:
        """The first memory limit (None: none)."""
        return self.limits[0] if self.limits else None

    def limit_by_memory(self, limit: MemoryLimit) -> None:
        """One more limit a request must fit beside the sequences in flight (SSD's worker, the target's KV cache)."""
        self.limits.append(limit)

    def admit(self, running: int) -> list[Sequence]:
        """Pop the requests that join now, given `running` sequences in flight."""
        if not self.waiting:  # the steady state: nothing to weigh against the memory limits
            return []
        c = self.config
        joined: list[Sequence] = []
        tokens = 0
        if self.limits:
            self.held = [s for s in self.held if not s.finished]
            used = [sum(m.bytes_per_sequence(s) for s in self.held) for m in self.limits]
        while self.waiting:
            if c.max_num_seqs is not None and running + len(joined) >= c.max_num_seqs:
                break
            if self.limits:
                need = [m.bytes_per_sequence(self.waiting[0]) for m in self.limits]
                over = [i for i, m in enumerate(self.limits) if used[i] + need[i] > m.available_bytes]
                if running + len(joined) > 0 and over:  # alone, it may run
                    i = over[0]
                    self._say_held_back(self.limits[i], running + len(joined), used[i] + need[i])
                    break
                used = [u + n for u, n in zip(used, need, strict=True)]
            size = len(self.waiting[0].prompt_ids)
            if joined and c.max_prefill_tokens is not None and tokens + size > c.max_prefill_tokens:
                break
            joined.append(self.waiting.popleft())
            tokens += size
        if self.limits:
            self.held += joined
        return joined

    def _say_held_back(self, limit: MemoryLimit, in_flight: int, need: int) -> None:
        if self.held_back:
            return
        self.held_back = True
        wanted = self.config.max_num_seqs
        log.warning(
            "memory holds admission at %d sequences in flight (max_num_seqs: %s): one more would need "
            "about %.2f GiB for %s, over the %.2f GiB it may take; the rest wait their turn",
            in_flight,
            "unlimited" if wanted is None else wanted,
            need / 2**30,
            limit.what,
            limit.available_bytes / 2**30,
        )
