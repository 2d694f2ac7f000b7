"""The one decode loop: admission, prefill, the speculative round, emission and retiring rows, for every
strategy (the strategy is only a proposer: engine.strategies).

One `step()`:
1. take new requests and aborts (thread-safe: `submit` and `abort` may be called from another thread);
2. admit waiting requests (engine.scheduler), prefill them as one batch, sample each one's first token;
   they join the running batch (and the proposer: SD prefills its draft, SSD tells its worker), and the step
   returns there, so their first tokens stream at once (the next step runs a round before admitting again);
3. one round over the running batch: the proposer drafts x [B, K] from q; the target runs [pending, x] in
   one forward; rejection sampling keeps x_1..x_k and draws t* (exact for any q, engine.verifier); the
   target cache rolls back to the accepted prefix; every row emits x_1..x_k, t* as one chunk;
4. finished and aborted rows leave.

Every row has its own sampling settings and random stream, so a request's tokens do not depend on its
batch-mates (and greedy outputs are the solo outputs, up to float rounding of block shapes).
"""

from __future__ import annotations

import logging
import threading
import time

import torch
from torch import Tensor

from engine import host
from engine.checks import Checks
from engine.kv_cache import KVState, right_aligned
from engine.metrics import ServingStats
from engine.outputs import Chunk, TokenLogprob
from engine.recorder import RoundRecorder
from engine.sampling import RowSampling, sample, warp_rows
from engine.scheduler import Scheduler, SchedulerConfig
from engine.sequence import Sequence
from engine.strategies.base import Proposal, Proposer, RoundTelemetry
from engine.timing import Stopwatch
from engine.verifier import verify

log = logging.getLogger(__name__)


class QueueFull(RuntimeError):
    """The engine's waiting queue is full: try again later (HTTP 503)."""


