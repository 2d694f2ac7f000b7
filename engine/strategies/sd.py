"""Synchronous speculative decoding: the draft, in the target's process, proposes K tokens per row with K
forwards; the loop verifies them in one target forward.

Draft cache bookkeeping per row: the cache holds the committed tokens except a short tail (not yet fed):
[t*] after a rejection, or [x_K, t*] when all K were accepted (x_K was sampled but never fed). The draft
was fed tail, x_1..x_{K−1}; after k accepted it drops x_{k+1}..x_{K−1}: max(K − 1 − k, 0) slots.
A row that joins (or every row, when SD takes over from a failed SSD worker) is prefilled with its
prompt and output so far but the newest token, which is its tail.

Each round also measures where the verified bonus t* stood in the draft's ranking (engine.drafting.
bonus_ranks), so an SD run tells what any SSD fan-out would have hit: after a rejection
at position k+1 from the logits drafted there, after all K accepted from the logits the next round's feed
of [x_K, t*] gives at x_K (hence one round late, and unknown for a row that finished then).

K may change from round to round (engine.strategies.lookahead: adaptive K from the past rounds), and with
a confidence stop the draft ends the block early once its top probability at the next position is below
the threshold in every row. Both are fixed before the target sees the block, so SD stays exact; the
bookkeeping above holds with K = the round's block length.
"""

from __future__ import annotations

import torch
from torch import Tensor

from engine import host
from engine.checks import Checks
from engine.config import SpeculativeConfig
from engine.drafting import draft_from
from engine.kv_cache import KVState, new_state, prefill, right_aligned
from engine.loading.devices import model_device
from engine.ranking import rank_of
from engine.sampling import Keys, RowSampling
from engine.sequence import Sequence
from engine.strategies.base import Proposal, RoundTelemetry
from engine.strategies.lookahead import Lookahead
from engine.timing import Interval
from engine.verifier import Verification


