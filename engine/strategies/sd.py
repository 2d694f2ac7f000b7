"""Synchronous speculative decoding: the draft proposes K tokens, the target verifies them in one
forward, and rejection sampling keeps the output distribution exactly the target's.

Cache bookkeeping per row (why the roll-back counts are what they are):
- the target cache holds every committed token except the newest, `pending`, which is fed first
  in the next verify block [pending, x_1..x_K];
- the draft cache holds the committed tokens except a short tail (`draft_tail`): [t*] after a
  rejection, or [x_K, t*] when all K were accepted (x_K was sampled but never fed to the draft).
After k accepted: the target drops x_{k+1}..x_K (K − k slots); the draft, which was fed
pending-tail, x_1..x_{K−1}, drops x_{k+1}..x_{K−1} (max(K − 1 − k, 0) slots).
"""

from __future__ import annotations

import time

import torch
from torch import Tensor

from engine.config import SpeculativeConfig
from engine.kv_cache import KVState
from engine.metrics import RoundRecord
from engine.sampling import sample, saguaro, warp
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from engine.strategies.base import (
    Clock, Decoder, emit_round, ms_since, prefill, right_aligned, surviving_rows, verify_block,
)


class SpeculativeDecoder(Decoder):
    name = "sd"

    def __init__(
        self,
        target: torch.nn.Module,
        draft: torch.nn.Module,
        spec: SpeculativeConfig,
        pad_id: int,
        device: torch.device,
    ):
        super().__init__(target, pad_id, device)
        self.draft = draft
        self.spec = spec

    def propose(
        self, state: KVState, tail: list[list[int]], params: SamplingParams, generator: torch.Generator
    ) -> tuple[Tensor, Tensor]:
        """Draft K tokens per row with K draft forwards; returns x [B, K] and the q they came from [B, K, V]."""
        K = self.spec.K
        tokens, valid = right_aligned(tail, self.pad_id, self.device)
        logits = state.extend(tokens, valid)[:, -1]  # [B, V]
        xs, qs = [], []
        for i, n_top in enumerate(self.spec.saguaro_top()):
            q = warp(logits.float(), params)  # [B, V]
            if self.spec.C < 1:
                q = saguaro(q, n_top, self.spec.C)
            x = sample(q, generator)  # [B]
            xs.append(x)
            qs.append(q)
            if i < K - 1:
                logits = state.extend(x[:, None])[:, -1]
        return torch.stack(xs, dim=1), torch.stack(qs, dim=1)

    def run(
        self, seqs: list[Sequence], params: SamplingParams, generator: torch.Generator, clock: Clock
    ) -> list[RoundRecord]:
        K = self.spec.K
        records: list[RoundRecord] = []
        target = KVState(self.target, len(seqs), self.device)
        draft = KVState(self.draft, len(seqs), self.device)
        active = list(seqs)

        t0 = time.perf_counter()
        logits = prefill(target, active, self.pad_id, self.device)  # [B, V]
        verify_ms = ms_since(t0)
        t1 = time.perf_counter()
        prefill(draft, active, self.pad_id, self.device)
        draft_ms = ms_since(t1)
        pending = sample(warp(logits.float(), params), generator)  # [B], the first token
        now = clock.now()
        for seq, token in zip(active, pending.tolist()):
            seq.append([token], now)
            seq.metrics.target_forwards += 1
        records.append(
            RoundRecord(
                strategy=self.name, round=0, batch_size=len(active), K=K,
                context_len=0, accepted=[0] * len(active), emitted=[1] * len(active),
                draft_ms=draft_ms, verify_ms=verify_ms, round_ms=ms_since(t0), draft_forwards=1,
                phase="prefill", tokens=max(len(s.prompt_ids) for s in active),
            )
        )
        tail = [[t] for t in pending.tolist()]
        active, rows = surviving_rows(active)
        if rows is not None and active:
            target.select(rows.to(self.device))
            draft.select(rows.to(self.device))
            pending = pending[rows]
            tail = [tail[i] for i in rows.tolist()]
        return records + self.decode(target, draft, active, pending, tail, params, generator, clock, len(records))

    def prefill_draft(self, seqs: list[Sequence]) -> tuple[KVState, list[list[int]]]:
        """A draft cache for sequences already under way (SSD's fallback): it holds every committed
        token but the newest, `pending` (the last output token), which is the tail fed next."""
        draft = KVState(self.draft, len(seqs), self.device)
        tokens, valid = right_aligned([s.prompt_ids + s.output_ids[:-1] for s in seqs], self.pad_id, self.device)
        draft.extend(tokens, valid, logits_to_keep=1)
        return draft, [[s.output_ids[-1]] for s in seqs]

    def decode(
        self,
        target: KVState,
        draft: KVState,
        active: list[Sequence],
        pending: Tensor,
        tail: list[list[int]],
        params: SamplingParams,
        generator: torch.Generator,
        clock: Clock,
        first_round: int,
    ) -> list[RoundRecord]:
        """SD rounds until every sequence is finished, from a state where the target cache holds every
        committed token but `pending` [B] and the draft's holds all but `tail`."""
        K = self.spec.K
        records: list[RoundRecord] = []
        while active:
            context_len = int(target.lengths.max())
            t0 = time.perf_counter()
            x, q = self.propose(draft, tail, params, generator)  # [B, K], [B, K, V]
            draft_ms = ms_since(t0)

            t1 = time.perf_counter()
            result = verify_block(target, pending, x, q, params, generator)
            verify_ms = ms_since(t1)

            k = result.accepted.to(self.device)  # [B]
            draft.rollback((K - 1 - k).clamp(min=0))
            pending = result.bonus
            x_last, bonus = x[:, -1].tolist(), result.bonus.tolist()
            tail = [[x_last[b], bonus[b]] if kb == K else [bonus[b]] for b, kb in enumerate(k.tolist())]
            emitted = emit_round(active, result, x, clock.now())
            records.append(
                RoundRecord(
                    strategy=self.name, round=first_round + len(records), batch_size=len(active), K=K,
                    context_len=context_len, accepted=k.tolist(), emitted=emitted,
                    draft_ms=draft_ms, verify_ms=verify_ms, round_ms=ms_since(t0), draft_forwards=K,
                )
            )
            active, rows = surviving_rows(active)
            if rows is not None and active:
                target.select(rows.to(self.device))
                draft.select(rows.to(self.device))
                pending = pending[rows]
                tail = [tail[i] for i in rows.tolist()]
        return records
