"""The actors, as SimPy processes: the target (AR decoder or verifier), the draft worker, arrivals.

Messages between target and draft go over two `Link`s: the target sends the verified batch (the outcome,
each sequence carrying its accepted k), the draft answers with the next speculation (each sequence
carrying where it came from: cache or backup). A round is one target forward. In SSD the target also
announces the prompts it is about to prefill (`PrefillAhead`, the engine's Prefill message), so that the
worker prefills their draft side meanwhile; it sends no answer.
"""

from __future__ import annotations

import simpy

from simulator.batch import Batch
from simulator.draws import Draws
from simulator.link import Link
from simulator.metrics import Recorder
from simulator.timing import TimingModel
from simulator.workload import Request, RequestSource
from theory.glossary import Backup, MissPolicy, Strategy

PROMPT_TOKEN_BYTES = 8  # the engine sends a Prefill's prompts as int64 ids (engine/ssd/messages.py)


class PrefillAhead:
    """The target prefills these requests now: the SSD worker prefills their draft side meanwhile."""

    __slots__ = ("requests",)

    def __init__(self, requests: list[Request]) -> None:
        self.requests = requests


class Testbed:
    """What the actors share: the clock, the models, the channels, the batch and the recorder."""

    def __init__(
        self,
        env: simpy.Environment,
        *,
        strategy: Strategy,
        K: int,
        backup: Backup,
        budget: int,
        budget_backup: int,
        miss_policy: MissPolicy,
        timing: TimingModel,
        draws: Draws,
        batch: Batch,
        recorder: Recorder,
        to_draft: Link,
        to_target: Link,
        spec_bytes_per_seq: float,
        outcome_bytes_per_seq: float,
        max_rounds: int,
        max_requests: int | None,
        prefill_ahead: bool = False,
    ) -> None:
        self.env, self.strategy, self.K, self.backup = env, strategy, K, backup
        self.budget, self.budget_backup, self.miss_policy = budget, budget_backup, miss_policy
        self.timing, self.draws, self.batch, self.rec = timing, draws, batch, recorder
        self.to_draft, self.to_target = to_draft, to_target
        self.spec_bytes, self.outcome_bytes = spec_bytes_per_seq, outcome_bytes_per_seq
        self.max_rounds, self.max_requests = max_rounds, max_requests
        self.prefill_ahead = prefill_ahead  # SSD: announce each prefill to the worker (the engine's Prefill)
        self._overhead_ms: dict[int, float] = {}  # batch size -> the engine's host work a round outside the forwards
        self.done = env.event()
        self._last_round_end_ms = 0.0

    def overhead_ms(self, batch: int) -> float:
        """The round's time outside its forwards at this batch size (the timing's, kept per size)."""
        ms = self._overhead_ms.get(batch)
        if ms is None:
            ms = self._overhead_ms[batch] = self.timing.overhead_ms(self.strategy, batch)
        return ms

    def end_round(self, n_seqs: int) -> None:
        rec, now = self.rec, self.env.now
        rec.rounds += 1
        rec.occupancy_ms += n_seqs * (now - self._last_round_end_ms)
        self._last_round_end_ms = now
        if rec.rounds >= self.max_rounds or (self.max_requests is not None and rec.completed >= self.max_requests):
            if not self.done.triggered:
                self.done.succeed()


def prefill_shape(requests: list[Request]) -> tuple[int, int]:
    """(tokens, cached) the joiners' prefill is timed at: the longest prompt, padded as the batch's forward is,
    and the fewest prompt tokens any of them found in the prefix cache."""
    return max(r.prompt_len for r in requests), min(r.cached for r in requests)


def admit(env: simpy.Environment, bed: Testbed):
    """Let waiting requests join (waiting for one if nothing runs) and prefill them on the target."""
    batch, rec = bed.batch, bed.rec
    if not batch.seqs and not batch.queue.items:
        idle_from_ms = env.now
        request = yield batch.queue.get()
        batch.queue.items.insert(0, request)  # back to the head of the queue, to join with the rest
        rec.target["idle"] += env.now - idle_from_ms
    requests = batch.take_waiting()
    start_ms = env.now
    if bed.prefill_ahead:  # engine/decode_loop.py `_prefill`: the Prefill goes out before the target's forward
        bed.to_draft.send(PrefillAhead(requests), PROMPT_TOKEN_BYTES * sum(r.prompt_len for r in requests))
    prefill_ms = bed.timing.prefill_ms(bed.strategy, len(requests), *prefill_shape(requests))
    yield env.timeout(prefill_ms)
    rec.target["prefill"] += prefill_ms
    rec.span("target", "prefill", start_ms, env.now)
    batch.start(requests)


