"""Autoregressive decoding: one target forward per token, the baseline every speedup is against."""

from __future__ import annotations

import time

import torch

from engine.kv_cache import KVState
from engine.metrics import RoundRecord
from engine.sampling import sample, warp
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from engine.strategies.base import Clock, Decoder, ms_since, prefill, surviving_rows


class AutoregressiveDecoder(Decoder):
    name = "ar"

    def run(
        self, seqs: list[Sequence], params: SamplingParams, generator: torch.Generator, clock: Clock
    ) -> list[RoundRecord]:
        records: list[RoundRecord] = []
        state = KVState(self.target, len(seqs), self.device)
        active = list(seqs)
        t0 = time.perf_counter()
        logits = prefill(state, active, self.pad_id, self.device)  # [B, V]
        forward_ms = ms_since(t0)
        phase, tokens = "prefill", max(len(s.prompt_ids) for s in seqs)
        while True:
            context_len = int(state.lengths.max())
            next_tokens = sample(warp(logits.float(), params), generator)  # [B]
            now = clock.now()
            for seq, token in zip(active, next_tokens.tolist()):
                seq.append([token], now)
                seq.metrics.target_forwards += 1
                seq.metrics.rounds += phase == "decode"
            records.append(
                RoundRecord(
                    strategy=self.name, round=len(records), batch_size=len(active), K=0,
                    context_len=context_len, accepted=[0] * len(active), emitted=[1] * len(active),
                    draft_ms=0.0, verify_ms=forward_ms, round_ms=ms_since(t0), draft_forwards=0,
                    phase=phase, tokens=tokens,
                )
            )
            active, rows = surviving_rows(active)
            if not active:
                return records
            if rows is not None:
                state.select(rows.to(self.device))
                next_tokens = next_tokens[rows]
            t0 = time.perf_counter()
            logits = state.extend(next_tokens[:, None].to(self.device))[:, -1]  # [B, V]
            forward_ms = ms_since(t0)
            phase, tokens = "decode", 0