class InProcessDraft:
    """SD's proposer. The draft runs on its own device (`draft_device`: the target's, or the CPU for a low-bit
    draft, e.g. the fallback of an SSD worker whose draft was quantised for the CPU); only what verification
    needs, x and q, goes to the target's `device`, and only the outcome comes back."""

    name = "sd"
    faults = ()

    def __init__(self, draft: torch.nn.Module, spec: SpeculativeConfig, pad_id: int, device: torch.device):
        self.draft = draft
        self.spec = spec
        self.K = spec.K  # this round's block length (the maximum until the first round)
        self.lookahead = Lookahead(spec)
        self.pad_id = pad_id
        self.device = device  # the target's: the proposal is verified there
        self.draft_device = model_device(draft)
        self.state = new_state(draft, 0, self.draft_device)
        self.tails: list[list[int]] = []
        self.seeds: list[int] = []  # each row's request seed (keyed random numbers: engine.sampling.Keys)
        self.positions: list[int] = []  # each row's tokens so far: the position of its next x_1
        self.ranks: list[int | None] = []  # per row of the last round: its bonus's rank (None: not yet known)
        self.late: list[int | None] = []  # per row: where its all-accepted outcome's rank goes in `ranks`
        # the last round's rejected rows (their places in `ranks`) and their ranks, on the draft's device: read on
        # the host with the next round's late ranks, in one transfer
        self.rejected: tuple[list[int], Tensor] | None = None
        self.last_round = RoundTelemetry()
        self.record_outcomes = True  # measure each outcome's rank among the draft's guesses (the loop sets it)

    def prefetch(self, seqs: list[Sequence]) -> None:
        pass

    def admit(self, seqs: list[Sequence]) -> None:
        state = new_state(self.draft, len(seqs), self.draft_device)
        prompts = [s.prompt_ids + s.output_ids[:-1] for s in seqs]
        state = prefill(state, prompts, self.pad_id, self.draft_device)
        self.state = KVState.concat([self.state, state])
        self.tails += [[s.output_ids[-1]] for s in seqs]
        self.late += [None] * len(seqs)
        self.lookahead.admit(len(seqs))
        self.seeds += [s.seed for s in seqs]
        self.positions += [len(s.prompt_ids) + len(s.output_ids) for s in seqs]

    def retire(self, keep: list[int]) -> None:
        self.state.select(keep)
        self.tails = [self.tails[i] for i in keep]
        self.late = [self.late[i] for i in keep]
        self.seeds = [self.seeds[i] for i in keep]
        self.positions = [self.positions[i] for i in keep]
        self.lookahead.retire(keep)

    def propose(self, rows: RowSampling, checks: Checks | None = None) -> Proposal:
        self.interval = Interval(self.draft_device)  # read in observe, after the round's read: no wait of its own
        tokens, valid = right_aligned(self.tails, self.pad_id, self.draft_device)
        fed = self.state.extend(tokens, valid, fed=[len(t) for t in self.tails])  # [B, W, V]
        previous = self._late_ranks(fed) if self.record_outcomes else None
        K, logits = self.lookahead.choose(), fed[:, -1].float()
        self.x, q, self.z = draft_from(
            self.state,
            logits,
            K,
            self.spec.saguaro_top(),
            self.spec.C,
            rows,
            Keys.of(self.seeds, self.positions),
            stop_below=self.spec.confidence_stop,
            keep_logits=self.record_outcomes,
            checks=checks,
        )  # [B, K'], [B, K', V]
        self.K = self.x.shape[1]
        self.forwards = self.K + (self.K < K)  # the tail's feed included; a stopped block fed its last token to look
        self.interval.stop()
        self.last_round = RoundTelemetry(draft_forwards=self.forwards, previous_outcome_rank=previous)
        return Proposal(host.upload(self.x, self.device), q.to(self.device))

    def _late_ranks(self, fed: Tensor) -> list[int | None] | None:
        """Fill in the ranks of last round's all-accepted outcomes from the draft's logits at x_K (the
        second newest fed token), and read them with the rejected rows' ones; return the last round's ranks, or
        None if there was no last round."""
        waiting = [(b, i) for b, i in enumerate(self.late) if i is not None]
        places, parts = [], []
        if self.rejected is not None:
            places += self.rejected[0]
            parts.append(self.rejected[1])
        if waiting:
            rows = host.tensor([b for b, _ in waiting], torch.long, fed.device)
            bonus = host.tensor([self.tails[b][-1] for b, _ in waiting], torch.long, fed.device)
            places += [i for _, i in waiting]
            parts.append(rank_of(fed[rows, -2], bonus, torch.full_like(bonus, -1)))
        if parts:
            for i, rank in zip(places, torch.cat(parts).tolist(), strict=False):  # one read
                self.ranks[i] = rank
        previous, self.ranks, self.late, self.rejected = self.ranks or None, [], [None] * len(self.tails), None
        return previous

    def observe(self, result: Verification, verify_ms: float) -> None:
        K = self.K
        accepted, bonus, x = result.host()  # the loop's one read of the outcome
        draft_ms = self.interval.ms()  # the device has run the draft by now: no wait
        if draft_ms is not None:
            self.lookahead.drafted(self.forwards, draft_ms)
            self.last_round.draft_ms = draft_ms
        if not x or len(x[0]) != K:  # a Verification made without its draft tokens
            x = self.x.tolist()
        self.lookahead.observe(accepted, K, verify_ms)
        self.positions = [p + kb + 1 for p, kb in zip(self.positions, accepted, strict=False)]
        self.state.rollback([max(K - 1 - kb, 0) for kb in accepted])
        self.tails = [[row[-1], t] if kb == K else [t] for row, kb, t in zip(x, accepted, bonus, strict=False)]
        rejected = [b for b, kb in enumerate(accepted) if kb < K]
        self.ranks = [None] * len(accepted)
        self.rejected = None
        if not self.record_outcomes:
            self.late = [None] * len(accepted)
            return
        if rejected:
            on = self.z[0].device
            z = torch.stack([self.z[accepted[b]][b] for b in rejected])  # [R, V] the logits where each was rejected
            ranks = rank_of(
                z,
                host.tensor([bonus[b] for b in rejected], torch.long, on),
                host.tensor([x[b][accepted[b]] for b in rejected], torch.long, on),
            )
            self.rejected = (rejected, ranks)
        self.late = [b if kb == K else None for b, kb in enumerate(accepted)]

    def close(self) -> None:
        pass