def admit_once(env: simpy.Environment, bed: Testbed):
    """Called when `batch.can_admit`: one prefill between rounds, as in the engine's loop (engine/decode_loop.py
    `step`: after a prefill the next step runs a round before it admits again), so requests that arrive during
    a prefill wait for the round; when nothing runs, prefill until something does (waiting for requests)."""
    yield from admit(env, bed)
    while not bed.batch.seqs:  # every joiner finished at its first token
        yield from admit(env, bed)


def ar_decoder(env: simpy.Environment, bed: Testbed):
    """Autoregressive decoding: one target forward per token per sequence."""
    batch, rec, timing = bed.batch, bed.rec, bed.timing
    while True:
        if batch.can_admit:
            yield from admit_once(env, bed)
        seqs = batch.seqs
        start_ms = env.now
        forward_ms = timing.verify_ms(len(seqs), 1, batch.context)
        overhead_ms = bed.overhead_ms(len(seqs))
        yield env.timeout(forward_ms + overhead_ms)
        rec.target["verify"] += forward_ms
        rec.target["overhead"] += overhead_ms
        rec.span("target", "decode", start_ms, env.now)
        n = len(seqs)
        batch.emit([0] * n)
        bed.end_round(n)


def verifier(env: simpy.Environment, bed: Testbed):
    """The target in SD and SSD: send the outcome, wait for a speculation, verify K+1 positions."""
    batch, rec, verify_ms, draws = bed.batch, bed.rec, bed.timing.verify_ms, bed.draws
    tokens, overhead_at, target = bed.K + 1, bed.overhead_ms, rec.target
    send, receive, timeout = bed.to_draft.send, bed.to_target.receive, env.timeout
    while True:
        if batch.can_admit:
            yield from admit_once(env, bed)
        seqs = batch.seqs
        n = len(seqs)
        sent_ms = env.now
        send(seqs, bed.outcome_bytes * n)
        yield receive()
        start_ms = env.now
        target["wait_draft"] += start_ms - sent_ms
        forward_ms = verify_ms(n, tokens, batch.context)
        overhead_ms = overhead_at(n)
        yield timeout(forward_ms + overhead_ms)
        target["verify"] += forward_ms
        target["overhead"] += overhead_ms
        if rec.spans is not None:
            rec.span("target", "wait_draft", sent_ms, start_ms)
            rec.span("target", "verify", start_ms, env.now)
        batch.emit(draws.accepted([s.from_cache for s in seqs]))
        bed.end_round(n)


def sd_draft_worker(env: simpy.Environment, bed: Testbed):
    """Synchronous SD: after each outcome, draft K tokens for every sequence, then hand them over.

    The first draft step is two tokens wide when some sequence accepted all K: it feeds x_K and the bonus."""
    timing, rec, K = bed.timing, bed.rec, bed.K
    while True:
        seqs = yield bed.to_draft.receive()
        start_ms = env.now
        first_width = 2 if any(s.accepted == K for s in seqs) else 1
        draft_ms = timing.draft_ms(len(seqs), K, bed.batch.context, first_width)
        yield env.timeout(draft_ms)
        rec.draft["draft"] += draft_ms
        rec.span("draft", "draft", start_ms, env.now)
        bed.to_target.send(seqs, bed.spec_bytes * len(seqs))


def cache_lookup(seqs: list, draws: Draws, rec: Recorder) -> int:
    """Mark each sequence's next speculation as a hit or a miss; return the number of misses.

    A sequence verified before looks up the cache (the hit model decides); a new one has no cache yet.
    `hits_by_k` counts lookups that found the outcome, even if the whole-batch miss policy then drops them.
    """
    if len(seqs) == 1:  # the common case at batch 1, without the list building below
        seq = seqs[0]
        if seq.accepted is None:
            seq.from_cache = False
            return 1
        hit = draws.hits([seq.from_cache], [seq.accepted])[0]
        (rec.hits_by_k if hit else rec.misses_by_k)[seq.accepted] += 1
        seq.from_cache = hit
        return 0 if hit else 1
    looked_up = [s for s in seqs if s.accepted is not None]
    hits = draws.hits([s.from_cache for s in looked_up], [s.accepted for s in looked_up]) if looked_up else []
    for seq, hit in zip(looked_up, hits, strict=True):
        (rec.hits_by_k if hit else rec.misses_by_k)[seq.accepted] += 1
        seq.from_cache = hit
    for seq in seqs:
        if seq.accepted is None:
            seq.from_cache = False
    return len(seqs) - sum(hits)


