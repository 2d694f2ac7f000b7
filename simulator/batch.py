"""The running batch: sequences in flight, admission of waiting requests, and token emission.

The target owns the batch. Sequences advance in lockstep rounds; finished ones leave at the end of a
round and waiting requests join at its start (their prefill stalls the round, as without chunked prefill).
"""

from __future__ import annotations

import simpy

from simulator.metrics import Recorder
from simulator.workload import Request, RequestSource
from theory.latency import time_per_output_token


class Sequence:
    """A request being decoded. `from_cache`/`accepted`: source and k of its last verified speculation."""

    __slots__ = ("request", "remaining", "context", "from_cache", "accepted", "last_emit_ms", "tokens")

    def __init__(self, request: Request) -> None:
        self.request = request
        self.remaining = request.output_len  # None: never finishes
        self.context = request.prompt_len
        self.from_cache = False  # the first speculation of a sequence always comes from the backup
        self.accepted: int | None = None  # None until its first verify
        self.last_emit_ms = 0.0
        self.tokens = 0


class Batch:
    def __init__(
        self, env: simpy.Environment, max_batch: int, source: RequestSource, recorder: Recorder, closed_loop: bool
    ) -> None:
        self.env = env
        self.max_batch = max_batch
        self.seqs: list[Sequence] = []
        self.queue = simpy.Store(env)  # waiting requests (the arrivals process or a finished request fills it)
        self._source = source
        self._rec = recorder
        self._closed = closed_loop

    @property
    def context(self) -> int:
        seqs = self.seqs
        return seqs[0].context if len(seqs) == 1 else max(s.context for s in seqs)

    def take_waiting(self) -> list[Request]:
        """Requests that can join now (FIFO), up to the free slots."""
        free = self.max_batch - len(self.seqs)
        items = self.queue.items
        if free <= 0 or not items:
            return []
        taken, self.queue.items[:] = items[:free], items[free:]
        return taken

    def start(self, requests: list[Request]) -> list[Sequence]:
        """Prefill is done: the requests join and emit their first token now."""
        now = self.env.now
        new = [Sequence(r) for r in requests]
        for seq in new:
            seq.request.first_token_ms = seq.last_emit_ms = now
            self._rec.ttft_ms.append(now - seq.request.arrival_ms)
        self.seqs.extend(new)
        self._emitted(new, [1] * len(new))
        return new

    @property
    def can_admit(self) -> bool:
        """Waiting requests and a free slot, or nothing running at all (then wait for a request)."""
        return not self.seqs or (bool(self.queue.items) and len(self.seqs) < self.max_batch)

    def emit(self, accepted: list[int]) -> None:
        """End of a verify: sequence i gets accepted[i] + 1 tokens (fewer if it reaches its output length)."""
        hist, seqs = self._rec.accepted_hist, self.seqs
        emitted = []
        for seq, k in zip(seqs, accepted, strict=True):
            seq.accepted = k
            hist[k] += 1
            emitted.append(k + 1)
        self._emitted(seqs, emitted)

    def _emitted(self, seqs: list[Sequence], counts: list[int]) -> None:
        now, rec = self.env.now, self._rec
        finished = False
        for seq, n in zip(seqs, counts, strict=True):
            if seq.remaining is not None:
                n = min(n, seq.remaining)
                seq.remaining -= n
                finished = finished or seq.remaining == 0
            if seq.tokens:  # one chunk, one gap (the first token's latency is the TTFT, not an ITL)
                rec.itl_ms.append(now - seq.last_emit_ms)
            seq.tokens += n
            seq.context += n
            seq.last_emit_ms = now
            rec.tokens += n
        if finished:
            self._retire()

    def _retire(self) -> None:
        now, rec = self.env.now, self._rec
        keep = []
        for seq in self.seqs:
            if seq.remaining != 0:
                keep.append(seq)
                continue
            request = seq.request
            request.done_ms = now
            rec.completed += 1
            assert request.first_token_ms is not None, "a finished request has emitted its first token"
            ttft_ms, e2el_ms = request.first_token_ms - request.arrival_ms, now - request.arrival_ms
            rec.e2el_ms.append(e2el_ms)
            tpot_ms = time_per_output_token(ttft_ms, e2el_ms, seq.tokens)
            if tpot_ms is not None:
                rec.tpot_ms.append(tpot_ms)
            if self._closed:  # closed loop: the user sends the next request at once
                self.queue.put(self._source.next_request(now))
        self.seqs = keep
