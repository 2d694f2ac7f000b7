"""Asynchronous speculative speculative decoding (SSD / Saguaro), the target's side (docs/ssd.md §2-§6).

Each round the proposer sends the draft worker one `Round`: the outcome (k, t*) of every row of the last
speculation, which of those rows go on, and the sequences that joined since; the worker answers with the
next speculation (x [B, K] and the q they were drawn from: the draft's, Saguaro's σ_{F,C}, uniform for
random tokens or a point mass for the lookup draft). On a cache hit it answers at once, so drafting costs
the target nothing. The outcome of a round travels with the next request for a speculation, so a batch
that empties sends nothing until work arrives. The draft's cache never crosses.

Adaptive K (`SpeculativeConfig.adaptive`, K="auto"): each request also names the length the worker is to
pre-draft its cache branches at, K_next, and the next request asks for exactly that length, so hits keep
working. K_next is chosen when a request is sent, from the rounds verified before it (running α per row,
verify time per block width, the backup's time per drafted token and the hit rate: SSDLookahead), so the
length of every verified speculation is fixed from past rounds only and the round is verified exactly as
one of that length chosen in advance (docs/ssd.md §1): the output distribution does not change. Each request
also offers K_miss, the length for a round in which no row hits and the neural backup drafts them all: such a
round is an SD round, so it takes SD's best length (often shorter than SSD's, whose draft time is discounted by
the hit rate). Whether a row hits depends on outcomes already verified, so that choice is from the past too.

If the worker dies, hangs past its deadline or sends a malformed message, `propose` raises; the loop
then asks `fallback()` for the proposer that replaces this one for good (synchronous SD with the draft in
the target's process when it has one, else AR), with one warning. The output distribution is unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from engine import host
from engine.checks import Checks
from engine.config import SpeculativeConfig
from engine.sampling import RowSampling
from engine.sequence import Sequence
from engine.ssd.channel import FAULTS, Channel
from engine.ssd.lifetime import sigint_deferred
from engine.ssd.messages import Join, MalformedMessage, Prefill, Round, Source
from engine.ssd.transport import DraftUnavailable
from engine.strategies.ar import NoDraft
from engine.strategies.base import Proposal, Proposer, RoundTelemetry
from engine.strategies.sd import InProcessDraft
from engine.strategies.ssd_lookahead import SSDLookahead
from engine.timing import Stopwatch
from engine.verifier import Verification

log = logging.getLogger(__name__)


class DraftWorkerProposer:
    name = "ssd"
    faults = FAULTS

    def __init__(
        self,
        open_channel: Callable[[], Channel],
        spec: SpeculativeConfig,
        vocab_size: int,
        pad_id: int,
        device: torch.device,
        draft: torch.nn.Module | None = None,
    ):
        self.spec = spec
        self.K = spec.K  # length of the last speculation
        self.K_next: int | None = None  # length announced for the next one (None: not yet chosen)
        self.lookahead = SSDLookahead(spec)
        self.V = vocab_size
        self.pad_id = pad_id
        self.device = device
        self.draft = draft  # the draft in the target's process, for the synchronous SD fallback (None: AR)
        # Per current row: its row in the worker's last speculation, or the Join that will introduce it.
        self.rows: list[int | Join] = []
        self.worker_rows = 0
        # Outcome of the worker's last speculation, per worker row; None until the target has verified it
        # (a round broken off by Ctrl-C between the answer and the verification leaves it None).
        self.accepted: list[int] | None = []
        self.bonus: list[int] | None = []
        self.verify_ms = 0.0
        self.exchanges = 0
        self.open_channel = open_channel
        self.channel: Channel | None = None
        self.last_round = RoundTelemetry()

    def start(self) -> None:
        """Start the worker (raises one of FAULTS if it cannot)."""
        self.channel = self.open_channel()

    def admit(self, seqs: list[Sequence]) -> None:
        for s in seqs:
            p = s.params
            self.rows.append(
                Join(
                    s.seq_id,
                    _draft_prompt(s),
                    s.output_ids[-1],
                    float(p.temperature),
                    p.top_k or 0,
                    p.top_p or 1.0,
                    s.seed,
                    p.invariant,
                )
            )
        self.lookahead.admit(len(seqs))

    def prefetch(self, seqs: list[Sequence]) -> None:
        """Prompts the target prefills now: the worker prefills their draft side meanwhile (off the critical path;
        the next request brings them as joins, checked against what was prefilled)."""
        if self.channel is not None and seqs:
            self.channel.prefetch(Prefill([s.seq_id for s in seqs], [_draft_prompt(s) for s in seqs], self.V))

    def retire(self, keep: list[int]) -> None:
        self.rows = [self.rows[i] for i in keep]
        self.lookahead.retire(keep)

    def propose(self, rows: RowSampling, checks: Checks | None = None) -> Proposal:
        going_on = {r for r in self.rows if isinstance(r, int)}
        if not going_on and self.channel is not None and not self.channel.in_step:
            self._restart()  # an exchange broke off mid-way (not by Ctrl-C, which waits): a fresh worker
        joins = [r for r in self.rows if isinstance(r, Join)]
        alive = [b in going_on for b in range(self.worker_rows)]
        accepted, bonus = self.accepted, self.bonus
        if accepted is None:  # never verified: harmless only for rows that leave, whose outcome is ignored
            if any(alive):
                raise DraftUnavailable("a speculation was never verified, yet its rows go on")
            accepted, bonus = [0] * self.worker_rows, [self.pad_id] * self.worker_rows
        # This speculation's length was announced with the last request; the next one's is chosen now, from
        # the rounds verified so far (both from the past only).
        K = self.lookahead.choose() if self.K_next is None else self.K_next
        K_next = self.lookahead.choose()
        K_miss = self._miss_length(K)
        msg = Round(self.exchanges, accepted, bonus, alive, self.verify_ms, joins, K, self.V, self.K, K_next, K_miss)
        t0 = Stopwatch()  # a wait on the host: the answer is in host memory (or read) when exchange returns
        if self.channel is None:
            raise DraftUnavailable("the draft worker is not running")
        self.channel.wait_ready()  # interruptible: nothing has been sent yet
        # Ctrl-C waits until the answer is read and booked, so the stream and this side stay in step.
        with sigint_deferred():
            spec = self.channel.exchange(msg)
            wait_ms = t0.ms()
            B = len(self.rows)
            asked = K  # the length of the cache's branches that were looked up
            if spec.tokens.shape == (B, K_miss) and K_miss != K and not any(spec.hits):
                K = K_miss  # no row hit and the neural backup drafted: the shorter length the worker was offered
            if spec.tokens.shape != (B, K) or tuple(spec.q.shape) != (B, K, self.V):
                raise MalformedMessage(
                    f"speculation for {tuple(spec.tokens.shape)} tokens, expected ({B}, {K}) over V={self.V}"
                )
            hits = iter(spec.hits)
            previous = [next(hits) if a else None for a in alive] if self.worker_rows else None
            self.rows, self.worker_rows, self.exchanges = list(range(B)), B, self.exchanges + 1
            self.accepted = self.bonus = None
            self.K, self.K_next = K, K_next
            self.lookahead.answered(
                spec.hits[: sum(alive)],
                K,
                spec.backup_ms if spec.source and any(s is Source.NEURAL for s in spec.source) else None,
                spec.cache_build_ms if any(alive) else None,
                asked,
                spec.branches,
            )
        backups = sorted({s.name.lower() for s in spec.source if s is not Source.HIT})
        self.last_round = RoundTelemetry(
            draft_ms=wait_ms,
            draft_forwards=0,
            hit=spec.hits,
            cache_build_ms=spec.cache_build_ms,
            branches=spec.branches,
            backup=",".join(backups) or None,
            backup_ms=spec.backup_ms,
            fanout=spec.fanout,
            previous_outcome_hit=previous,
            previous_outcome_rank=[None if r < 0 else r for r in spec.ranks] if spec.ranks else None,
        )
        # q travels as its support where narrow, and the verifier takes it so (engine.sparse). From a worker in its
        # own process both arrive in host memory: uploaded without waiting (engine.host)
        return Proposal(host.upload(spec.tokens, self.device), spec.q.to(self.device))

    def _miss_length(self, K: int) -> int:
        """Adaptive K: the length for a round in which no row hits and the neural backup drafts every row. That
        round is an SD round (K draft forwards, then the verify), so SD's best length applies: the drafted
        token's cost in full, not discounted by the hit rate as K's is (from past rounds only, as K is)."""
        if not self.spec.adaptive or not self.rows:
            return K
        return min(K, self.lookahead.choose_miss())

    def _restart(self) -> None:
        """Replace a worker whose message stream is out of step; only when no row goes on (all rows join)."""
        log.info("restarting the SSD draft worker: an earlier exchange broke off mid-way")
        self.close()
        self.worker_rows, self.accepted, self.bonus, self.exchanges = 0, [], [], 0
        self.K_next = None
        self.start()

    def observe(self, result: Verification, verify_ms: float) -> None:
        self.accepted, self.bonus, _ = result.host()  # the loop's one read of the outcome
        self.verify_ms = verify_ms
        self.lookahead.observe(self.accepted, self.K, verify_ms)

    def fallback(self, err: Exception, what: str = "failed") -> Proposer:
        """Stop the worker and return the proposer that goes on in its place (rows still to be admitted)."""
        self.close()
        how = (
            "synchronous speculative decoding with the draft in the target process"
            if self.draft is not None
            else "autoregressive decoding"
        )
        log.warning(
            "SSD draft worker %s (%s); stopped it and continuing with %s (the output distribution is unchanged)",
            what,
            f"{type(err).__name__}: {err}",
            how,
        )
        if self.draft is not None:
            return InProcessDraft(self.draft, self.spec, self.pad_id, self.device)
        return NoDraft(self.V, self.device)

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()  # a worker process's core(s) go back to the target (or its SD fallback)
            self.channel = None


def _draft_prompt(seq: Sequence) -> list[int]:
    """What the worker prefills for a joining sequence: every token but its newest (the backup feeds that one).
    A Prefill and the Join after it must agree on it exactly, or the worker prefills again."""
    return seq.prompt_ids + seq.output_ids[:-1]