def ssd_draft_worker(env: simpy.Environment, bed: Testbed):
    """Asynchronous SSD: build the cache while the target verifies; on a hit the next speculation is ready.

    A miss is known as soon as the outcome arrives (the cache keys are chosen before the tree decode).
    What happens then is the miss policy's:
    - PER_ROW (this engine): the build runs to its end, the hit rows take their cached branches and the
      missed rows share one backup; a round takes max(T_v, T_build) + [any miss]·T_backup.
    - WHOLE_BATCH (the reference engine): a miss in any row abandons what is left of the build and the
      backup drafts every row, so none keeps its hit; such a round takes T_v + T_backup.

    Joiners' prompts go through the draft before their first speculation. With the engine's Prefill message
    (`bed.prefill_ahead`) the worker reads it when it is done with the message before, so after the build
    that runs at that time (engine/ssd/process.py `serve` handles one message at a time), and prefills while
    the target does; the round that brings the joiners then pays only their backup. Without it (engines
    before the message) the worker prefills them when that round arrives, then drafts their backup.
    """
    timing, rec, draws, K, backup = bed.timing, bed.rec, bed.draws, bed.K, bed.backup
    draft, tracing = rec.draft, rec.spans is not None
    send, receive, cache_build_ms = bed.to_target.send, bed.to_draft.receive, timing.cache_build_ms
    whole_batch = bed.miss_policy is MissPolicy.WHOLE_BATCH
    building, build_start_ms, build_end_ms = None, 0.0, 0.0
    prefilled: set[int] = set()  # ids of the requests of the last Prefill, whose draft side is ready

    def draft_prefill(requests: list[Request]):
        start_ms = env.now
        prefill_ms = timing.draft_prefill_ms(len(requests), *prefill_shape(requests))
        yield env.timeout(prefill_ms)
        draft["prefill"] += prefill_ms
        if tracing:
            rec.span("draft", "prefill", start_ms, env.now)

    while True:
        message = yield receive()
        if isinstance(message, PrefillAhead):
            if building is not None:  # read once the build is done, as the engine's worker reads messages
                if env.now < build_end_ms:
                    yield building
                draft["cache_build"] += build_end_ms - build_start_ms
                if tracing:
                    rec.span("draft", "cache_build", build_start_ms, build_end_ms)
                building = None
            yield from draft_prefill(message.requests)
            prefilled = {id(r) for r in message.requests}  # a later Prefill replaces it, as in the engine
            continue
        seqs = message
        arrived_ms = env.now
        n = len(seqs)
        joiners = [s.request for s in seqs if s.accepted is None and id(s.request) not in prefilled]
        if prefilled:
            prefilled = set()  # announced prompts that did not join are dropped with this round
        missed = cache_lookup(seqs, draws, rec)
        rec.batch_lookups += 1
        if missed == 0:
            rec.batch_all_hit += 1
        abandon = whole_batch and missed > 0
        if building is not None:
            if abandon:
                end_ms = min(arrived_ms, build_end_ms)
            else:
                if arrived_ms < build_end_ms:
                    yield building  # the cache build outlasts the verify: the round stretches
                end_ms = build_end_ms
            draft["cache_build"] += end_ms - build_start_ms
            if tracing:
                rec.span("draft", "cache_build", build_start_ms, end_ms)
        if abandon:  # the build that held the hit rows' branches is gone: every row gets the backup
            for seq in seqs:
                seq.from_cache = False
            missed = n
        context = bed.batch.context
        if joiners:  # not prefilled ahead: the joiners' prompts through the draft now, before their backup
            yield from draft_prefill(joiners)
        if missed:
            start_ms = env.now
            # the engine's neural backup drafts the whole batch in one pass (hit rows masked, engine/ssd/
            # draft_worker.py), so its cost follows the batch, not the number of misses
            rows = n if backup is Backup.NEURAL else missed
            backup_ms = timing.backup_ms(backup, rows, K, context)
            yield env.timeout(backup_ms)
            draft["backup"] += backup_ms
            if tracing:
                rec.span("draft", "backup", start_ms, env.now)
        send(seqs, bed.spec_bytes * n)
        branches = (n - missed) * bed.budget + missed * bed.budget_backup
        build_ms = cache_build_ms(n, K, branches, context)
        build_start_ms = env.now
        build_end_ms = build_start_ms + build_ms
        building = env.timeout(build_ms)


def arrivals(env: simpy.Environment, batch: Batch, source: RequestSource):
    """Open loop: Poisson (or replayed) arrivals into the batch's queue."""
    while (gap := source.gap_ms(env.now)) is not None:
        yield env.timeout(gap)
        batch.queue.put(source.next_request(env.now))
