"""The one decode loop: admission, prefill, the speculative round, emission and retiring rows, for every
strategy (the strategy is only a proposer: engine.strategies).

One `step()`:
1. take new requests and aborts (thread-safe: `submit` and `abort` may be called from another thread);
2. admit waiting requests (engine.scheduler) as a prefill group, and feed the target the next chunk of their
   prompts: at most `max_prefill_tokens` tokens a step (chunked prefill), so a long prompt is fed over several
   steps, each also running a round of the others. A row whose prompt is complete samples its first token and
   joins the running batch (and the proposer: SD prefills its draft, SSD tells its worker); the step then returns,
   so first tokens stream at once (the next step runs a round before admitting again);
3. one round over the running batch: the proposer drafts x [B, K] from q; the target runs [pending, x] in
   one forward; rejection sampling keeps x_1..x_k and draws t* (exact for any q, engine.verifier); the
   target cache rolls back to the accepted prefix; every row emits x_1..x_k, t* as one chunk;
4. finished and aborted rows leave.

Every row has its own sampling settings and random stream, so a request's tokens do not depend on its
batch-mates (and greedy outputs are the solo outputs, up to float rounding of block shapes). min_tokens masks
the ids that would end a row in the target's p only: verification is exact for any q, so the draft need not know.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from engine import host
from engine.checks import Checks
from engine.invariant import target_winners
from engine.keyed_random import Purpose
from engine.kv_cache import KVState, new_state, right_aligned
from engine.metrics import ServingStats
from engine.outputs import Chunk
from engine.recorder import RoundRecorder
from engine.row_distribution import hold_back_stops, logprobs
from engine.sampling import Keys, RowSampling, sample, warp_rows
from engine.sampling_params import LogprobsMode
from engine.scheduler import Scheduler, SchedulerConfig
from engine.sequence import Sequence
from engine.strategies.base import Proposal, Proposer, RoundTelemetry
from engine.timing import Stopwatch
from engine.verifier import verify_greedy, verify_rows

log = logging.getLogger(__name__)


class QueueFull(RuntimeError):
    """The engine's waiting queue is full: try again later (HTTP 503)."""


@dataclass
class Prefilling:
    """Admitted sequences whose prompts the target is being fed, a chunk per step, in a cache of their own."""

    seqs: list[Sequence]
    state: KVState
    fed: list[int]  # prompt tokens of each row already in `state`

    def left(self, i: int) -> int:
        return len(self.seqs[i].prompt_ids) - self.fed[i]

    def keep(self, rows: list[int]) -> None:
        """Only these rows (increasing, at least one) go on prefilling."""
        if len(rows) < len(self.seqs):
            self.state.select(rows)
            self.seqs = [self.seqs[i] for i in rows]
            self.fed = [self.fed[i] for i in rows]