class DecodeLoop:
    def __init__(self, target: torch.nn.Module, proposer: Proposer, *, pad_id: int, device: torch.device,
                 scheduler: SchedulerConfig):
        self.target = target
        self.proposer = proposer
        self.pad_id = pad_id
        self.device = device
        self.scheduler = Scheduler(scheduler)
        self.state = KVState(target, 0, device)  # the target's cache: every committed token but `pending`
        self.running: list[Sequence] = []
        self.pending = torch.zeros(0, dtype=torch.long, device=device)  # [B] newest token of each row
        self.recorder = RoundRecorder()  # the round records (kept while recorder.records is a list)
        self.stats = ServingStats(strategy=proposer.name)
        self.fault: str | None = None  # why the SSD worker was replaced (None while it serves, or never used)
        self._lock = threading.Lock()
        self._inbox: list[Sequence] = []
        self._aborts: set[str] = set()
        self._just_prefilled = False  # the last step prefilled joiners and ran no round

    # -- from any thread ----------------------------------------------------------------------
    def submit(self, seq: Sequence) -> None:
        with self._lock:
            limit = self.scheduler.config.max_waiting
            if limit is not None and len(self._inbox) + len(self.scheduler.waiting) >= limit:
                raise QueueFull(f"the engine's waiting queue is full ({limit} requests): retry later")
            self._inbox.append(seq)

    def abort(self, request_id: str) -> None:
        with self._lock:
            self._aborts.add(request_id)

    @property
    def has_work(self) -> bool:
        with self._lock:
            return bool(self.running or self.scheduler.waiting or self._inbox)

    # -- the loop -----------------------------------------------------------------------------
    def step(self) -> list[Chunk]:
        with self._lock:
            new, self._inbox = self._inbox, []
            aborts, self._aborts = self._aborts, set()
        self.scheduler.waiting.extend(new)
        chunks = self._abort(aborts) if aborts else []
        # After a prefill the step returns, so that the joiners' first tokens reach their streams now rather than
        # after a whole round (TTFT); the next step then runs a round before it admits again, so a stream of
        # arrivals cannot hold the running rows back for more than one prefill per round.
        joining = [] if self._just_prefilled else self.scheduler.admit(len(self.running))
        self._just_prefilled = bool(joining)
        if joining:
            chunks += self._prefill(joining)
        if self.running and not self._just_prefilled:
            chunks += self._round()
        if not self.running:
            self.recorder.release()  # no next round will fill in the held record
        self.stats.running, self.stats.waiting = len(self.running), len(self.scheduler.waiting)
        return chunks

    def _abort(self, request_ids: set[str]) -> list[Chunk]:
        now, chunks = time.perf_counter(), []
        for seq in [s for s in self.scheduler.waiting if s.request_id in request_ids]:
            self.scheduler.waiting.remove(seq)
            chunks.append(seq.abort(now))
        for seq in self.running:
            if seq.request_id in request_ids and not seq.finished:
                chunks.append(seq.abort(now))
        self.stats.requests_aborted += len(chunks)
        self._retire()
        return chunks

    def _prefill(self, seqs: list[Sequence]) -> list[Chunk]:
        """Prefill the joining prompts as one batch and sample each one's first token."""
        t0 = Stopwatch(self.device)
        self.proposer.prefetch(seqs)  # SSD: the worker prefills the draft side meanwhile
        state = KVState(self.target, len(seqs), self.device)
        tokens, valid = right_aligned([s.prompt_ids for s in seqs], self.pad_id, self.device)
        logits = state.extend(tokens, valid, logits_to_keep=1)[:, -1]  # [J, V]
        p = warp_rows(logits.float(), RowSampling([s.params for s in seqs]))  # [J, V]
        first = sample(p, [s.generator for s in seqs])  # [J]
        verify_ms = t0.ms()
        now = time.perf_counter()
        firsts = [[t] for t in first.tolist()]
        logprobs = _logprobs(p[:, None], firsts, seqs)
        chunks = []
        for seq, token, lp in zip(seqs, firsts, logprobs):
            chunks.append(seq.append(token, lp, now))
            seq.metrics.target_forwards += 1
        self.stats.prompt_tokens += sum(len(s.prompt_ids) for s in seqs)
        self.stats.generation_tokens += len(seqs)

        keep = [i for i, s in enumerate(seqs) if not s.finished]
        self._count_finished([s for s in seqs if s.finished])
        t1 = Stopwatch(self.device)
        if keep:
            joined = [seqs[i] for i in keep]
            if len(keep) < len(seqs):
                state.select(torch.tensor(keep, dtype=torch.long))
            self.state = KVState.concat([self.state, state])
            self.pending = torch.cat([self.pending, first[keep].to(self.device)])
            self.running += joined
            self.proposer.admit(joined)  # SD: the draft's prefill; SSD: sent with the next round
        self.recorder.prefill(self.proposer.name, self.proposer.K, len(seqs), max(len(s.prompt_ids) for s in seqs),
                              verify_ms=verify_ms, draft_ms=t1.ms(), round_ms=t0.ms())
        return [c for c in chunks if c is not None]

    def _propose(self, rows: RowSampling) -> tuple[Proposal, RoundTelemetry]:
        """The proposer's speculation and its account of drafting it (after a fault, its replacement's)."""
        try:
            proposal = self.proposer.propose(rows)
        except self.proposer.faults as err:
            self.fall_back(err)
            proposal = self.proposer.propose(rows)
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
        rows = RowSampling([s.params for s in self.running])
        generators = [s.generator for s in self.running]
        context_len = int(self.state.lengths.max())
        t0 = Stopwatch(self.device)
        proposal, telemetry = self._propose(rows)
        x, K = proposal.tokens, proposal.tokens.shape[1]

        t1 = Stopwatch(self.device)
        block = torch.cat([self.pending[:, None], x.to(self.device)], dim=1)  # [B, K + 1]
        checks = Checks()  # the round's input checks, read on the host at once
        p = warp_rows(self.state.extend(block).float(), rows, checks)  # [B, K + 1, V]
        result = verify(x, proposal.q, p, generators, checks)
        checks.raise_first()
        if K:  # keep pending, x_1..x_k (AR's K = 0 leaves nothing to roll back)
            self.state.rollback(K - result.accepted)
        verify_ms = t1.ms()
        self.proposer.observe(result, verify_ms)

        now = time.perf_counter()
        accepted, _, _ = result.host()  # the round's one read of the outcome on the host
        tokens = result.emitted(x)
        chunks = []
        for seq, toks, lp, k in zip(self.running, tokens, _logprobs(p, tokens, self.running), accepted):
            chunks.append(seq.append(toks, lp, now))
            seq.metrics.rounds += 1
            seq.metrics.target_forwards += 1
            seq.metrics.accepted_hist[k] += 1
        emitted = [len(c.token_ids) if c else 0 for c in chunks]
        self.pending = result.bonus.to(self.device)
        self._count_round(telemetry, accepted, emitted, K)
        self.recorder.decode(self.proposer.name, K, context_len, accepted, emitted, verify_ms, t0.ms(),
                             [s.index for s in self.running], telemetry)
        self._retire()
        return [c for c in chunks if c is not None]

    def _count_round(self, telemetry: RoundTelemetry, accepted: list[int], emitted: list[int], K: int) -> None:
        s = self.stats
        s.rounds += 1
        s.row_rounds += len(accepted)
        s.row_tokens += sum(emitted)
        s.generation_tokens += sum(emitted)
        if K:
            s.accepted += sum(accepted)
            s.rejections += sum(k < K for k in accepted)
        if telemetry.previous_outcome_hit is not None:
            looked_up = [h for h in telemetry.previous_outcome_hit if h is not None]
            s.ssd_lookups += len(looked_up)
            s.ssd_hits += sum(looked_up)

    def _count_finished(self, seqs: list[Sequence]) -> None:
        self.stats.requests_finished += sum(s.finish_reason != "abort" for s in seqs)

    def _retire(self) -> None:
        """Finished and aborted rows leave the batch (the target's cache, `pending`, the proposer)."""
        keep = [i for i, s in enumerate(self.running) if not s.finished]
        if len(keep) == len(self.running):
            return
        self._count_finished([s for s in self.running if s.finished])
        index = host.tensor(keep, torch.long, self.device)
        self.state.select(index)
        self.pending = self.pending[index]
        self.running = [self.running[i] for i in keep]
        self.proposer.retire(keep)

    def close(self) -> None:
        self.proposer.close()


def _logprobs(p: Tensor, tokens: list[list[int]], seqs: list[Sequence]) -> list[list[TokenLogprob] | None]:
    """Per row, each emitted token's log-probability under p [B, T, V] (token i at position i), and the top N
    of p there, for the rows that asked (None for the others)."""
    out: list[list[TokenLogprob] | None] = []
    for b, (toks, seq) in enumerate(zip(tokens, seqs)):
        n = seq.params.logprobs
        if n is None:
            out.append(None)
            continue
        rows = p[b, : len(toks)]  # [T, V]
        chosen = rows.gather(-1, torch.tensor(toks, device=rows.device)[:, None]).log()[:, 0].tolist()
        tops = torch.topk(rows, n, dim=-1) if n else None
        lps = []
        for i, (token, lp) in enumerate(zip(toks, chosen)):
            top = tuple(zip(tops.indices[i].tolist(), tops.values[i].log().tolist())) if tops is not None else ()
            lps.append(TokenLogprob(token, lp, top))
        out.append(lps)
    return out
