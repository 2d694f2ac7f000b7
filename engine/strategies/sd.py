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

import time

import torch
from torch import Tensor

from engine.config import SpeculativeConfig
from engine.drafting import bonus_ranks, draft_from
from engine.kv_cache import KVState, new_state, right_aligned
from engine.metrics import ms_since
from engine.sampling import RowSampling
from engine.sequence import Sequence
from engine.strategies.base import Proposal, RoundTelemetry
from engine.strategies.lookahead import Lookahead
from engine.verifier import Verification

DRAFT_SEED_OFFSET = 0x5A6  # the draft's random stream differs from the target's


def draft_seed(seed: int) -> int:
    return (seed + DRAFT_SEED_OFFSET) % (1 << 63)


class InProcessDraft:
    name = "sd"
    faults = ()

    def __init__(self, draft: torch.nn.Module, spec: SpeculativeConfig, pad_id: int, device: torch.device):
        self.draft = draft
        self.spec = spec
        self.K = spec.K  # this round's block length (the maximum until the first round)
        self.lookahead = Lookahead(spec)
        self.pad_id = pad_id
        self.device = device
        self.state = new_state(draft, 0, device)
        self.tails: list[list[int]] = []
        self.generators: list[torch.Generator] = []
        self.ranks: list[int | None] = []  # per row of the last round: its bonus's rank (None: not yet known)
        self.late: list[int | None] = []  # per row: where its all-accepted outcome's rank goes in `ranks`
        self.last_round = RoundTelemetry()

    def prefetch(self, seqs: list[Sequence]) -> None:
        pass

    def admit(self, seqs: list[Sequence]) -> None:
        state = new_state(self.draft, len(seqs), self.device)
        tokens, valid = right_aligned([s.prompt_ids + s.output_ids[:-1] for s in seqs], self.pad_id, self.device)
        state.extend(tokens, valid, logits_to_keep=1)
        self.state = KVState.concat([self.state, state])
        self.tails += [[s.output_ids[-1]] for s in seqs]
        self.late += [None] * len(seqs)
        self.lookahead.admit(len(seqs))
        self.generators += [torch.Generator(device=self.device).manual_seed(draft_seed(s.seed)) for s in seqs]

    def retire(self, keep: list[int]) -> None:
        self.state.select(torch.tensor(keep, dtype=torch.long))
        self.tails = [self.tails[i] for i in keep]
        self.late = [self.late[i] for i in keep]
        self.generators = [self.generators[i] for i in keep]
        self.lookahead.retire(keep)

    def propose(self, rows: RowSampling) -> Proposal:
        t0 = time.perf_counter()
        tokens, valid = right_aligned(self.tails, self.pad_id, self.device)
        fed = self.state.extend(tokens, valid)  # [B, W, V]
        previous = self._late_ranks(fed)
        K, logits = self.lookahead.choose(), fed[:, -1].float()
        self.x, q, self.z = draft_from(self.state, logits, K, self.spec.saguaro_top(), self.spec.C, rows,
                                       self.generators, stop_below=self.spec.confidence_stop)  # [B, K'], [B, K', V] x2
        self.K = self.x.shape[1]
        forwards = self.K + (self.K < K)  # the tail's feed included; a stopped block fed its last token to look
        draft_ms = ms_since(t0)
        self.lookahead.drafted(forwards, draft_ms)
        self.last_round = RoundTelemetry(draft_ms=draft_ms, draft_forwards=forwards, previous_outcome_rank=previous)
        return Proposal(self.x, q)

    def _late_ranks(self, fed: Tensor) -> list[int | None] | None:
        """Fill in the ranks of last round's all-accepted outcomes from the draft's logits at x_K (the
        second newest fed token); return the last round's ranks, or None if there was no last round."""
        waiting = [(b, i) for b, i in enumerate(self.late) if i is not None]
        if waiting:
            rows = torch.tensor([b for b, _ in waiting], dtype=torch.long, device=fed.device)
            bonus = torch.tensor([self.tails[b][-1] for b, _ in waiting], dtype=torch.long, device=fed.device)
            ranks = bonus_ranks(fed[rows, -2], bonus, torch.full_like(bonus, -1))
            for (_, i), rank in zip(waiting, ranks):
                self.ranks[i] = rank
        previous, self.ranks, self.late = self.ranks or None, [], [None] * len(self.tails)
        return previous

    def observe(self, result: Verification, verify_ms: float) -> None:
        K = self.K
        self.lookahead.observe(result.accepted.tolist(), K, verify_ms)
        k = result.accepted.to(self.device)  # [B]
        self.state.rollback((K - 1 - k).clamp(min=0))
        x_last, bonus = self.x[:, -1].tolist(), result.bonus.tolist()
        ks = k.tolist()
        self.tails = [[x_last[b], bonus[b]] if kb == K else [bonus[b]] for b, kb in enumerate(ks)]
        rejected = [b for b, kb in enumerate(ks) if kb < K]
        self.ranks = [None] * len(ks)
        if rejected:
            rows = torch.tensor(rejected, dtype=torch.long)
            at = k.cpu()[rows]
            ranks = bonus_ranks(self.z[rows.to(self.z.device), at.to(self.z.device)],
                                result.bonus.cpu()[rows].to(self.z.device), self.x[rows, at].to(self.z.device))
            for b, rank in zip(rejected, ranks):
                self.ranks[b] = rank
        self.late = [b if kb == K else None for b, kb in enumerate(ks)]

    def close(self) -> None:
        pass