class DecodeLoop:
    def __init__(
        self,
        target: torch.nn.Module,
        proposer: Proposer,
        *,
        pad_id: int,
        device: torch.device,
        scheduler: SchedulerConfig,
    ):
        self.target = target
        self.proposer = proposer
        self.pad_id = pad_id
        self.device = device
        self.scheduler = Scheduler(scheduler)
        self.state = new_state(target, 0, device)  # the target's cache: every committed token but `pending`
        self.running: list[Sequence] = []
        self.prefilling: Prefilling | None = None  # the admitted group whose prompts are being fed
        self.pending = torch.zeros(0, dtype=torch.long, device=device)  # [B] newest token of each row
        self.batch_changed()
        self.recorder = RoundRecorder()  # the round records (kept while recorder.records is a list)
        self.stats = ServingStats(strategy=proposer.name)
        self.fault: str | None = None  # why the SSD worker was replaced (None while it serves, or never used)
        self._lock = threading.Lock()
        self._inbox: list[Sequence] = []
        self._aborts: set[str] = set()
        self._just_prefilled = False  # the last step prefilled joiners and ran no round
        self._last_accepted: list[int] = []  # k of each row in the last round (SSD's hits by k come a round later)

    # -- from any thread ----------------------------------------------------------------------
    def submit(self, seq: Sequence) -> None:
        with self._lock:
            limit = self.scheduler.config.max_waiting
            if limit is not None and len(self._inbox) + len(self.scheduler.waiting) >= limit + self._free_rows():
                raise QueueFull(f"the engine's waiting queue is full ({limit} requests): retry later")
            self._inbox.append(seq)

    def _free_rows(self) -> int:
        """Batch rows nobody holds now: requests that will take them at the next step do not wait."""
        rows = self.scheduler.config.max_num_seqs
        prefilling = len(self.prefilling.seqs) if self.prefilling is not None else 0
        return 0 if rows is None else max(0, rows - len(self.running) - prefilling)

    def abort(self, request_id: str) -> None:
        with self._lock:
            self._aborts.add(request_id)

    @property
    def has_work(self) -> bool:
        with self._lock:
            return bool(self.running or self.prefilling or self.scheduler.waiting or self._inbox)

    # -- the loop -----------------------------------------------------------------------------
    def step(self) -> list[Chunk]:
        with self._lock:
            new, self._inbox = self._inbox, []
            aborts, self._aborts = self._aborts, set()
        self.scheduler.waiting.extend(new)
        chunks = self._abort(aborts) if aborts else []
        # After a prefill the step returns, so that the joiners' first tokens reach their streams now rather than
        # after a whole round (TTFT); the next step then runs a round before it admits again, so a stream of
        # arrivals cannot hold the running rows back for more than one prefill chunk per round.
        if self.prefilling is None and not self._just_prefilled:
            joining = self.scheduler.admit(len(self.running))
            if joining:
                now = time.perf_counter()
                for seq in joining:
                    seq.metrics.scheduled_s = now
                state = new_state(self.target, len(joining), self.device)  # their own cache until they join
                fed = [0] * len(joining)
                if hasattr(state, "reuse_prefix"):  # the block cache: a prompt's cached prefix is not fed again
                    fed = [state.reuse_prefix(i, s.prompt_ids, len(s.prompt_ids) - 1) for i, s in enumerate(joining)]
                    for seq, n in zip(joining, fed, strict=False):
                        seq.metrics.cached_prompt_tokens = n
                self.prefilling = Prefilling(joining, state, fed)
        joined = False
        if self.prefilling is not None:
            fed, joined = self._prefill_chunk()
            chunks += fed
        self._just_prefilled = joined
        if self.running and not joined:
            chunks += self._round()
        if not self.running:
            self.recorder.release()  # no next round will fill in the held record
        prefilling = len(self.prefilling.seqs) if self.prefilling is not None else 0
        self.stats.running, self.stats.waiting = len(self.running) + prefilling, len(self.scheduler.waiting)
        self.stats.cached_tokens = sum(len(s.prompt_ids) + len(s.output_ids) for s in self.running)
        pool = getattr(self.target, "pool", None)
        if pool is not None:  # the block cache's own account
            self.stats.kv_blocks_used, self.stats.kv_blocks_total = pool.used_blocks, pool.max_blocks
            self.stats.prefix_cache_queries, self.stats.prefix_cache_hits = pool.queried_tokens, pool.hit_tokens
        return chunks

    def _abort(self, request_ids: set[str]) -> list[Chunk]:
        now, chunks = time.perf_counter(), []
        for seq in [s for s in self.scheduler.waiting if s.request_id in request_ids]:
            self.scheduler.waiting.remove(seq)
            chunks.append(seq.abort(now))
        group = self.prefilling
        if group is not None:
            chunks += [s.abort(now) for s in group.seqs if s.request_id in request_ids]
            rest = [i for i, s in enumerate(group.seqs) if not s.finished]
            if rest:
                group.keep(rest)
            else:
                self.prefilling = None
        for seq in self.running:
            if seq.request_id in request_ids and not seq.finished:
                chunks.append(seq.abort(now))
        self.stats.requests_aborted += len(chunks)
        self._retire()
        return chunks

    def _prefill_chunk(self) -> tuple[list[Chunk], bool]:
        """Feed the prefill group its next chunk, at most max_prefill_tokens prompt tokens (rows in order, each
        its next slice); rows whose prompt is then complete sample their first token and join the running batch.
        Returns their chunks and whether any row's prompt was complete."""
        t0 = Stopwatch(self.device)
        group = self.prefilling
        slices, room = [], self.scheduler.config.max_prefill_tokens
        for i, seq in enumerate(group.seqs):
            n = group.left(i) if room is None else min(group.left(i), room)
            slices.append(seq.prompt_ids[group.fed[i] : group.fed[i] + n])
            room = None if room is None else room - n
        complete = [i for i, part in enumerate(slices) if part and len(part) == group.left(i)]
        done = [group.seqs[i] for i in complete]
        context_len = max(group.fed)
        self.proposer.prefetch(done)  # SSD: the worker prefills their draft side meanwhile
        tokens, valid = right_aligned(slices, self.pad_id, self.device)  # [J, T]: every row's newest token last
        logits = group.state.extend(tokens, valid, logits_to_keep=1, fed=[len(p) for p in slices])[:, -1]  # [J, V]
        for i, part in enumerate(slices):
            group.fed[i] += len(part)
        if hasattr(group.state, "register"):  # complete prompts' full blocks go to the prefix cache
            for i in complete:
                group.state.register(i, group.seqs[i].prompt_ids)
        self.stats.prompt_tokens += sum(len(part) for part in slices)
        chunks, first = self._first_tokens(done, logits[complete]) if complete else ([], None)
        verify_ms = t0.ms()
        t1 = Stopwatch(self.device)
        rest = [i for i in range(len(group.seqs)) if i not in set(complete)]
        if complete:
            going_on = [j for j, seq in enumerate(done) if not seq.finished]
            if going_on:
                rows = [complete[j] for j in going_on]
                whole = not rest and len(rows) == len(group.seqs)  # the common case: the group's cache as it is
                state = group.state if whole else group.state.fork(rows)
                self._join([done[j] for j in going_on], state, first[going_on])
        self.recorder.prefill(
            self.proposer.name,
            self.proposer.K,
            len(group.seqs),
            max(len(p) for p in slices),
            verify_ms=verify_ms,
            draft_ms=t1.ms(),
            round_ms=t0.ms(),
            context_len=context_len,
        )
        if rest:
            group.keep(rest)
        else:
            self.prefilling = None
        return chunks, bool(complete)

    def _first_tokens(self, seqs: list[Sequence], logits: Tensor) -> tuple[list[Chunk], Tensor]:
        """Sample the first token of each sequence whose prompt is complete (logits [J, V]); their chunks, and
        the tokens [J]."""
        p = warp_rows(hold_back_stops(logits[:, None], seqs)[:, 0].float(), RowSampling([s.params for s in seqs]))
        keys = Keys.of([s.seed for s in seqs], [len(s.prompt_ids) for s in seqs])  # the first token's position
        drawn = host.upload(torch.from_numpy(keys.uniforms(Purpose.TARGET, 1)[:, 0]), p.device)  # [J]
        first = sample(p, None, u=drawn)  # [J]
        invariant = [b for b, s in enumerate(seqs) if s.params.invariant]
        if invariant:  # drafter-invariant rows: the race's winner (engine.invariant)
            index = host.tensor(invariant, torch.long, p.device)
            on = host.tensor([[keys.seeds[b], keys.positions[b]] for b in invariant], torch.long, p.device)
            first[index] = target_winners(p[index][:, None], on[:, 0], on[:, 1:])[:, 0]
        now = time.perf_counter()
        firsts = [[t] for t in first.tolist()]
        chunks = []
        for seq, token, lp in zip(seqs, firsts, logprobs(logits[:, None], p[:, None], firsts, seqs), strict=False):
            chunks.append(seq.append(token, lp, now))
            seq.metrics.target_forwards += 1
        self.stats.generation_tokens += len(seqs)
        self._count_finished([s for s in seqs if s.finished])
        return [c for c in chunks if c is not None], first

    def _join(self, seqs: list[Sequence], state: KVState, first: Tensor) -> None:
        """Sequences whose prompt is in `state` (one row each) and whose first token is `first` [J] join the
        running batch."""
        self.state = KVState.concat([self.state, state])
        self.pending = torch.cat([self.pending, first.to(self.device)])
        self.running += seqs
        self.batch_changed()
        self.proposer.admit(seqs)  # SD: the draft's prefill; SSD: sent with the next round

    def _propose(self, rows: RowSampling, checks: Checks) -> tuple[Proposal, RoundTelemetry]:
        """The proposer's speculation and its account of drafting it (after a fault, its replacement's); its input
        checks go to `checks`, read with the round's outcome."""
        self.proposer.record_outcomes = self.recorder.active
        try:
            proposal = self.proposer.propose(rows, checks)
        except self.proposer.faults as err:
            self.fall_back(err)
            proposal = self.proposer.propose(rows, checks)
        return proposal, self.proposer.last_round

    def fall_back(self, err: Exception, what: str = "failed") -> None:
        """Swap the failed SSD worker for the fallback proposer, which takes over every running row."""
        self.fault = f"SSD draft worker {what}: {type(err).__name__}: {err}"
        replacement = self.proposer.fallback(err, what)
        if self.running:  # none when the worker fails to start
            replacement.admit(self.running)
        self.proposer = replacement
        self.stats.fallbacks += 1
        self.stats.strategy = replacement.name

    def _round(self) -> list[Chunk]:
        """One speculative round over the running batch (a plain sampling step for AR)."""
        rows = self.rows
        context_len = max(self._host_lengths(), default=0)
        t0 = Stopwatch()
        checks = Checks()  # the round's input checks (the draft's and the verify's), read on the host with the outcome
        proposal, telemetry = self._propose(rows, checks)
        x, K = proposal.tokens, proposal.tokens.shape[1]

        t1 = Stopwatch()
        block = torch.cat([self.pending[:, None], x.to(self.device)], dim=1)  # [B, K + 1]
        logits = self.state.extend(block)  # [B, K + 1, V]: position j predicts output token len(output_ids) + j
        held = hold_back_stops(logits, self.running)  # min_tokens: p only (logprobs report the model's own)
        if self.greedy:  # every row argmax: p is never built
            p, result = None, verify_greedy(x, held, checks)
        else:
            p = warp_rows(held.float(), rows, checks)  # [B, K + 1, V]
            keys = Keys(self.seeds, np.asarray(self._host_positions(), dtype=np.int64))  # x_1's positions
            result = verify_rows(x, proposal.q, p, keys, self.invariant, checks)
        accepted, _, _ = result.host(checks)  # the round's one read: the outcome and the input checks
        if K:  # keep pending, x_1..x_k (AR's K = 0 leaves nothing to roll back)
            self.state.rollback([K - k for k in accepted])
        verify_ms = t1.ms()  # on the host's clock: the read above waited for the device's work
        self.proposer.observe(result, verify_ms)

        now = time.perf_counter()
        tokens = result.emitted()
        chunks = []
        wants = any(s.params.logprobs is not None for s in self.running)
        lps = logprobs(logits, p, tokens, self.running) if wants else [None] * len(tokens)
        for seq, toks, lp, k in zip(self.running, tokens, lps, accepted, strict=False):
            chunks.append(seq.append(toks, lp, now))
            seq.metrics.rounds += 1
            seq.metrics.target_forwards += 1
            seq.metrics.accepted_hist[k] += 1
        emitted = [len(c.token_ids) if c else 0 for c in chunks]
        self.pending = result.bonus.to(self.device)
        self._count_round(telemetry, accepted, emitted, K)
        self.recorder.decode(
            self.proposer.name,
            K,
            context_len,
            accepted,
            emitted,
            verify_ms,
            t0.ms(),
            [s.index for s in self.running],
            telemetry,
        )
        self._retire()
        return [c for c in chunks if c is not None]

    def _host_positions(self) -> list[int]:
        """Each row's tokens so far (prompt and output, `pending` included): the position of its next token."""
        return [len(s.prompt_ids) + len(s.output_ids) for s in self.running]

    def _host_lengths(self) -> list[int]:
        """Tokens in the target's cache per row, from the host's own count where the state keeps one."""
        lengths = getattr(self.state, "host_lengths", None)
        return lengths if lengths is not None else self.state.lengths.tolist()

    def _count_round(self, telemetry: RoundTelemetry, accepted: list[int], emitted: list[int], K: int) -> None:
        s = self.stats
        s.rounds += 1
        s.row_rounds += len(accepted)
        s.row_tokens += sum(emitted)
        s.generation_tokens += sum(emitted)
        if K:
            # An accepted draft token counts once emitted: a row cut short by a stop emits fewer than k + 1.
            kept = [min(k, n) for k, n in zip(accepted, emitted, strict=False)]
            s.accepted += sum(kept)
            s.rejections += sum(k < K for k in accepted)
            s.drafts += len(accepted)
            s.draft_tokens += K * len(accepted)
            per_position = list(s.accepted_per_position) + [0] * (K - len(s.accepted_per_position))
            for k in kept:
                for i in range(k):
                    per_position[i] += 1
            s.accepted_per_position = tuple(per_position)  # a new tuple: a snapshot is never changed under a reader
        if telemetry.backup_ms:
            s.backup_s += telemetry.backup_ms / 1e3
        if telemetry.previous_outcome_hit is not None:  # per row of the last round, whose k are _last_accepted
            lookups, hits = list(s.ssd_lookups_by_k), list(s.ssd_hits_by_k)
            for k, hit in zip(self._last_accepted, telemetry.previous_outcome_hit, strict=False):
                if hit is None:
                    continue
                if k >= len(lookups):
                    lookups += [0] * (k + 1 - len(lookups))
                    hits += [0] * (k + 1 - len(hits))
                lookups[k] += 1
                hits[k] += hit
            s.ssd_lookups_by_k, s.ssd_hits_by_k = tuple(lookups), tuple(hits)
            s.ssd_lookups, s.ssd_hits = sum(lookups), sum(hits)
        self._last_accepted = accepted

    def _count_finished(self, seqs: list[Sequence]) -> None:
        self.stats.requests_finished += sum(s.finish_reason != "abort" for s in seqs)

    def _retire(self) -> None:
        """Finished and aborted rows leave the batch (the target's cache, `pending`, the proposer)."""
        keep = [i for i, s in enumerate(self.running) if not s.finished]
        if len(keep) == len(self.running):
            return
        self._count_finished([s for s in self.running if s.finished])
        if hasattr(self.state, "register"):  # a request's tokens, its answer too, for the next turn of its chat
            for i, seq in enumerate(self.running):
                if seq.finished:
                    self.state.register(i, seq.prompt_ids + seq.output_ids)
        self.state.select(keep)
        self.pending = self.pending[host.tensor(keep, torch.long, self.device)]
        self.running = [self.running[i] for i in keep]
        self.batch_changed()
        self.proposer.retire(keep)

    def batch_changed(self) -> None:
        """The running rows changed (they are set anew): their sampling settings and seeds, kept until the next
        change."""
        self.rows = RowSampling([s.params for s in self.running])
        self.seeds = np.asarray([s.seed for s in self.running], dtype=np.int64)  # keyed random numbers' seeds
        self.invariant = [s.params.invariant for s in self.running]  # drafter-invariant rows (engine.invariant)
        self.greedy = all(
            s.params.greedy and s.params.logprobs_mode is not LogprobsMode.PROCESSED for s in self.running
        )

    def close(self) -> None:
        self.proposer.close()
